"""`gpu-install config check -s SITE [-i INVENTORY]` makes every check preflight and apply make before they contact
anything (installer.offline_checks, the functions they call too), with their messages and exit codes, and contacts
nothing.

Each case is a real site file and inventory file. For every check preflight makes, `preflight` is run on the same
files and must fail the same way before any host is contacted; for the checks only apply makes (the chart, the images
its registry check asks for), `apply`. In-process runs refuse any socket and any child process (a contact would fail
the test loudly); the last tests run the real command line in a network namespace without interfaces (`unshare
-n`), where the same preflight on a site with no problem does fail with exit 5: the sandbox would catch a contact.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

SITE = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"}}
HAMI = {"mode": "hami", "hami": {"kubernetesVersion": "v1.29.4",
                                 "chart": "oci://registry.example.com:5000/charts/hami:2.10.0"}}
NO_PLUGIN = {"devicePlugin": {"enabled": False}}
GPU1 = {"ansible_host": "127.0.0.1", "gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic"}
CP = {"kube_control_plane": {"hosts": {"cp1": {"ansible_host": "127.0.0.1"}}}}


def _site(**over: Any) -> dict[str, Any]:
    return {**SITE, **over}


def _inventory(gpu: dict[str, Any] | None = None, groups: dict[str, Any] | None = None,
               all_vars: dict[str, Any] | None = None) -> dict[str, Any]:
    inv: dict[str, Any] = {"all": {"children": {"gpu_nodes": {"hosts": gpu or {"gpu1": GPU1}}, **(groups or {})}}}
    if all_vars:
        inv["all"]["vars"] = all_vars
    return inv


class Files:
    """The site and inventory of one case, as files."""

    def __init__(self, tmp: Path, site: dict[str, Any], inventory: dict[str, Any]):
        self.site = tmp / "site.yaml"
        self.site.write_text(yaml.safe_dump(site, sort_keys=False))
        self.inventory = tmp / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        # packages.key: what `mirror push --repo-dir` exports (gpg --armor --export), and a file that is not that
        (tmp / "site.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ0AAABYJKwYBBAHaRw8BAQdA\n"
                                      "-----END PGP PUBLIC KEY BLOCK-----\n")
        (tmp / "not-a-key.asc").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI site\n")
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                                   "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": "t0k3n"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))


@pytest.fixture
def no_contact(monkeypatch, tmp_path):
    """Any connection, name lookup or child process (ssh, helm, skopeo, ansible-runner's) fails the test."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"contacted something: {args[:2]}")

    # ansible checks at import time how getaddrinfo treats a port (of 127.0.0.1, numeric: no lookup): imported first
    import ansible.inventory.manager  # noqa: F401
    import ansible.vars.manager  # noqa: F401

    for owner, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"),
                        (socket, "getaddrinfo"), (subprocess, "Popen"), (os, "posix_spawn"), (os, "fork")):
        monkeypatch.setattr(owner, name, refuse)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("GPU_INSTALL_CHART", raising=False)


# (id, site, inventory, exit code, what the message says, the command that makes the same check besides config
# check: "preflight" (and so apply) or "apply")
CASES = [
    ("hami-with-the-operators-device-plugin-cdi-and-time-slicing",
     _site(cdi={"enabled": True}, devicePlugin={"timeSlicing": {"replicas": 4}}, sharing=HAMI), _inventory(), 3,
     ["sharing.mode hami conflicts with the site:",
      "the GPU Operator's NVIDIA device plugin would run on the GPU nodes too",
      "set components.devicePlugin.enabled: false", "cdi.enabled: true: nvidia is then not the default runtime",
      "devicePlugin.timeSlicing.replicas 4: time-slicing and MPS are the NVIDIA device plugin's",
      "hint: fix the site file; nothing was changed on any host"], "preflight"),
    ("gpumanager-with-the-operators-toolkit",
     _site(components=NO_PLUGIN, sharing={"mode": "gpumanager"}), _inventory(groups=CP), 3,
     ["sharing.mode gpumanager conflicts with the site:", "toolkit.mode operator: the operator's toolkit makes nvidia "
      "the default runtime", "set toolkit.mode: host"], "preflight"),
    ("nos-with-a-sharing-mode",
     _site(driver={"mode": "host"}, mig={"strategy": "mixed", "dynamic": "nos"}, sharing=HAMI),
     _inventory(), 3, ["mig.dynamic nos conflicts with the site:", "sharing.mode hami with mig.dynamic nos"],
     "preflight"),
    ("hami-with-a-mig-layout-in-the-inventory",
     _site(components=NO_PLUGIN, sharing=HAMI),
     _inventory({"gpu1": {**GPU1, "gpu_install_mig_config": "all-1g.10gb"}}), 3,
     ["sharing.mode hami conflicts with the site:", "a MIG layout is set (nodes gpu1): HAMi shares whole GPUs"],
     "preflight"),
    ("gpumanager-without-a-control-plane-group",
     _site(toolkit={"mode": "host"}, components=NO_PLUGIN, sharing={"mode": "gpumanager"}), _inventory(), 2,
     ["group 'kube_control_plane' is missing or empty, and the scheduler stage needs it: sharing.mode gpumanager "
      "wires gpu-quota-admission as an extender", "hint: add the control-plane hosts to group kube_control_plane"],
     "preflight"),
    ("a-required-group-of-the-inventory-missing",
     _site(), _inventory(all_vars={"gpu_install_required_groups": ["gpu_nodes", "etcd"]}), 2,
     ["inventory: inventory group 'etcd' is missing or empty: add it (see inventories/sample/hosts.yml)",
      "hint: fix the inventory; nothing was changed on any host"], "preflight"),
    ("a-removed-inventory-variable",
     _site(), _inventory({"gpu1": {**GPU1, "nvidia_driver_version": "550"}}), 2,
     ["inventory: host gpu1: variable 'nvidia_driver_version' was removed; set driver.version in site.yaml instead",
      "hint: fix the inventory; nothing was changed on any host"], "preflight"),
    ("gpu-install-os-not-a-string",
     _site(), _inventory({"gpu1": {**GPU1, "gpu_install_os": ["ubuntu22.04"]}}), 2,
     ["inventory: host gpu1: gpu_install_os must be a string like ubuntu22.04"], "preflight"),
    ("a-node-os-the-release-has-no-driver-image-for",
     _site(), _inventory({"gpu1": {**GPU1, "gpu_install_os": "rhel9.9"}}), 2,
     ["host gpu1: gpu_install_os", "rhel9.9"], "preflight"),
    ("packages-url-and-a-node-of-unknown-os",
     _site(driver={"mode": "host"}, packages={"url": "http://repo.example.com/gpu-install", "key": "site.asc"}),
     _inventory({"gpu1": {"ansible_host": "127.0.0.1"}}), 2,
     ["host gpu1: OS unknown (gpu_install_os is not set), and packages.url makes its repository "
      "<url>/packages/<os>"], "preflight"),
    ("packages-key-not-an-openpgp-key",
     _site(toolkit={"mode": "host"}, packages={"url": "http://repo.example.com/gpu-install", "key": "not-a-key.asc"}),
     _inventory(), 2, ["not-a-key.asc: no armored OpenPGP public key in it",
                       "hint: give the key `gpu-install mirror push --repo-dir DIR` exported"], "preflight"),
    ("precompiled-driver-and-a-node-without-its-kernel",
     _site(driver={"mode": "precompiled", "version": "550"}),
     _inventory({"gpu1": GPU1, "gpu2": {k: v for k, v in GPU1.items() if k != "gpu_install_kernel"}}), 2,
     ["driver.mode precompiled: kernel of gpu2 unknown; precompiled images are tagged 550-<kernel>-<osTag>"],
     "apply"),
    ("a-sharing-chart-path-that-is-not-there",
     _site(components=NO_PLUGIN, sharing={**HAMI, "hami": {**HAMI["hami"], "chart": "charts/hami-2.10.0.tgz"}}),
     _inventory(), 2, ["sharing.hami.chart", "hami-2.10.0.tgz: no such file or directory"], "apply"),
    ("a-pull-secret-file-that-is-not-there",
     _site(registry={**SITE["registry"], "pullSecret": {"name": "regcred", "dockerConfigFile": "missing.json"}}),
     _inventory(), 2, ["registry.pullSecret.dockerConfigFile: cannot read it (No such file or directory)"], "apply"),
    ("an-operator-chart-path-that-is-not-there",
     _site(operator={**SITE["operator"], "chart": "/nonexistent/gpu-operator-v24.9.2.tgz"}), _inventory(), 2,
     ["chart /nonexistent/gpu-operator-v24.9.2.tgz not found"], "apply"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_config_check_refuses_what_preflight_and_apply_refuse(case, cli, tmp_path, no_contact):
    _, site, inventory, code, parts, other = case
    f = Files(tmp_path, site, inventory)
    rc, out, err = cli("config", "check", "-s", f.site, "-i", f.inventory)
    assert rc == code, err
    assert out == "" and err.startswith("error: "), err
    for part in parts:
        assert part in err, err
    if other == "preflight":  # preflight makes the same check, with the same message, before any host
        rc2, out2, err2 = cli("preflight", "-s", f.site, "-i", f.inventory, "-q")
        assert (rc2, err2) == (rc, err), err2
    # apply too, before its first stage (exit 2) or first in its preflight stage (exit 3), nothing contacted
    rc3, out3, err3 = cli("apply", "-s", f.site, "-i", f.inventory, "-q", "--kubeconfig", f.kubeconfig,
                          "--chart", site["operator"].get("chart") or "oci://registry.example.com:5000/charts/"
                                                                       "gpu-operator")
    assert rc3 == rc, err3
    for part in parts:
        assert part in err3, err3
    if code == 3:
        assert re.search(r"^preflight +FAILED +", out3, re.M) and re.search(r"^nodes +not run +preflight failed$",
                                                                            out3, re.M), out3
    else:
        assert out3 == "", out3  # before any stage: no stage table


def test_a_conflict_in_the_inventory_needs_the_inventory(cli, tmp_path, no_contact):
    """The MIG layout of a node is in the inventory: the site alone is fine, with -i it is refused."""
    _, site, inventory, *_ = next(c for c in CASES if c[0] == "hami-with-a-mig-layout-in-the-inventory")
    f = Files(tmp_path, site, inventory)
    rc, out, err = cli("config", "check", "-s", f.site)
    assert rc == 0 and out.startswith(f"{f.site}: ok (GPU Operator v24.9.2"), err
    rc, _, err = cli("config", "check", "-s", f.site, "-i", f.inventory)
    assert rc == 3 and "a MIG layout is set (nodes gpu1)" in err


def test_the_issue_site_is_refused_without_an_inventory_too(cli, tmp_path, no_contact):
    """The site of the report: `config check` said ok while preflight exited 3."""
    _, site, *_ = CASES[0]
    f = Files(tmp_path, site, _inventory())
    rc, out, err = cli("config", "check", "-s", f.site)
    assert rc == 3 and out == "" and "sharing.mode hami conflicts with the site:" in err


def test_a_clean_site_and_inventory_pass_and_say_what_was_checked(cli, tmp_path, no_contact):
    inv = _inventory({"gpu1": GPU1, "gpu3": {"ansible_host": "127.0.0.1", "gpu_install_os_id": "rhel",
                                             "gpu_install_os_version": "8.10",
                                             "gpu_install_kernel": "4.18.0-553.el8_10.x86_64"}}, groups=CP)
    f = Files(tmp_path, _site(driver={"mode": "precompiled", "version": "550"}), inv)
    rc, out, err = cli("config", "check", "-s", f.site, "-i", f.inventory)
    assert rc == 0, err
    assert out == (f"{f.site}: ok (GPU Operator v24.9.2, registry registry.example.com:5000; inventory {f.inventory}: "
                   "2 GPU node(s), rhel8.10, ubuntu22.04)\n")
    assert "note: no operator.chart in the site and no GPU_INSTALL_CHART: apply needs --chart" in err
    # the sample site and inventory shipped with the tool
    sample = ROOT / "inventories" / "sample"
    rc, out, err = cli("config", "check", "-s", sample / "site.yaml", "-i", sample / "hosts.yml")
    assert rc == 0 and ": ok (GPU Operator" in out, err


# ---------------------------------------------------------------- the real command line, in a network namespace


def _netns_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


needs_netns = pytest.mark.skipif(not _netns_available(), reason="needs `unshare --net` (root)")


def _isolated(tmp_path: Path, *args: Any) -> subprocess.CompletedProcess[str]:
    """gpu-install in a new network namespace: no interface is up there, not even loopback."""
    gpu_install = Path(sys.executable).with_name("gpu-install")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("GPU_INSTALL_CHART", None)
    return subprocess.run(["unshare", "--net", str(gpu_install), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


@needs_netns
def test_config_check_contacts_nothing(tmp_path):
    """In a network namespace without interfaces: config check passes a clean site (and refuses the conflicting one
    with exit 3, as preflight does); preflight on the clean site does try the hosts there and fails with exit 5 --
    the namespace stops a contact, so config check's exit 0 there shows it made none."""
    clean = Files(tmp_path / "clean", _site(), _inventory(groups=CP)) if (tmp_path / "clean").mkdir() is None else None
    assert clean is not None
    proc = _isolated(tmp_path, "config", "check", "-s", clean.site, "-i", clean.inventory)
    assert proc.returncode == 0 and ": ok (GPU Operator v24.9.2" in proc.stdout, proc.stderr
    proc = _isolated(tmp_path, "preflight", "-s", clean.site, "-i", clean.inventory, "-q")
    assert proc.returncode == 5 and "unreachable: gpu1" in proc.stderr, (proc.returncode, proc.stderr)

    (tmp_path / "bad").mkdir()
    _, site, inventory, *_ = CASES[0]
    bad = Files(tmp_path / "bad", site, inventory)
    checked = _isolated(tmp_path, "config", "check", "-s", bad.site, "-i", bad.inventory)
    assert checked.returncode == 3 and "sharing.mode hami conflicts with the site:" in checked.stderr, checked.stderr
    pre = _isolated(tmp_path, "preflight", "-s", bad.site, "-i", bad.inventory, "-q")
    assert (pre.returncode, pre.stderr) == (3, checked.stderr)


def test_limit_to_a_host_without_gpus_still_names_every_gpu_nodes_images(tmp_path):
    """apply --limit cp1 --include-operator: the operator is cluster-wide, so the images its mirror check asks for are
    those of every GPU node (a driver image per node OS), not of the limited hosts -- which have no GPU node and so no
    OS to tag the driver image with (that was exit 2 before apply's own check could run)."""
    from installer import offline_checks
    from installer.config import load_site
    from installer.errors import ConfigError
    from installer.plan import Options, cluster_wide, resolve

    f = Files(tmp_path, _site(), _inventory(groups=CP))
    limited = resolve(load_site(f.site), Options(inventory=str(f.inventory), limit="cp1"))
    assert limited.nodes == () or not limited.nodes
    with pytest.raises(ConfigError, match="depends on the nodes' OS"):
        _ = limited.images  # the limited plan alone cannot name the driver image
    offline_checks.artifacts(limited, images=True)  # names them from every GPU node instead
    whole = cluster_wide(limited)
    assert [n.name for n in whole.nodes] == ["gpu1"]
    assert any(i.component == "driver" and i.source.endswith("-ubuntu22.04") for i in whole.images), whole.images
