"""The distro tools the OS packages' mirror runs (apt, dnf, rpm, gpg, createrepo_c, apt-ftparchive), and the names
the lock and the published repositories use."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from installer.errors import EnvironmentProblem
from installer.mirror.lock import BASE as BASE
from installer.mirror.lock import PACKAGES as PACKAGES
from installer.mirror.lock import SETS as SETS

KIND, SET_KIND, BASE_KIND = "package", "packageset", "packagebase"
SUITE, COMPONENT = "gpu-install", "main"  # of every published apt repository
SITE_KEY = "gpu-install-site.asc"  # DIR/<this>: the site's public key, what packages.key names
UPSTREAM_KEYS = "RPM-GPG-KEYS-upstream.asc"  # DIR/packages/<os>/<this>: the keys the dnf packages are signed with
KEY_NAME = "gpu-install site package repository"
APT_ARCH, RPM_ARCH = "amd64", "x86_64"  # the architecture resolved and published (GPU nodes: x86-64 for now)
TOOL_TIMEOUT = 900.0




# ---------------------------------------------------------------- tools


def _tool(name: str, why: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EnvironmentProblem(f"{name} is not installed: {why}", hint=hint)
    return path


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, env=dict(env) if env else None, cwd=cwd,
                              input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                              timeout=TOOL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{Path(argv[0]).name} did not finish in "
                                           f"{TOOL_TIMEOUT:.0f}s")


def _errors(text: str) -> str:
    """The lines of a package manager's output that say what is wrong (apt's E:/W:, dnf's Error/No match)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    bad = [ln for ln in lines if re.match(r"(E:|Err:|Error|No (package|match)|Problem|  - |nothing provides|"
                                          r"Failed|Curl error|Status code|GPG|The following packages have unmet| \S+ :)",
                                          ln)]
    return "; ".join(dict.fromkeys(bad or lines[-3:]))[:2000] or "(no message)"


# ---------------------------------------------------------------- the site file's sources
