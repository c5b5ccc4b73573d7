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

from tests.conftest import LAB_DRIVER_OS
from tests.integration.conftest import LabHandle, lab_prerequisites
from tests.integration.test_runtime_roles import VENV_BIN, Applier, _ok, apply_inventory, root

pytestmark = pytest.mark.lab
NODE = "node1"
DRIVER = "535.309.01"
LAB_VARS = {"preflight_require_kernel_headers": False, "nvidia_driver_require_kernel_headers": False,
            "nvidia_driver_require_initramfs_tool": False}


def write_site(where: Path, name: str, driver: dict, toolkit: dict) -> Path:
    site = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.internal:5000"},
            "runtime": "containerd", "toolkit": toolkit, "driver": {**driver, "customImageOs": LAB_DRIVER_OS}}
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


BASELINE: set[str] = set()  # the node's packages before the first apply (set by the fixture)


def installed(handle: LabHandle) -> set[str]:
    out = root(handle, NODE, "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'").stdout
    return {ln.split()[1] for ln in out.splitlines() if len(ln.split()) == 2 and ln[1] not in "nc"}


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
        # containerd (preflight wants a runtime) and, as an admin might have, nvidia-persistenced: one of the driver
        # role's packages that is there BEFORE gpu-install (uninstall must leave it)
        root(handle, NODE, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                           "--no-install-recommends containerd nvidia-persistenced")
        global BASELINE
        BASELINE = installed(handle)
        work = tmp_path_factory.mktemp("drv")
        yield handle, Applier(lab_inventory(handle, work, LAB_VARS), work / "state"), work
    finally:
        the_lab.down()


def test_host_driver_and_toolkit_pinned_then_changed_0(drv):
    handle, apply, work = drv
    # not there yet (dpkg knows the name -- nvidia-persistenced's relations mention it -- but it is not installed)
    status = root(handle, NODE, "dpkg-query -W -f='${Status}' nvidia-driver", check=False).stdout
    assert not status.startswith("install ok installed"), status
    assert "nvidia-driver" not in BASELINE
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


def test_validate_reads_the_real_nvidia_smi_exit_9_and_the_configured_runtime(drv):
    """`gpu-install validate --only node,runtime` after the host-mode apply: the node's REAL Debian nvidia-smi (535)
    exits 9 without a kernel module, which the node layer reports as the driver not loaded -- with the pending
    reboot first when the node says one is pending -- never as a crash; the runtime layer reads containerd's
    effective config with the role's drop-in (nvidia runtime, its binary from the toolkit STAND-IN, the default)."""
    handle, apply, work = drv
    site = write_site(work, "host", {"mode": "host", "version": DRIVER}, {"mode": "host", "version": "1.17.4"})
    out = work / "validate.json"
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate", "-s", str(site), "-i", str(apply.inventory),
                           "--only", "node,runtime", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 6, proc.stdout + proc.stderr
    by = {c["check"]: c for c in json.loads(out.read_text())["checks"]}
    assert by["node.reachable"]["status"] == "pass"
    assert by["node.nvidia-smi"]["status"] == "fail" and "nvidia-smi ran, the driver is not loaded" in \
        by["node.nvidia-smi"]["message"]
    nl = by["node.driver.not-loaded"]
    assert nl["status"] == "fail" and "nvidia-smi exited 9" in nl["message"], nl
    assert "couldn't communicate with the NVIDIA driver" in nl["message"], nl
    pending = root(handle, NODE, "test -e /var/run/reboot-required", check=False).returncode == 0
    assert nl["fix"].startswith("a reboot is pending") == pending, nl
    for check in ("runtime.present", "runtime.nvidia", "runtime.binary", "runtime.default"):
        assert by[check]["status"] == "pass", by[check]
    assert by["runtime.binary"]["message"] == "its binary is on the node"


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


def uninstall(apply: Applier, site: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i", str(apply.inventory),
                           "--skip-operator", "--yes", *extra], capture_output=True, text=True, env=apply.env(),
                          timeout=600)


def uninstall_stats(apply: Applier) -> dict[str, int]:
    runs = sorted((apply.state / "runs").glob("*-uninstall*"), key=lambda p: p.stat().st_mtime)
    for ev in (runs[-1] / "artifacts" / "run" / "job_events").glob("*.json"):
        data = json.loads(ev.read_text())
        if data.get("event") == "playbook_on_stats":
            return {k: int((data["event_data"].get(k) or {}).get(NODE, 0)) for k in ("ok", "changed", "failures")}
    raise AssertionError(f"no stats in {runs[-1]}")


def test_uninstall_removes_what_gpu_install_installed_then_redeploy(drv):
    """uninstall reverses the driver and toolkit roles from their records on the node: exactly the packages that
    were not there before the first apply go (the node's package set is the baseline again), the pre-existing
    nvidia-persistenced and containerd stay, the nouveau blacklist goes; a second uninstall changes nothing; apply
    installs everything again."""
    handle, apply, work = drv
    site = write_site(work, "host", {"mode": "host", "version": DRIVER}, {"mode": "host", "version": "1.17.4"})
    rec = json.loads(root(handle, NODE, "cat /var/lib/gpu-install/nvidia_driver.json").stdout)
    assert {"nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms"} <= set(rec["packages"]), rec
    assert "nvidia-persistenced" not in rec["packages"] and rec["preexisting"] == ["nvidia-persistenced"], rec
    assert rec["entries"]["blacklist"]["path"] == "/etc/modprobe.d/blacklist-nouveau.conf"
    assert rec["entries"]["blacklist"]["backup"] == ""  # the file was not there: removal deletes it
    tk = json.loads(root(handle, NODE, "cat /var/lib/gpu-install/nvidia_container_toolkit.json").stdout)
    assert "nvidia-container-toolkit" in tk["packages"] and not set(tk["packages"]) & BASELINE
    # between them, the two records hold exactly what appeared since the baseline (dependencies included)
    assert set(rec["packages"]) | set(tk["packages"]) == installed(handle) - BASELINE
    assert not set(rec["packages"]) & set(tk["packages"])
    assert root(handle, NODE, "stat -c %a /var/lib/gpu-install/nvidia_driver.json").stdout.strip() == "600"

    t0 = time.monotonic()
    proc = uninstall(apply, site)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    print(f"uninstall {time.monotonic() - t0:.1f}s", flush=True)
    assert installed(handle) == BASELINE, (installed(handle) ^ BASELINE)
    for pkg in ("nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms", "nvidia-container-toolkit"):
        status = root(handle, NODE, f"dpkg-query -W -f='${{Status}}' {pkg}", check=False).stdout
        assert not status.startswith("install ok installed"), (pkg, status)
    assert dpkg_version(handle, "nvidia-persistenced").startswith("install ok installed")
    assert dpkg_version(handle, "containerd").startswith("install ok installed")
    assert root(handle, NODE, "test -e /etc/modprobe.d/blacklist-nouveau.conf", check=False).returncode != 0
    assert root(handle, NODE, "ls /var/lib/gpu-install/").stdout.strip() == ""
    err = proc.stderr
    report = re.search(r"^\[node1\] +ok +Driver \| Report the removal  \(\d+\.\ds\)\n((?:\[node1\] {4}.*\n)+)", err, re.M)
    assert report, err[-3000:]
    assert "packages removed: " in report.group(1) and "nvidia-driver" in report.group(1)
    assert "there before gpu-install, kept: nvidia-persistenced" in report.group(1)
    assert "nouveau blacklist /etc/modprobe.d/blacklist-nouveau.conf: removed" in report.group(1)
    assert "the NVIDIA kernel module stays loaded until the node reboots" in report.group(1)
    assert re.search(r"^\[node1\] +ok +Toolkit \| Report the removal .*\n\[node1\] {4,}packages removed: .*"
                     r"nvidia-container-toolkit", err, re.M), err[-3000:]

    again = uninstall(apply, site)
    assert again.returncode == 0, again.stderr[-3000:]
    assert uninstall_stats(apply)["changed"] == 0
    assert "no record of an install by gpu-install" in again.stderr

    t0 = time.monotonic()
    _ok(apply(site))
    print(f"re-deploy {time.monotonic() - t0:.1f}s", flush=True)
    for pkg in ("nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms"):
        assert dpkg_version(handle, pkg).startswith("install ok installed " + DRIVER), pkg
    assert dpkg_version(handle, "nvidia-container-toolkit") == "install ok installed 1.17.4-0gpuinstall.standin1"
    assert "blacklist nouveau" in root(handle, NODE, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout
    assert set(json.loads(root(handle, NODE, "cat /var/lib/gpu-install/nvidia_driver.json").stdout)["packages"]) \
        == set(rec["packages"])


def test_uninstall_keep_packages(drv):
    """nvidia_driver_keep_packages / nvidia_container_toolkit_keep_packages (uninstall --keep-packages): the files
    go, the packages stay, and the record keeps them so that a later uninstall removes them."""
    handle, apply, work = drv
    site = write_site(work, "host", {"mode": "host", "version": DRIVER}, {"mode": "host", "version": "1.17.4"})
    inv = apply.inventory
    (inv / "zz-keep.yml").write_text(yaml.safe_dump({"all": {"vars": {"nvidia_driver_keep_packages": True,
                                                                      "nvidia_container_toolkit_keep_packages": True}}}))
    try:
        before = installed(handle)
        proc = uninstall(apply, site)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert installed(handle) == before
        assert "packages kept (nvidia_driver_keep_packages): " in proc.stderr
        assert root(handle, NODE, "test -e /etc/modprobe.d/blacklist-nouveau.conf", check=False).returncode != 0
        rec = json.loads(root(handle, NODE, "cat /var/lib/gpu-install/nvidia_driver.json").stdout)
        assert "nvidia-driver" in rec["packages"] and rec["entries"] == {}
    finally:
        (inv / "zz-keep.yml").unlink()
    proc = uninstall(apply, site)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert installed(handle) == BASELINE


def test_nvswitch_node_gets_fabric_manager_of_the_drivers_version_validated_then_uninstalled(drv):
    """An NVSwitch node (gpu_install_nvswitch: true; issue 38 item 6): apply installs the Fabric Manager and NSCQ
    STAND-INs at the driver's exact version (the repo also serves a newer Fabric Manager: the pin selects), enables and
    starts the service (the node's STAND-IN nvidia-smi answers, as a loaded driver would); the second apply is
    changed=0; validate's node.fabric passes while the service runs and fails naming the fix when it is stopped;
    uninstall stops and disables it and removes exactly what was installed. The node stands for an HGX board through
    STAND-INs (docs/lab.md): its PCI bus lists two H100 GPUs and four NVSwitches (standin_fabric.nvswitch_pci_command),
    and its nvidia-smi is the STAND-IN of an NVSwitch node at the Debian driver's version."""
    handle, _, work = drv
    from gpu_install_lab import gpus as lab_gpus
    from gpu_install_lab.standin_fabric import names, nvswitch_pci_command, pci_undo_command, standin_fabric_debs

    fm, nscq = names(DRIVER)
    debs = standin_fabric_debs(DRIVER) + standin_fabric_debs("535.309.02")
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(handle.dir), "repo-add",
                           *map(str, debs)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    cfg = lab_gpus.node_config("drvlab", NODE, 2, "NVIDIA H100 80GB HBM3", nvswitch=True)
    cfg.update(driverVersion=DRIVER, cudaVersion="12.2")
    merged = handle.dir / "nodes" / NODE / "merged"
    (work / "nvs").mkdir()
    apply = Applier(lab_inventory(handle, work / "nvs", {**LAB_VARS, "gpu_install_nvswitch": True}), work / "state-nvs")
    site = write_site(work, "host", {"mode": "host", "version": DRIVER}, {"mode": "host", "version": "1.17.4"})
    try:
        root(handle, NODE, nvswitch_pci_command([g["pciBusId"] for g in cfg["gpus"]]))
        lab_gpus.install_node_smi(merged, cfg, lab_gpus.tools_dir())
        assert root(handle, NODE, "nvidia-smi -L").stdout.count("NVIDIA H100 80GB HBM3") == 2
        t0 = time.monotonic()
        _ok(apply(site))
        print(f"apply with Fabric Manager {time.monotonic() - t0:.1f}s", flush=True)
        for pkg in (fm, nscq):  # the driver's version, not the repository's newest
            assert dpkg_version(handle, pkg) == f"install ok installed {DRIVER}-1", pkg
        assert "Candidate: 535.309.02-1" in root(handle, NODE, f"apt-cache policy {fm}").stdout
        assert "STAND-IN" in root(handle, NODE, f"dpkg-query -W -f='${{Description}}' {fm}").stdout
        assert root(handle, NODE, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
        assert root(handle, NODE, "systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"
        report = task_messages(apply)["Driver | Report Fabric Manager"]
        assert "NVSwitch node (gpu_install_nvswitch: true)" in report and "enabled and started" in report, report
        assert f"{fm}={DRIVER}-*" in report, report
        rec = json.loads(root(handle, NODE, "cat /var/lib/gpu-install/nvidia_driver.json").stdout)
        assert {fm, nscq} <= set(rec["packages"]) and rec["entries"]["fabricmanager"] == "nvidia-fabricmanager", rec
        _ok(apply(site))
        stats = apply.site_stats()
        assert stats[NODE]["changed"] == 0, stats

        def fabric_check() -> tuple[int, dict]:
            out = work / "validate-nvs.json"
            proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate", "-s", str(site), "-i", str(apply.inventory),
                                   "--only", "node", "--json", str(out)], capture_output=True, text=True, timeout=300)
            assert "Traceback" not in proc.stderr, proc.stderr
            return proc.returncode, {c["check"]: c for c in json.loads(out.read_text())["checks"]}["node.fabric"]

        _, ok = fabric_check()
        assert ok["status"] == "pass" and "NVSwitch fabric initialised on all 2 GPU(s)" in ok["message"], ok
        root(handle, NODE, "systemctl stop nvidia-fabricmanager")
        rc, bad = fabric_check()
        assert rc == 6 and bad["status"] == "fail" and "fabric state In Progress" in bad["message"], bad
        assert NODE in bad["message"] and "systemctl status nvidia-fabricmanager" in bad["fix"], bad

        proc = uninstall(apply, site)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
        assert "Fabric Manager (nvidia-fabricmanager): stopped and disabled" in proc.stderr, proc.stderr[-3000:]
        assert installed(handle) == BASELINE, (installed(handle) ^ BASELINE)
        state = root(handle, NODE, "systemctl is-enabled nvidia-fabricmanager", check=False).stdout.strip()
        assert state in ("not-found", ""), state
    finally:
        root(handle, NODE, pci_undo_command() + f"rm -f {lab_gpus.NODE_SMI}", check=False)
