"""`gpu-install lab` CLI: help, errors with hints and exit codes (no lab is brought up here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need

GI = str(Path(sys.executable).parent / "gpu-install")


def test_help_lists_actions():
    out = subprocess.run([GI, "lab", "--help"], capture_output=True, text=True, check=True).stdout
    for action in ("up", "down", "status", "inventory", "repo-add"):
        assert action in out
    assert "GPU_INSTALL_LAB_DIR" in out


def test_status_and_inventory_without_a_lab(tmp_path):
    st = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path / "none"), "status"], capture_output=True, text=True)
    assert st.returncode == 0 and "not up" in st.stdout
    inv = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path / "none"), "inventory"], capture_output=True, text=True)
    assert inv.returncode == 2 and "no lab in" in inv.stderr and "lab up" in inv.stderr
    down = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path / "none"), "down"], capture_output=True, text=True)
    assert down.returncode == 0 and "nothing to remove" in down.stderr


def test_bad_flavour_is_a_usage_error(tmp_path):
    p = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path), "up", "--os", "ubuntu22"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown lab flavour 'ubuntu22'" in p.stderr and "debian12, rhel9" in p.stderr


def test_lab_dir_from_env(tmp_path):
    env = {**os.environ, "GPU_INSTALL_LAB_DIR": str(tmp_path / "envlab")}
    st = subprocess.run([GI, "lab", "status"], capture_output=True, text=True, env=env)
    assert f"lab {tmp_path / 'envlab'}: not up" in st.stdout


def test_not_root_exits_2_with_hint(tmp_path):
    if os.geteuid() == 0:
        need(shutil.which("setpriv"), "setpriv (util-linux) needed to drop root for this test")
        tmp_path.chmod(0o777)
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", GI]
    else:
        cmd = [GI]
    p = subprocess.run([*cmd, "lab", "--lab-dir", str(tmp_path / "lab"), "up", "--nodes", "1"],
                       capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert p.returncode == 2, p.stderr
    assert "the lab needs root" in p.stderr and "hint: run `sudo gpu-install lab" in p.stderr


def test_repo_add_places_runfiles_under_files(tmp_path):
    from gpu_install_lab import repo
    from installer.errors import ConfigError

    run = tmp_path / "NVIDIA-Linux-x86_64-535.216.03-STANDIN.run"
    run.write_text("#!/bin/sh\n")
    placed = repo.add_packages(tmp_path / "repo", [run])
    assert placed == [tmp_path / "repo" / "files" / run.name] and placed[0].read_text() == "#!/bin/sh\n"
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(ConfigError, match="not a .deb, .rpm or .run"):
        repo.add_packages(tmp_path / "repo", [other])
