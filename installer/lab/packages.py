"""Packages a lab serves to its nodes the way a site's mirror would: the real Debian packages of the
container runtimes (containerd, docker.io) with their dependency closure *relative to the node
rootfs*, plus one STAND-IN for NVIDIA's runtime.

closure(): apt on this machine (the bastion, Debian 12 like the nodes) resolves the packages
against the node rootfs's dpkg status file (`-o Dir::State::status=<rootfs>/var/lib/dpkg/status`)
and downloads exactly what a node lacks into the cache (`-o Dir::Cache::archives=`), no
recommends. Cached under cache_dir()/lab-debs/<flavour>-<key> (key: rootfs cache key + package
list), so after the first download (~65 MB, needs the Debian mirror) labs work offline.

standin_nvidia_container_runtime(): NVIDIA's nvidia-container-runtime is not in Debian and nothing
but the Debian archive is reachable here, so the lab gets
`gpu-install-standin-nvidia-container-runtime`, a .deb (dpkg-deb) whose
/usr/bin/nvidia-container-runtime is a shell wrapper that execs runc. Daemons accept it as the
nvidia runtime's binary; it injects no GPU (there is none in the lab).

Only debian12 nodes: the rhel9 flavour is a Debian userland with dnf, and no docker/containerd
RPMs are obtainable here (see docs/lab.md).

Put them into a lab with `gpu-install lab repo-add $(...)`, then `apt-get install` on the node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from installer.errors import ConfigError, EnvironmentProblem
from installer.lab import rootfs
from installer.lab.sh import run
from installer.util import cache_dir

RUNTIME_PACKAGES = ("containerd", "docker.io")
STANDIN_NCR = "gpu-install-standin-nvidia-container-runtime"
STANDIN_NCR_VERSION = "1.0"
_DONE = ".complete"

_WRAPPER = """\
#!/bin/sh
# gpu-install lab STAND-IN for NVIDIA's nvidia-container-runtime (not obtainable here): it only
# execs runc, so containerd/dockerd can be configured with an "nvidia" runtime and start.
exec runc "$@"
"""


def _key(flavour: str, packages: tuple[str, ...]) -> str:
    material = "\n".join([rootfs.cache_key(flavour), ",".join(sorted(packages))])
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def closure(flavour: str = "debian12", packages: tuple[str, ...] = RUNTIME_PACKAGES, progress=print) -> list[Path]:
    """The .debs a node of this flavour needs to `apt-get install` the packages (cached)."""
    if flavour != "debian12":
        raise ConfigError(f"{flavour}: no runtime packages for this lab flavour",
                          hint="docker/containerd come from Debian's archive: use debian12 nodes "
                               "(the rhel9 stand-in has no RPMs for them)")
    base = rootfs.ensure_rootfs(flavour, progress=progress)
    out = cache_dir() / "lab-debs" / f"{flavour}-{_key(flavour, packages)}"
    if (out / _DONE).exists():
        return sorted(out.glob("*.deb"))
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "partial").mkdir(parents=True)
    progress(f"lab packages: resolving {', '.join(packages)} against the {flavour} rootfs; downloading "
             f"the closure once into {out}")
    try:
        run(["apt-get", "install", "--yes", "--download-only", "--no-install-recommends", "--quiet",
             "-o", f"Dir::State::status={base / 'var/lib/dpkg/status'}",
             "-o", f"Dir::Cache::archives={tmp}", "-o", "Debug::NoLocking=1",
             "-o", "APT::Get::AllowUnauthenticated=false", *packages],
            timeout=1200, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        debs = sorted(tmp.glob("*.deb"))
        names = {d.name.split("_")[0] for d in debs}
        if not set(packages) <= names:
            raise EnvironmentProblem(f"apt downloaded {sorted(names)}, not all of {list(packages)}",
                                     hint="run `apt-get update` on this machine (its lists resolve the closure)")
        shutil.rmtree(tmp / "partial")
        (tmp / _DONE).write_text("\n".join(d.name for d in debs) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except EnvironmentProblem as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EnvironmentProblem(exc.message, hint=exc.hint or "the first run needs this machine's Debian mirror "
                                 "(apt-get update); later runs use the cache") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(out.glob("*.deb"))


def standin_nvidia_container_runtime() -> Path:
    """The stand-in .deb (built once with dpkg-deb, cached)."""
    out = cache_dir() / "lab-debs" / f"{STANDIN_NCR}_{STANDIN_NCR_VERSION}_all.deb"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {STANDIN_NCR}\nVersion: {STANDIN_NCR_VERSION}\nArchitecture: all\nDepends: runc\n"
            f"Provides: nvidia-container-runtime\nConflicts: nvidia-container-runtime\n"
            "Maintainer: gpu-install lab <lab@gpu-install.invalid>\nSection: misc\nPriority: optional\n"
            "Description: gpu-install lab STAND-IN for nvidia-container-runtime\n"
            " /usr/bin/nvidia-container-runtime execs runc. Lab tests only: it injects no GPU.\n"
        )
        bin_dir = root / "usr" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "nvidia-container-runtime").write_text(_WRAPPER)
        (bin_dir / "nvidia-container-runtime").chmod(0o755)
        tmp_out = out.with_name(out.name + f".tmp-{os.getpid()}")
        run(["dpkg-deb", "--root-owner-group", "--build", root, tmp_out])
        os.replace(tmp_out, out)
    return out


def runtime_debs(progress=print) -> list[Path]:
    """containerd + docker.io with their closure for debian12 nodes, and the runtime stand-in."""
    return closure("debian12", RUNTIME_PACKAGES, progress=progress) + [standin_nvidia_container_runtime()]
