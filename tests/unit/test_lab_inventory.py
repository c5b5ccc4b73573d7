"""Lab inventory rendering and registry config (pure; ansible-inventory parses the result)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import bcrypt
import yaml

from gpu_install_lab import inventory, registry, repo

SETTINGS = {"registry": "10.250.7.1:5000", "repo_url": "http://10.250.7.1:8080", "registry_auth": False}
NODES = {
    "node2": {"name": "node2", "index": 2, "flavour": "rhel9", "ip": "10.250.7.12"},
    "node1": {"name": "node1", "index": 1, "flavour": "debian12", "ip": "10.250.7.11"},
}


def test_inventory_groups_hosts_and_vars(tmp_path):
    inv = inventory.inventory(tmp_path, SETTINGS, NODES)
    g = inv["all"]["children"]["gpu_nodes"]
    assert list(g["hosts"]) == ["node1", "node2"]  # by index, not dict order
    assert g["hosts"]["node2"] == {"ansible_host": "10.250.7.12", "lab_flavour": "rhel9", "gpu_install_os": "rocky9.5"}
    assert inv["all"]["children"]["kube_control_plane"]["hosts"]["bastion"]["ansible_connection"] == "local"
    assert set(g["children"]) == {"lab_debian12", "lab_rhel9"}
    v = g["vars"]
    assert v["ansible_ssh_private_key_file"] == str(tmp_path / "ssh" / "id_ed25519")
    assert f"UserKnownHostsFile={tmp_path / 'ssh' / 'known_hosts'}" in v["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in v["ansible_ssh_common_args"]
    assert v["lab_rpm_repo"] == "http://10.250.7.1:8080/rpm"
    assert v["preflight_require_gpu"] is False
    assert v["nvidia_driver_require_kernel_headers"] is False and v["preflight_require_kernel_headers"] is False
    assert "lab_registry_password_file" not in v and "lab_kubeconfig" not in v
    auth = inventory.inventory(tmp_path, {**SETTINGS, "registry_auth": True}, NODES, tmp_path / "kube" / "kubeconfig")
    av = auth["all"]["children"]["gpu_nodes"]["vars"]
    assert av["lab_registry_password_file"].endswith("registry/password")  # a path, never the password
    assert av["lab_kubeconfig"] == str(tmp_path / "kube" / "kubeconfig")


def test_rendered_inventory_parses_with_ansible(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(inventory.render(tmp_path, SETTINGS, NODES))
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(path), "--list"],
                         capture_output=True, text=True, check=True).stdout
    parsed = json.loads(out)
    assert parsed["lab_rhel9"]["hosts"] == ["node2"] and parsed["lab_debian12"]["hosts"] == ["node1"]
    assert parsed["_meta"]["hostvars"]["node1"]["ansible_host"] == "10.250.7.11"


def test_lab_inventory_feeds_images(tmp_path):
    """`gpu-install images -i <lab inventory>` expands driver tags with the lab nodes' OS."""
    from tests.conftest import nodes_of

    path = tmp_path / "hosts.yml"
    path.write_text(inventory.render(tmp_path, SETTINGS, NODES))
    tags = {n.name: n.os_tag("v26.7.0") for n in nodes_of(path)}
    assert tags == {"node1": "debian12", "node2": "rocky9"}


def test_registry_config_tls_and_auth(tmp_path):
    cfg = yaml.safe_load(registry.write_config(tmp_path, "10.250.7.1:5000", tmp_path / "c.crt", tmp_path / "c.key",
                                               auth=False).read_text())
    assert cfg["http"]["addr"] == "10.250.7.1:5000" and cfg["http"]["tls"]["certificate"].endswith("c.crt")
    assert "auth" not in cfg and cfg["storage"]["delete"]["enabled"] is True
    secret = cfg["http"]["secret"]
    path = registry.write_config(tmp_path, "10.250.7.1:5000", tmp_path / "c.crt", tmp_path / "c.key", auth=True)
    cfg = yaml.safe_load(path.read_text())
    assert cfg["http"]["secret"] == secret  # stable across `up`s
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    user, hashed = (tmp_path / "htpasswd").read_text().strip().split(":", 1)
    password = (tmp_path / "password").read_text().strip()
    assert user == "lab" and bcrypt.checkpw(password.encode(), hashed.encode())
    assert password not in path.read_text()


def test_repo_sources():
    assert repo.apt_source("http://b:8080") == "deb [trusted=yes] http://b:8080/apt lab main\n"
    assert "baseurl=http://b:8080/rpm" in repo.yum_repo("http://b:8080")


def test_control_plane_gets_the_scheduler_policy_paths_with_kubernetes(tmp_path):
    plain = inventory.inventory(tmp_path, SETTINGS, NODES)["all"]["children"]["kube_control_plane"]["hosts"]["bastion"]
    assert not any(k.startswith("scheduler_policy_") for k in plain)
    (tmp_path / "kube").mkdir()
    (tmp_path / "kube" / "state.json").write_text(json.dumps({"ports": {"kube-scheduler-insecure": 42424}}))
    cp = inventory.inventory(tmp_path, SETTINGS, NODES, tmp_path / "kube" / "kubeconfig")
    bastion = cp["all"]["children"]["kube_control_plane"]["hosts"]["bastion"]
    kube = tmp_path / "kube"
    assert bastion["scheduler_policy_manifest"] == str(kube / "manifests" / "kube-scheduler.yaml")
    assert bastion["scheduler_policy_config_dir"] == str(kube / "etc-kubernetes")
    backups = Path(bastion["scheduler_policy_backup_dir"])
    assert backups == kube / "backups" and not backups.is_relative_to(kube / "manifests")  # never run by the kubelet
    assert bastion["scheduler_policy_insecure_bind_address"] == "127.0.0.1:42424"
    roles = Path(__file__).resolve().parents[2] / "roles" / "scheduler_policy" / "meta" / "argument_specs.yml"
    declared = yaml.safe_load(roles.read_text())["argument_specs"]["main"]["options"]
    assert {k for k in bastion if k.startswith("scheduler_policy_")} <= set(declared)
