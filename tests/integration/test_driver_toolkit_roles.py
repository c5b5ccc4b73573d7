"""nvidia_driver (driver.mode host) and nvidia_container_toolkit (toolkit.mode host) on a debian12 lab node.

The lab's apt repo serves, through `gpu-install lab repo-add`, the REAL Debian NVIDIA packages (nvidia-driver,
nvidia-smi, nvidia-kernel-dkms 535.309.01 from bookworm-security/non-free, nvidia-persistenced, with their closure
relative to the node rootfs; gpu_install_lab/packages.py), containerd (preflight wants a runtime), and the STAND-INs
nvidia-container-toolkit 1.17.4-0gpuinstall.standin1 (nvidia-ctk prints a version) and
gpu-install-standin-nvidia-container-runtime. The real `gpu-install apply` CLI installs them.

The node shares the bastion's kernel: no headers for it exist, DKMS builds nothing, there is no initramfs and no
GPU. The lab inventory says so explicitly (preflight_require_kernel_headers, nvidia_driver_require_kernel_headers,
nvidia_driver_require_initramfs_tool: false); the role reports each of them, and reports "reboot required" with
nvidia-smi's exit 9 instead of failing (policy never).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import LabHandle, lab_prerequisites
from tests.integration.test_runtime_roles import VENV_BIN, Applier, _ok, apply_inventory, root

pytestmark = pytest.mark.lab
NODE = "node1"
DRIVER = "535.309.01"
LAB_VARS = {"preflight_require_kernel_headers": False, "nvidia_driver_require_kernel_headers": False,
            "nvidia_driver_require_initramfs_tool": False}


def write_site(where: Path, name: str, driver: dict, toolkit: dict) -> Path:
    site = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.internal:5000"},
            "runtime": "containerd", "toolkit": toolkit, "driver": driver}
    path = where / f"site-{name}.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def lab_inventory(handle: LabHandle, where: Path, gpu_vars: dict) -> Path:
    inv = apply_inventory(handle, where)
    (inv / "zz-lab-driver.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"vars": gpu_vars}}}}))
    return inv


def task_messages(apply: Applier) -> dict[str, str]:
    """task name -> its `msg` (debug reports), from the newest site.yml run's job events."""
    runs = sorted((apply.state / "runs").glob("*-site*"), key=lambda p: p.stat().st_mtime)
    out = {}
    for ev in (runs[-1] / "artifacts" / "run" / "job_events").glob("*.json"):
        data = json.loads(ev.read_text())
        if data.get("event") == "runner_on_ok":
            msg = (data["event_data"].get("res") or {}).get("msg")
            if msg:
                out[data["event_data"]["task"]] = " ".join(msg) if isinstance(msg, list) else str(msg)
    return out


def dpkg_version(handle: LabHandle, pkg: str) -> str:
    return root(handle, NODE, f"dpkg-query -W -f='${{Status}} ${{Version}}' {pkg}").stdout


@pytest.fixture(scope="module")
def drv(tmp_path_factory):
    lab_prerequisites()
    from gpu_install_lab import packages as lab_packages
    from gpu_install_lab.lab import Lab

    lab_dir = tmp_path_factory.mktemp("drvlab") / "lab"
    the_lab = Lab(lab_dir, progress=lambda m: print(m, flush=True))
    try:
        status = the_lab.up(count=1, flavours=["debian12"])
        handle = LabHandle(the_lab, lab_dir, status)
        t0 = time.monotonic()
        debs = lab_packages.driver_toolkit_debs()
        proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(lab_dir), "repo-add",
                               *map(str, debs)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        print(f"{len(debs)} packages into the lab repo in {time.monotonic() - t0:.1f}s", flush=True)
        root(handle, NODE, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q containerd")
        work = tmp_path_factory.mktemp("drv")
        yield handle, Applier(lab_inventory(handle, work, LAB_VARS), work / "state"), work
    finally:
        the_lab.down()


def test_host_driver_and_toolkit_pinned_then_changed_0(drv):
    handle, apply, work = drv
    assert root(handle, NODE, "dpkg-query -W nvidia-driver", check=False).returncode != 0  # not there yet
    site = write_site(work, "host", {"mode": "host", "version": DRIVER}, {"mode": "host", "version": "1.17.4"})
    t0 = time.monotonic()
    proc = apply(site)
    out = _ok(proc)
    print(f"first apply (driver + toolkit install) {time.monotonic() - t0:.1f}s", flush=True)
    assert "apply ok" in out
    # the live display (stderr, not a terminal: plain lines): play header with its host count, the driver's
    # report under its result line, no escape codes; the recap table on stdout
    err = proc.stderr
    assert "== NVIDIA driver (1 host)" in err and "== Container runtime (1 host)" in err, err[-3000:]
    assert re.search(r"^\[node1\] +changed +Driver \| .+  \(\d+\.\ds\)$", err, re.M), err[-3000:]
    report = re.search(r"^\[node1\] +ok +Driver \| Report  \(\d+\.\ds\)\n((?:\[node1\] {4}.*\n)+)", err, re.M)
    assert report and "REBOOT REQUIRED (no NVIDIA kernel module is loaded)" in report.group(1), err[-3000:]
    assert "\x1b" not in err
    assert re.search(r"^node1 +\d+ +[1-9]\d* +0 +0 +\d+ +\d+\.\ds$", out, re.M), out
    for pkg in ("nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms"):
        status = dpkg_version(handle, pkg)
        assert status.startswith("install ok installed " + DRIVER), (pkg, status)
    assert dpkg_version(handle, "nvidia-persistenced").startswith("install ok installed ")
    assert dpkg_version(handle, "nvidia-container-toolkit") == "install ok installed 1.17.4-0gpuinstall.standin1"
    desc = root(handle, NODE, "dpkg-query -W -f='${Description}' nvidia-container-toolkit").stdout
    assert "STAND-IN" in desc
    ctk = root(handle, NODE, "nvidia-ctk --version").stdout
    assert "version 1.17.4" in ctk and "STAND-IN" in ctk
    assert "exec runc" in root(handle, NODE, "cat /usr/bin/nvidia-container-runtime").stdout
    assert "blacklist nouveau" in root(handle, NODE, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout
    assert root(handle, NODE, "systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"
    smi = root(handle, NODE, "nvidia-smi", check=False)
    assert smi.returncode == 9 and "couldn't communicate with the NVIDIA driver" in smi.stdout + smi.stderr
    # surfaced, not swallowed: the role's report in the run's output
    msgs = task_messages(apply)
    report = msgs["Driver | Report"]
    assert f"driver {DRIVER}-" in report and "loaded module: none" in report, report
    assert "REBOOT REQUIRED (no NVIDIA kernel module is loaded)" in report, report
    assert "nvidia-smi exit 9" in report and "couldn't communicate with the NVIDIA driver" in report, report
    assert "are NOT installed: the NVIDIA kernel module is not built" in msgs["Driver | Report kernel headers not required"]
    # the blacklist changed and there is no initramfs tool here: said so, not skipped silently
    assert "update-initramfs is not installed" in msgs["Driver | Report that no initramfs was regenerated"]
    # the toolkit came before the runtime: containerd points at the runtime binary
    assert "nvidia-container-runtime" in root(handle, NODE, "cat /etc/containerd/conf.d/99-nvidia.toml").stdout
    _ok(apply(site))
    stats = apply.site_stats()
    assert stats[NODE]["changed"] == 0 and stats[NODE]["ok"] > 10, stats


def test_missing_kernel_headers_fail_with_the_fix(drv):
    """Without the lab's override the driver role refuses: the running kernel's headers are not in the repo."""
    handle, _, work = drv
    (work / "strict").mkdir(exist_ok=True)
    # the lab inventory lifts the driver's headers requirement; put it back for this node
    strict = Applier(lab_inventory(handle, work / "strict", {"preflight_require_kernel_headers": False,
                                                             "nvidia_driver_require_kernel_headers": True}),
                     work / "state-strict")
    site = write_site(work, "host", {"mode": "host", "version": DRIVER}, {"mode": "host", "version": "1.17.4"})
    proc = strict(site)
    assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    kernel = root(handle, NODE, "uname -r").stdout.strip()
    assert f"tasks failed on {NODE}" in proc.stderr
    assert f"the headers of the running kernel {kernel} (linux-headers-{kernel})" in proc.stderr, proc.stderr
    assert "nvidia_driver_require_kernel_headers: false" in proc.stderr


def test_operator_mode_refuses_host_driver_packages(drv):
    handle, apply, work = drv
    assert dpkg_version(handle, "nvidia-driver").startswith("install ok installed")  # from the first test
    site = write_site(work, "operator", {"mode": "operator"}, {"mode": "host", "version": "1.17.4"})
    proc = apply(site)
    assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    err = proc.stderr.split("error:")[-1]
    assert f"tasks failed on {NODE}" in err, proc.stderr
    assert f"{NODE}: driver.mode is operator but host NVIDIA driver packages are installed" in err, err
    assert f"nvidia-driver {DRIVER}" in err and f"nvidia-kernel-dkms {DRIVER}" in err, err
    assert "the driver container would conflict with them" in err
