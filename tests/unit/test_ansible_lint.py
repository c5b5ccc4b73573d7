"""ansible-lint's production profile over playbooks/ and roles/ (configuration: .ansible-lint), with the collection
gpu_install.node on the collections path so that its FQCN roles and modules resolve."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from installer import content
from tests.conftest import need

ROOT = content.root()


def _ansible_lint() -> str | None:
    local = Path(sys.executable).parent / "ansible-lint"
    return str(local) if local.exists() else shutil.which("ansible-lint")


def test_production_profile_passes():
    exe = _ansible_lint()
    need(exe, "ansible-lint is not installed (it is in the test extras: pip install -e .[test])")
    env = {**os.environ, "ANSIBLE_LINT_SKIP_VERSION_CHECK": "1", "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           **content.ansible_env()}
    proc = subprocess.run([exe, "--profile", "production", "--offline", "playbooks", "roles"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"ansible-lint (production profile) found problems:\n{proc.stdout}\n{proc.stderr}"
