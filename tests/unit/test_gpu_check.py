"""scripts/gpu-check: on a machine with an NVIDIA GPU it installs the wheel into a temporary venv and compares the
XML parser with NVML there (marked `gpu`: skipped where there is no GPU). Without a GPU, it says so and exits 8.
Its comparison logic (installer/validate/compare.py) is tested on the recorded documents in test_gpu_truth.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu-check"


def has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def test_without_nvidia_smi_it_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 8
    assert "no nvidia-smi on this machine" in proc.stdout
    assert "no nvidia-smi" in (tmp_path / "out" / "summary.txt").read_text()


def test_a_missing_wheelhouse_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--wheelhouse", str(tmp_path / "nope")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "make it with --prepare" in proc.stderr


@pytest.mark.gpu
@pytest.mark.timeout(1500)  # the check itself may take 1200 s (it builds and installs the wheel)
@pytest.mark.skipif(not has_gpu(), reason="no NVIDIA GPU here (nvidia-smi -L fails or is missing)")
def test_gpu_check_on_this_machine(tmp_path: Path) -> None:
    """validate --local passes and the XML parser agrees with NVML (every difference explained). Offline with
    GPU_INSTALL_WHEELHOUSE (made by `scripts/gpu-check --prepare DIR`), else the wheel is built and installed online."""
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")]
    if os.environ.get("GPU_INSTALL_WHEELHOUSE"):
        cmd += ["--wheelhouse", os.environ["GPU_INSTALL_WHEELHOUSE"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "0 unexplained" in (tmp_path / "out" / "compare.txt").read_text()
