"""Real kubelet nodes (gpu_install_lab/kubelet.py): the files written into a node and the CLI's checks
(no lab is brought up here; tests/integration/test_lab_real_nodes.py runs them)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from gpu_install_lab import kubelet

GI = str(Path(sys.executable).parent / "gpu-install")


def test_containerd_base_config_has_no_registry_trust():
    cfg = tomllib.loads(kubelet.containerd_config("10.250.0.1:5000"))
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "10.250.0.1:5000/gpu-install-lab/pause:3.6"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False  # cgroupfs, as the kubelet
    assert "registry" not in cri  # config_path and the CA come from `gpu-install apply` only


def test_kubelet_config_cgroupfs_and_no_anonymous_access():
    cfg = yaml.safe_load(kubelet.kubelet_config())
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == "/etc/kubernetes/pki/ca.crt"
    assert cfg["authorization"]["mode"] == "Webhook"


def test_cni_bridge_without_gateway_per_node_subnet():
    a, b = json.loads(kubelet.cni_conflist(1)), json.loads(kubelet.cni_conflist(2))
    bridge = a["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["type"] == "host-local" and "routes" not in bridge["ipam"]
    assert bridge["ipam"]["ranges"] != b["plugins"][0]["ipam"]["ranges"]


def test_nspawn_args_keep_egress_outside(tmp_path):
    args = kubelet.nspawn_args(tmp_path)
    assert "--capability=CAP_NET_ADMIN" in args and "--system-call-filter=@keyring" in args
    assert not any("private-network" in a or "--network-veth" in a for a in args)
    assert f"--bind={tmp_path / 'containerd'}:/var/lib/containerd" in args and (tmp_path / "containerd").is_dir()


def test_real_kubelet_needs_kubernetes_and_debian12(tmp_path):
    p = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path), "up", "--kubelet", "real"], capture_output=True, text=True)
    assert p.returncode == 2 and "--kubelet real needs --kubernetes" in p.stderr
    p = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path), "up", "--kubernetes", "--kubelet", "real",
                        "--os", "debian12,rhel9"], capture_output=True, text=True)
    assert p.returncode == 2 and "only debian12 nodes" in p.stderr
    helptext = subprocess.run([GI, "lab", "up", "--help"], capture_output=True, text=True).stdout
    assert "hollow (default)" in helptext


def test_nspawn_args_docker_binds_var_lib_docker(tmp_path):
    args = kubelet.nspawn_args(tmp_path, "docker")
    assert f"--bind={tmp_path / 'docker'}:/var/lib/docker" in args and (tmp_path / "docker").is_dir()
    assert f"--bind={tmp_path / 'containerd'}:/var/lib/containerd" in args
    (tmp_path / "c").mkdir()
    assert not any("/var/lib/docker" in a for a in kubelet.nspawn_args(tmp_path / "c"))


def test_kubelet_unit_per_runtime():
    def unit(runtime: str) -> str:
        return kubelet.KUBELET_UNIT.format(version="v1.20.2", kubelet=kubelet.KUBELET_PATH, ip="10.250.0.11",
                                           name="node1", **kubelet.kubelet_runtime(runtime, "10.250.0.1:5000"))

    docker, containerd = unit("docker"), unit("containerd")
    assert "--container-runtime=docker" in docker and "--network-plugin=cni" in docker
    assert "--cni-bin-dir=/usr/lib/cni" in docker and "After=gpu-install-lab-node-prep.service docker.service" in docker
    assert "--pod-infra-container-image=10.250.0.1:5000/gpu-install-lab/pause:3.6" in docker
    assert "--container-runtime=remote" in containerd and "docker" not in containerd
    assert "containerd.service" in containerd
    assert "docker.service" in kubelet.NODE_PREP_UNIT.split("Before=")[1].splitlines()[0]


def test_docker_daemon_json_and_install_command(tmp_path):
    kubelet.docker_node_files(tmp_path)
    daemon = json.loads((tmp_path / "etc/docker/daemon.json").read_text())
    assert daemon["exec-opts"] == ["native.cgroupdriver=cgroupfs"] and daemon["iptables"] is False
    assert not (tmp_path / "etc/docker/certs.d").exists()  # the CA comes from `gpu-install apply` only
    assert "apt-get install" in kubelet.install_command("docker") and " docker.io " in kubelet.install_command("docker")
    assert "systemctl restart docker" in kubelet.install_command("docker")


def test_runc_shim_clamps_oom_score_adj_and_runs_the_real_runc(tmp_path):
    """The lab SHIM: process.oomScoreAdj below the caller's own value is raised to it (what containerd's
    restrict_oom_score_adj does); the real runc then gets the same arguments."""
    own = int(Path("/proc/self/oom_score_adj").read_text())
    log, real = tmp_path / "log" / "shim.log", tmp_path / "real-runc"
    real.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "args"}\n')
    real.chmod(0o755)
    shim = tmp_path / "runc"
    shim.write_text(kubelet.RUNC_SHIM_SH.replace(kubelet.REAL_RUNC, str(real)).replace(kubelet.RUNC_SHIM_LOG, str(log))
                    .replace(kubelet.RUNC_SHIM_LOG.rsplit("/", 1)[0], str(log.parent)))
    shim.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for asked, expected in ((own - 5, own), (own + 5, own + 5)):
        cfg = {"ociVersion": "1.0.2", "process": {"args": ["sleep"], "oomScoreAdj": asked}, "root": {"path": "rootfs"}}
        (bundle / "config.json").write_text(json.dumps(cfg, separators=(",", ":")))
        argv = ["--root", "/run/x", "create", "--bundle", str(bundle), "--pid-file", "p", "id1"]
        subprocess.run([str(shim), *argv], check=True)
        assert json.loads((bundle / "config.json").read_text())["process"]["oomScoreAdj"] == expected
        assert (tmp_path / "args").read_text().split() == argv
    assert log.read_text().count(f"oomScoreAdj {own - 5} -> {own}") == 1


def test_real_kubelet_runtime_choice(tmp_path):
    from gpu_install_lab.lab import _check_node_runtime
    from installer.errors import ConfigError

    _check_node_runtime(True, "docker")
    _check_node_runtime(False, "containerd")
    for real, runtime in ((True, "cri-o"), (False, "docker")):
        try:
            _check_node_runtime(real, runtime)
        except ConfigError:
            continue
        raise AssertionError(f"{runtime} accepted (real={real})")
    helptext = subprocess.run([GI, "lab", "up", "--help"], capture_output=True, text=True).stdout
    assert "dockershim" in helptext
