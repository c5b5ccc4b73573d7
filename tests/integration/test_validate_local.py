"""`gpu-install validate --local`: this machine through NVML in-process (installer/validate/local.py).

No GPU here, so what runs for real is the failure side, with the REAL NVML library: Debian's libnvidia-ml1 (the
driver branch the lab pins, fetched with the lab's private apt and cached) put on LD_LIBRARY_PATH makes nvmlInit
answer NVML_ERROR_DRIVER_NOT_LOADED, exactly as on a node whose kernel module is not loaded; without it, NVML's
library is missing (no driver installed). Both are findings with their fix, exit 6, never a crash. (Run as root,
NVML creates /dev/nvidiactl before it finds no driver; the test removes what it created.)
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
from pathlib import Path

import pytest

from installer.errors import GpuInstallError
from tests.integration.conftest import VENV_BIN, _skip_or_fail


def _validate(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess,
                                                                                      dict]:
    import os

    out = tmp_path / "local.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate", "--local", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(out.read_text()) if out.exists() else {}


@pytest.fixture(scope="module")
def libnvml(tmp_path_factory) -> Path:
    """The directory holding Debian's real libnvidia-ml.so.1 (535 branch), extracted from its .deb."""
    from gpu_install_lab.packages import NVIDIA_COMPONENTS, NVIDIA_VERSION, closure

    try:
        debs = closure("debian12", (f"libnvidia-ml1={NVIDIA_VERSION}*",), progress=lambda *a: None,
                       components=NVIDIA_COMPONENTS)
    except GpuInstallError as exc:  # no Debian mirror reachable and nothing cached
        _skip_or_fail(f"cannot fetch Debian's libnvidia-ml1: {exc}")
    deb = next(d for d in debs if d.name.startswith("libnvidia-ml1_"))
    root = tmp_path_factory.mktemp("nvml")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    lib = next(root.rglob("libnvidia-ml.so.1"))
    return lib.parent


def test_real_nvml_without_the_kernel_driver_is_driver_not_loaded(tmp_path, libnvml):
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver loaded")
    # NVML (as root) creates /dev/nvidiactl when it is missing, before it finds no driver: leave the machine as found
    created = [d for d in ("/dev/nvidiactl",) if not Path(d).exists()]
    try:
        proc, report = _validate(tmp_path, env={"LD_LIBRARY_PATH": str(libnvml)})
    finally:
        for d in created:
            Path(d).unlink(missing_ok=True)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    by = {c["check"]: c for c in report["checks"]}
    assert report["layers"] == ["node"] and report["release"] == "no site file"
    assert by["node.nvidia-smi"]["status"] == "fail" and "NVML ran, the driver is not loaded" in \
        by["node.nvidia-smi"]["message"]
    nl = by["node.driver.not-loaded"]
    assert nl["status"] == "fail" and nl["message"].endswith("the NVIDIA driver is not loaded: NVML: Driver Not Loaded")
    assert "lsmod | grep nvidia" in nl["fix"], nl


def test_no_nvml_library_is_a_finding_naming_the_driver(tmp_path):
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has libnvidia-ml")
    proc, report = _validate(tmp_path)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    (check,) = report["checks"]
    assert check["check"] == "node.nvidia-smi" and check["status"] == "fail"
    assert "NVML (libnvidia-ml.so.1) is not installed" in check["message"] and "install the driver" in check["fix"]


def test_local_refuses_what_needs_the_nodes_or_the_cluster(tmp_path):
    proc, _ = _validate(tmp_path, "-i", "inventory.yml")
    assert proc.returncode == 2 and "leave out -i" in proc.stderr, proc.stderr
    proc, _ = _validate(tmp_path, "--only", "node,smoke")
    assert proc.returncode == 2 and "the smoke layer(s) need the cluster" in proc.stderr, proc.stderr
    proc, _ = _validate(tmp_path, "--only", "runtime")
    assert proc.returncode == 2 and "needs the site file" in proc.stderr, proc.stderr
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "-s" in proc.stderr and "--local" in proc.stderr, proc.stderr
