"""The runtime roles against REAL containerd 1.6.20 and dockerd 20.10.24 on lab nodes.

A lab of its own (2 debian12 nodes; the rhel9 stand-in has no docker/containerd RPMs): containerd,
docker.io and their dependency closure relative to the node rootfs go into the lab's apt repo with
`gpu-install lab repo-add` (gpu_install_lab/packages.py), plus the STAND-IN
gpu-install-standin-nvidia-container-runtime (a runc wrapper). The nodes get a user config first,
then `apt-get install` from the bastion, then the real `gpu-install apply` CLI runs against the lab
inventory. Order matters (one lab for the module): containerd, docker, invalid daemon.json. A node's link cut
mid-run: tests/integration/test_faults.py (this module's set-up, its own lab).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS
from tests.integration.conftest import LabHandle, lab_prerequisites

pytestmark = pytest.mark.lab
VENV_BIN = Path(sys.executable).parent
NODES = ("node1", "node2")

CONTAINERD_TOML = """\
# the site's own containerd config (version 2, containerd 1.6)
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example.internal/pause:3.9-site"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""
# User keys, plus what dockerd needs to start inside a lab node (no iptables/bridge there).
DAEMON_JSON = {"log-level": "warn", "data-root": "/srv/docker-data", "iptables": False, "ip-forward": False,
               "bridge": "none"}


def runtime_lab(tmp_path_factory, count: int = 2, packages: bool = True):
    """A lab of `count` debian12 nodes whose apt repo serves containerd, docker.io (+ closure) and
    the nvidia-container-runtime stand-in. Returns (LabHandle, Lab)."""
    lab_prerequisites()
    from gpu_install_lab import packages as lab_packages
    from gpu_install_lab.lab import Lab

    lab_dir = tmp_path_factory.mktemp("rtlab") / "lab"
    the_lab = Lab(lab_dir, progress=lambda m: print(m, flush=True))
    status = the_lab.up(count=count, flavours=["debian12"])
    handle = LabHandle(the_lab, lab_dir, status)
    if packages:
        debs = lab_packages.runtime_debs()
        proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(lab_dir), "repo-add",
                               *map(str, debs)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return handle, the_lab


def apply_inventory(handle: LabHandle, where: Path) -> Path:
    """The lab inventory as written by `lab up`, plus what apply needs that the lab's does not carry:
    a kube_control_plane group (the bastion, local) and preflight_require_gpu: false (no GPUs)."""
    inv = where / "inventory"
    inv.mkdir(exist_ok=True)
    (inv / "hosts.yml").write_text(handle.inventory.read_text())
    (inv / "zz-apply.yml").write_text(yaml.safe_dump({"all": {"children": {
        "kube_control_plane": {"hosts": {"bastion": {"ansible_connection": "local",
                                                     "ansible_python_interpreter": sys.executable}}},
        "gpu_nodes": {"vars": {"preflight_require_gpu": False}},
    }}}))
    return inv


def write_site(where: Path, runtime: str, **registry) -> Path:
    site = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.internal:5000", **registry},
            "runtime": runtime, "toolkit": {"mode": "host"}, "driver": {"mode": "operator", "customImageOs": LAB_DRIVER_OS}}
    path = where / f"site-{runtime}.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


class Applier:
    """Runs the real CLI (`gpu-install apply`) in a subprocess; each run's records in its own state dir."""

    def __init__(self, inventory: Path, state: Path):
        self.inventory, self.state = inventory, state

    def env(self) -> dict[str, str]:
        return {**os.environ, "GPU_INSTALL_STATE": str(self.state), "ANSIBLE_LOCAL_TEMP": str(self.state / "tmp")}

    def argv(self, site: Path, *extra: str) -> list[str]:
        # nodes only: the operator stage (needs a cluster and a chart) is tested in test_demo.py
        return [str(VENV_BIN / "gpu-install"), "apply", "-s", str(site), "-i", str(self.inventory), "--skip-operator",
                *extra]

    def __call__(self, site: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(site, *extra), capture_output=True, text=True, env=self.env(), timeout=600)

    def site_stats(self) -> dict[str, dict[str, int]]:
        """Per-host stats of the newest site.yml run, read from its run directory's job events."""
        runs = sorted((self.state / "runs").glob("*-site*"), key=lambda p: p.stat().st_mtime)
        assert runs, f"no site run under {self.state}"
        for ev in (runs[-1] / "artifacts" / "run" / "job_events").glob("*.json"):
            data = json.loads(ev.read_text())
            if data.get("event") == "playbook_on_stats":
                d = data["event_data"]
                hosts = set().union(*(d.get(k) or {} for k in ("ok", "changed", "failures", "dark", "processed")))
                return {h: {k: int((d.get(k) or {}).get(h, 0)) for k in ("ok", "changed", "failures", "dark")}
                        for h in hosts}
        raise AssertionError(f"no playbook_on_stats event in {runs[-1]}")


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def root(handle: LabHandle, node: str, cmd: str, check: bool = True, input: str | None = None):
    return handle.ssh(node, cmd, user="root", check=check, input=input, timeout=300)


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    handle, the_lab = runtime_lab(tmp_path_factory)
    work = tmp_path_factory.mktemp("rt")
    try:
        t0 = time.monotonic()
        for node in NODES:  # the site's config first, then the packages (as on a real node)
            root(handle, node, "mkdir -p /etc/containerd /etc/docker && cat > /etc/containerd/config.toml",
                 input=CONTAINERD_TOML)
            root(handle, node, "cat > /etc/docker/daemon.json", input=json.dumps(DAEMON_JSON, indent=4) + "\n")
            root(handle, node, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                               "-o Dpkg::Options::=--force-confold containerd docker.io "
                               "gpu-install-standin-nvidia-container-runtime")
        print(f"runtime packages installed from the lab repo in {time.monotonic() - t0:.1f}s", flush=True)
        yield handle, Applier(apply_inventory(handle, work), work / "state"), work
    finally:
        the_lab.down()


def test_packages_come_from_the_lab_repo(rt):
    handle, _, _ = rt
    for node in NODES:
        policy = root(handle, node, "apt-cache policy containerd docker.io").stdout
        assert f"{handle.status['repo_url']}/apt lab/main" in policy, policy
        root(handle, node, "test -x /usr/bin/nvidia-container-runtime && "
                           "grep -q 'exec runc' /usr/bin/nvidia-container-runtime")
        assert "1.6.20" in root(handle, node, "containerd --version").stdout


def test_inventory_values_that_are_not_the_nodes_stop_apply_at_preflight_nothing_changed(rt):
    """Preflight compares the inventory's node variables with the node (issue 38 item 7). node1 is said to run
    ubuntu22.04 and another kernel: exit 3 naming both variables with the inventory's and the node's values; node2,
    whose values (os, kernel, arch, nvswitch) are the node's, passes; the site playbook never starts, so the nodes
    keep the site's own containerd config (this runs before the module's first apply)."""
    handle, apply, work = rt
    kernel = os.uname().release  # the lab's nodes run the bastion's kernel
    wrong_kernel = "5.15.0-105-generic" if kernel != "5.15.0-105-generic" else "6.8.0-45-generic"
    inv = work / "facts-inventory"
    inv.mkdir()
    for f in apply.inventory.iterdir():
        (inv / f.name).write_text(f.read_text())
    (inv / "zz-facts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "node1": {"gpu_install_os": "ubuntu22.04", "gpu_install_kernel": wrong_kernel},
        "node2": {"gpu_install_os": "debian12", "gpu_install_kernel": kernel, "gpu_install_arch": platform.machine(),
                  "gpu_install_nvswitch": False}}}}))
    wrong = Applier(inv, work / "state-facts")
    proc = wrong(write_site(work, "containerd"))
    assert proc.returncode == 3, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    error = proc.stderr.split("error:")[-1]
    assert "preflight failed on node1: " in error and "node2" not in error, error
    assert "host node1: gpu_install_os is 'ubuntu22.04' in the inventory, the node runs 'debian12'" in error, error
    assert f"host node1: gpu_install_kernel is '{wrong_kernel}' in the inventory, the node runs '{kernel}'" in error
    assert "correct the inventory, or regenerate it from `gpu-install nodes facts -i INV -o facts.json`" in error
    runs = sorted((work / "state-facts" / "runs").iterdir())
    assert [r.name.split("-", 1)[1] for r in runs] == ["preflight"], runs  # no site.yml run
    stats = next(json.loads(ev.read_text())["event_data"] for ev in
                 (runs[0] / "artifacts" / "run" / "job_events").glob("*.json") if '"playbook_on_stats"' in ev.read_text())
    assert stats["failures"] == {"node1": 1} and stats["ok"]["node2"] >= 1, stats
    for node in NODES:
        assert root(handle, node, "cat /etc/containerd/config.toml").stdout == CONTAINERD_TOML
        assert root(handle, node, "test -e /etc/containerd/conf.d/99-nvidia.toml", check=False).returncode == 1


def test_a_secure_boot_node_without_the_site_key_enrolled_stops_preflight_with_the_procedure(rt):
    """Issue 39: node1's firmware says Secure Boot on (the real SecureBoot EFI variable's bytes in a directory
    bind-mounted over /sys/firmware inside that node only) and its STAND-IN mokutil (gpu_install_lab.standin_mokutil)
    has the site certificate not enrolled. `gpu-install preflight` with driver.mode host and driver.secureBoot auto
    exits 3 naming node1 with the one-time procedure; node2 (no EFI) passes. Enrolled, node1 passes too. Only
    preflight runs (this runs before the module's first apply) and the key never reaches a node nor the records."""
    from gpu_install_lab.standin_mokutil import answers, write_standin_mokutil
    from tests.unit.test_secure_boot_site import mok_pair, openssl_fingerprint

    handle, apply, work = rt
    cert, key = mok_pair(work / "mok")
    site = work / "site-secure-boot.yaml"
    site.write_text(yaml.safe_dump({
        "operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.internal:5000"},
        "runtime": "containerd", "toolkit": {"mode": "host"},
        "driver": {"mode": "host", "secureBoot": {"mode": "auto", "certificate": str(cert), "signingKey": str(key)}}}))
    answers_on_node = "/run/standin-mokutil/answers"
    script = write_standin_mokutil(work / "mokutil", Path(answers_on_node)).read_text()
    efivar = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    assert root(handle, "node1", "test -e /usr/bin/mokutil", check=False).returncode == 1
    root(handle, "node1", "mkdir -p /run/standin-mokutil /run/standin-efi/efi/efivars && "
                          f"printf '\\006\\000\\000\\000\\001' > /run/standin-efi/efi/efivars/{efivar} && "
                          "mount --bind /run/standin-efi /sys/firmware && install -m 0755 /dev/stdin /usr/bin/mokutil",
         input=script)
    preflight = Applier(apply.inventory, work / "state-secure-boot")
    try:
        root(handle, "node1", f"cat > {answers_on_node}", input=answers(True))
        assert root(handle, "node1", "mokutil --sb-state").stdout.strip() == "SecureBoot enabled"
        proc = subprocess.run([str(VENV_BIN / "gpu-install"), "preflight", "-s", str(site), "-i", str(apply.inventory)],
                              capture_output=True, text=True, env=preflight.env(), timeout=600)
        assert proc.returncode == 3, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
        error = proc.stderr.split("error:")[-1]
        sha = openssl_fingerprint(cert, "sha256")
        assert "preflight failed on node1: " in error and "node2" not in error, error
        assert f"host node1: Secure Boot is on and the site certificate (SHA-256 {sha}) is not enrolled" in error
        assert "`mokutil --import cert.der`" in error and "gpu-install never enrols keys itself" in error, error
        # enrolled (as after `mokutil --import`, the reboot and the console prompt): node1 passes
        root(handle, "node1", f"cat > {answers_on_node}", input=answers(True, (cert.read_bytes(),)))
        again = subprocess.run([str(VENV_BIN / "gpu-install"), "preflight", "-s", str(site), "-i",
                                str(apply.inventory)], capture_output=True, text=True, env=preflight.env(), timeout=600)
        assert again.returncode == 0, f"exit {again.returncode}\n{again.stdout}\n{again.stderr[-4000:]}"
        secret = "".join(key.read_text().splitlines()[1:-1])
        for f in (work / "state-secure-boot").rglob("*"):
            if f.is_file():
                assert secret[:40] not in f.read_text(errors="replace"), f
        assert root(handle, "node1", "ls /tmp/gpu-install-mok-* 2>/dev/null", check=False).stdout == ""
    finally:
        root(handle, "node1", "umount /sys/firmware; rm -rf /run/standin-efi /run/standin-mokutil /usr/bin/mokutil",
             check=False)


def test_containerd_apply_then_changed_0(rt):
    handle, apply, work = rt
    site = write_site(work, "containerd")
    out = _ok(apply(site))
    assert "apply ok" in out
    for node in NODES:
        dump = tomllib.loads(root(handle, node, "containerd config dump").stdout)
        cri = dump["plugins"]["io.containerd.grpc.v1.cri"]
        runtimes = cri["containerd"]["runtimes"]
        assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True  # runc's options copied
        assert runtimes["runc"]["options"]["SystemdCgroup"] is True
        assert cri["containerd"]["default_runtime_name"] == "nvidia"
        assert cri["sandbox_image"] == "registry.example.internal/pause:3.9-site"  # the user's key survived
        main = root(handle, node, "cat /etc/containerd/config.toml").stdout
        assert main.startswith(CONTAINERD_TOML[:40]) and 'imports = ["/etc/containerd/conf.d/99-nvidia.toml"]' in main
        backups = root(handle, node, "ls /etc/containerd/").stdout.split()
        backup = [b for b in backups if b.startswith("config.toml.") and b.endswith("~")]
        assert backup, backups
        assert root(handle, node, f"cat /etc/containerd/{backup[0]}").stdout == CONTAINERD_TOML
        root(handle, node, "systemctl is-active containerd && ctr version")
    _ok(apply(site))
    stats = apply.site_stats()
    assert set(NODES) <= set(stats)
    assert all(stats[n]["changed"] == 0 and stats[n]["ok"] > 0 for n in NODES), stats


def test_docker_apply_then_changed_0(rt):
    handle, apply, work = rt
    site = write_site(work, "docker")
    _ok(apply(site))
    for node in NODES:
        info = root(handle, node, "docker info").stdout
        assert "Default Runtime: nvidia" in info, info
        runtimes = next(ln for ln in info.splitlines() if "Runtimes:" in ln)
        assert "nvidia" in runtimes.split(), info
        assert "Docker Root Dir: /srv/docker-data" in info, info  # the user's data-root is in force
        doc = json.loads(root(handle, node, "cat /etc/docker/daemon.json").stdout)
        assert {k: doc[k] for k in DAEMON_JSON} == DAEMON_JSON
        assert doc["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
        assert doc["default-runtime"] == "nvidia"
        backup = root(handle, node, "ls /etc/docker/").stdout.split()
        backup = [b for b in backup if b.startswith("daemon.json.") and b.endswith("~")]
        assert backup
        assert json.loads(root(handle, node, f"cat /etc/docker/{backup[0]}").stdout) == DAEMON_JSON
    _ok(apply(site))
    stats = apply.site_stats()
    assert all(stats[n]["changed"] == 0 and stats[n]["ok"] > 0 for n in NODES), stats


def test_invalid_daemon_json_fails_that_host_untouched(rt):
    handle, apply, work = rt
    site = write_site(work, "docker")
    good = root(handle, "node2", "cat /etc/docker/daemon.json").stdout
    broken = '{"log-level": "warn",, "runtimes": {}\n'
    try:
        root(handle, "node2", "cat > /etc/docker/daemon.json", input=broken)
        before = root(handle, "node2", "sha256sum /etc/docker/daemon.json; stat -c %Y /etc/docker/daemon.json").stdout
        proc = apply(site)
        assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
        assert "tasks failed on node2" in proc.stderr and "node1" not in proc.stderr.split("error:")[-1], proc.stderr
        assert "/etc/docker/daemon.json is not valid JSON" in proc.stderr and "left untouched" in proc.stderr
        assert root(handle, "node2", "cat /etc/docker/daemon.json").stdout == broken  # byte for byte
        assert root(handle, "node2", "sha256sum /etc/docker/daemon.json; stat -c %Y /etc/docker/daemon.json"
                    ).stdout == before
        stats = apply.site_stats()
        assert stats["node2"]["failures"] == 1 and stats["node1"]["failures"] == 0 and stats["node1"]["changed"] == 0
        # the display: node2's failed line with its message; the recap (stdout) puts node2 first, failed 1
        err = proc.stderr.splitlines()
        i = next(n for n, ln in enumerate(err) if ln.startswith("[node2]") and " failed  " in ln)
        assert "Docker | " in err[i] and "is not valid JSON" in err[i + 1], err[i:i + 2]
        recap = proc.stdout[proc.stdout.index("RECAP site.yml"):].splitlines()
        assert recap[2].split()[:4] == ["node2", str(stats["node2"]["ok"]), "0", "1"], recap
    finally:
        root(handle, "node2", "cat > /etc/docker/daemon.json", input=good)
