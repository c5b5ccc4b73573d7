"""Lab fixtures (opt-in: tests marked `lab` ask for them).

`lab`: ONE lab per test session, in a temporary lab dir: 2 nodes (node1 debian12, node2 rhel9
stand-in), the bastion registry (TLS, lab CA) and package repo. Torn down (`lab down`) at the end.
`lab_kubernetes`: the same lab plus the control plane (gpu_install_lab/kube/) with the nodes
registered as fake GPU nodes.

Skips with the reason when not root, without network namespaces or without the tools -- unless CI
or GPU_INSTALL_REQUIRE_LAB is set: then a missing prerequisite is a failure, not a skip.
The first run on a machine builds the node rootfs with mmdebstrap (~1.5 min, needs the Debian
mirror); later runs use the cache and bring the lab up in seconds.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import need

VENV_BIN = Path(sys.executable).parent


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("GPU_INSTALL_REQUIRE_LAB"))


def _skip_or_fail(reason: str) -> None:
    need(False, reason, required=_required(), why_required="CI / GPU_INSTALL_REQUIRE_LAB")


def lab_prerequisites() -> None:
    from gpu_install_lab.sh import missing_binaries

    if os.geteuid() != 0:
        _skip_or_fail("the lab needs root (network namespaces, overlay mounts, systemd-nspawn)")
    missing = missing_binaries()
    if missing:
        _skip_or_fail(f"missing tools: {', '.join(missing)} (run scripts/bootstrap as root)")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        _skip_or_fail(f"cannot create network namespaces here: {probe.stderr.strip()}")


@dataclass
class LabHandle:
    """What tests get: the lab object, its status and helpers to reach the nodes."""

    lab: object
    dir: Path
    status: dict

    @property
    def nodes(self) -> dict[str, dict]:
        return {n["name"]: n for n in self.status["nodes"]}

    def node_of(self, flavour: str) -> dict:
        return next(n for n in self.status["nodes"] if n["flavour"] == flavour)

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory" / "hosts.yml"

    @property
    def ca(self) -> Path:
        return self.dir / "pki" / "ca.crt"

    def ssh(self, node: str, command: str, user: str = "lab", check: bool = True,
            input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a command on a node over real SSH (lab key, strict host key checking)."""
        ip = self.nodes[node]["ip"]
        argv = ["ssh", "-i", str(self.dir / "ssh" / "id_ed25519"),
                "-o", f"UserKnownHostsFile={self.dir / 'ssh' / 'known_hosts'}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                f"{user}@{ip}", command]
        proc = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {node} {command!r} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def ansible(self, pattern: str, module: str, args: str = "", check: bool = True) -> subprocess.CompletedProcess:
        """ansible ad-hoc against the lab inventory (the venv's ansible, real SSH)."""
        argv = [str(VENV_BIN / "ansible"), "-i", str(self.inventory), pattern, "-m", module, "-o"]
        if args:
            argv += ["-a", args]
        env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_LOCAL_TEMP": str(self.dir / "ansible-tmp")}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"ansible {pattern} -m {module} {shlex.quote(args)} failed "
                                 f"({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    lab_prerequisites()
    from gpu_install_lab.lab import Lab

    lab_dir = Path(os.environ.get("GPU_INSTALL_TEST_LAB_DIR") or tmp_path_factory.mktemp("lab") / "lab")
    the_lab = Lab(lab_dir, progress=lambda m: print(m, flush=True))
    try:
        status = the_lab.up(count=2, flavours=["debian12", "rhel9"])
        yield LabHandle(the_lab, lab_dir, status)
    finally:
        the_lab.down()


@pytest.fixture(scope="session")
def lab_kubernetes(lab):
    """The session lab plus the control plane; its nodes registered with nvidia.com/gpu capacity."""
    try:
        from gpu_install_lab import kube
    except ModuleNotFoundError:
        _skip_or_fail("gpu_install_lab/kube/ (the lab control plane) is not in this checkout")
    from installer.errors import GpuInstallError

    try:
        kube.ensure_binaries(progress=lambda m: print(m, flush=True))
    except GpuInstallError as exc:
        _skip_or_fail(f"kubernetes binaries cannot be built: {exc}")
    lab.status = lab.lab.up(count=2, flavours=["debian12", "rhel9"], kubernetes=True)
    return lab
