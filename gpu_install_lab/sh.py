"""Running the system tools the lab drives (ip, mount, mmdebstrap, systemd-nspawn, ...)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Sequence

from installer.errors import EXIT_USAGE, EnvironmentProblem


class LabPrerequisite(EnvironmentProblem):
    """Not root, or a tool missing: the user can fix it (exit 2, with the fix as hint)."""

    exit_code = EXIT_USAGE

# binary -> Debian package (all listed in scripts/apt-packages.txt)
BINARIES = {
    "ip": "iproute2",
    "mmdebstrap": "mmdebstrap",
    "systemd-nspawn": "systemd-container",
    "docker-registry": "docker-registry",
    "dpkg-deb": "dpkg",
    "apt-ftparchive": "apt-utils",
    "rpmbuild": "rpm",
    "createrepo_c": "createrepo-c",
    "skopeo": "skopeo",
    "ssh": "openssh-client",
    "mount": "mount",
}


def missing_binaries(names: Sequence[str] = tuple(BINARIES)) -> list[str]:
    return [f"{n} (apt package {BINARIES.get(n, n)})" for n in names if shutil.which(n) is None]


def require_root_and_tools(names: Sequence[str] = tuple(BINARIES)) -> None:
    if os.geteuid() != 0:
        raise LabPrerequisite(
            "the lab needs root (network namespaces, overlay mounts, systemd-nspawn)",
            hint="run `sudo gpu-install lab ...`",
        )
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):  # systemd-nspawn refuses to boot then
        raise LabPrerequisite(
            "/dev/null on this machine is not a character device (something replaced it with a file)",
            hint="restore it as root: rm /dev/null && mknod -m 666 /dev/null c 1 3",
        )
    missing = missing_binaries(names)
    if missing:
        raise LabPrerequisite(
            "missing tools for the lab: " + ", ".join(missing),
            hint="run `sudo scripts/bootstrap` (installs scripts/apt-packages.txt)",
        )


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    input: str | None = None,
    netns: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = 600,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; raise EnvironmentProblem (with stderr) if it fails."""
    cmd = list(map(str, argv))
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    proc = subprocess.run(
        cmd, input=input, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-1500:]
        raise EnvironmentProblem(f"`{' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}` failed "
                                 f"(exit {proc.returncode}): {detail}")
    return proc
