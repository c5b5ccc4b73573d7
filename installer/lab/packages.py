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

nvidia_debs(): the REAL Debian NVIDIA driver packages (nvidia-driver, nvidia-smi, nvidia-kernel-dkms
at one pinned version, nvidia-persistenced) with their closure. They live in contrib/non-free/
non-free-firmware, which this machine's apt sources may not enable: closure(components=...) then uses
a private sources list and lists directory under the cache (`apt-get update` there, this machine's
apt configuration untouched).

standin_nvidia_container_toolkit(): NVIDIA's nvidia-container-toolkit is not obtainable either, so
the lab gets a package NAMED nvidia-container-toolkit (so the role installs it by its real name,
pinned) whose Description and version say STAND-IN: /usr/bin/nvidia-ctk prints a version and says it
is a stand-in. The .deb depends on gpu-install-standin-nvidia-container-runtime for
/usr/bin/nvidia-container-runtime (reused, not duplicated); the .rpm (rpmbuild) carries nvidia-ctk
only (no runc for the rhel9 stand-in).

Only debian12 nodes get the runtime and driver packages: the rhel9 flavour is a Debian userland with
dnf, and no docker/containerd/driver RPMs are obtainable here (see docs/lab.md).

Put them into a lab with `gpu-install lab repo-add $(...)`, then `apt-get install` on the node.
"""

from __future__ import annotations

import hashlib
import time
import os
import shutil
import tempfile
from pathlib import Path

from installer.errors import ConfigError, EnvironmentProblem
from installer.lab import rootfs
from installer.lab.sh import run
from installer.util import cache_dir

RUNTIME_PACKAGES = ("containerd", "docker.io")
# The Debian driver line the lab serves (bookworm-security/non-free; LAB.md). One pinned version.
NVIDIA_VERSION = "535.309.01"
NVIDIA_PACKAGES = (f"nvidia-driver={NVIDIA_VERSION}*", f"nvidia-smi={NVIDIA_VERSION}*",
                   f"nvidia-kernel-dkms={NVIDIA_VERSION}*", "nvidia-persistenced")
NVIDIA_COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
STANDIN_NCT = "nvidia-container-toolkit"  # the real name; Description/version say STAND-IN
STANDIN_NCT_UPSTREAM = "1.17.4"
STANDIN_NCT_VERSION = f"{STANDIN_NCT_UPSTREAM}-0gpuinstall.standin1"
STANDIN_NCR = "gpu-install-standin-nvidia-container-runtime"
STANDIN_NCR_VERSION = "1.0"
_DONE = ".complete"

_WRAPPER = """\
#!/bin/sh
# gpu-install lab STAND-IN for NVIDIA's nvidia-container-runtime (not obtainable here): it only
# execs runc, so containerd/dockerd can be configured with an "nvidia" runtime and start.
exec runc "$@"
"""

_CTK = f"""\
#!/bin/sh
# gpu-install lab STAND-IN for NVIDIA's nvidia-ctk (nvidia-container-toolkit is not obtainable here).
case "$1" in
  --version|-v|version)
    echo "NVIDIA Container Toolkit CLI version {STANDIN_NCT_UPSTREAM} (gpu-install lab STAND-IN)"
    echo "commit: gpu-install-lab-standin"
    exit 0;;
esac
echo "nvidia-ctk: gpu-install lab STAND-IN {STANDIN_NCT_UPSTREAM}: only --version is implemented" >&2
exit 2
"""


def _key(flavour: str, packages: tuple[str, ...], components: tuple[str, ...] = ("main",)) -> str:
    material = "\n".join([rootfs.cache_key(flavour), ",".join(sorted(packages))])
    if components != ("main",):
        material += "\n" + ",".join(components)
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def _package_name(spec: str) -> str:
    return spec.split("=", 1)[0]


def _private_apt(components: tuple[str, ...], progress) -> list[str]:
    """apt options for a private sources list (the rootfs mirror and suite, these components) with its
    own lists directory under the cache, updated when older than a day. Leaves /etc/apt alone."""
    mirror = rootfs.mirror().rstrip("/")
    base = cache_dir() / "apt" / hashlib.sha256(f"{mirror} {components}".encode()).hexdigest()[:12]
    (base / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    comps = " ".join(components)
    security = mirror.rsplit("/", 1)[0] + "/debian-security" if mirror.endswith("/debian") else None
    lines = [f"deb {mirror} bookworm {comps}", f"deb {mirror} bookworm-updates {comps}"]
    if security:
        lines.append(f"deb {security} bookworm-security {comps}")
    (base / "sources.list").write_text("\n".join(lines) + "\n")
    opts = ["-o", f"Dir::Etc::sourcelist={base / 'sources.list'}", "-o", "Dir::Etc::sourceparts=/nonexistent",
            "-o", f"Dir::State::Lists={base / 'lists'}", "-o", "Dir::Cache::pkgcache=",
            "-o", "Dir::Cache::srcpkgcache=", "-o", "Debug::NoLocking=1"]
    stamp = base / "updated"
    if not stamp.exists() or time.time() - stamp.stat().st_mtime > 86400:
        progress(f"lab packages: apt-get update for components {comps} (private lists in {base})")
        run(["apt-get", *opts, "update", "-q"], timeout=600)
        stamp.write_text("")
    return opts


def closure(flavour: str = "debian12", packages: tuple[str, ...] = RUNTIME_PACKAGES, progress=print,
            components: tuple[str, ...] = ("main",)) -> list[Path]:
    """The .debs a node of this flavour needs to `apt-get install` the packages (cached).

    A package may be pinned as `name=version` (apt's syntax, `*` allowed). Components other than main
    are resolved with a private apt sources list (see _private_apt)."""
    if flavour != "debian12":
        raise ConfigError(f"{flavour}: no runtime packages for this lab flavour",
                          hint="docker/containerd come from Debian's archive: use debian12 nodes "
                               "(the rhel9 stand-in has no RPMs for them)")
    base = rootfs.ensure_rootfs(flavour, progress=progress)
    out = cache_dir() / "lab-debs" / f"{flavour}-{_key(flavour, packages, components)}"
    if (out / _DONE).exists():
        return sorted(out.glob("*.deb"))
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "partial").mkdir(parents=True)
    progress(f"lab packages: resolving {', '.join(packages)} against the {flavour} rootfs; downloading "
             f"the closure once into {out}")
    try:
        apt_opts = _private_apt(components, progress) if components != ("main",) else []
        run(["apt-get", *apt_opts, "install", "--yes", "--download-only", "--no-install-recommends", "--quiet",
             "-o", f"Dir::State::status={base / 'var/lib/dpkg/status'}",
             "-o", f"Dir::Cache::archives={tmp}", "-o", "Debug::NoLocking=1",
             "-o", "APT::Get::AllowUnauthenticated=false", *packages],
            timeout=1200, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        debs = sorted(tmp.glob("*.deb"))
        names = {d.name.split("_")[0] for d in debs}
        if not {_package_name(p) for p in packages} <= names:
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


def _standin_deb(name: str, version: str, control: str, files: dict[str, str]) -> Path:
    """Build a stand-in .deb once with dpkg-deb (cached): `control` holds the fields after
    Package/Version/Architecture, `files` maps /usr/bin names to executable script text."""
    out = cache_dir() / "lab-debs" / f"{name}_{version}_all.deb"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: all\n{control}"
            "Maintainer: gpu-install lab <lab@gpu-install.invalid>\nSection: misc\nPriority: optional\n")
        bin_dir = root / "usr" / "bin"
        bin_dir.mkdir(parents=True)
        for fname, text in files.items():
            (bin_dir / fname).write_text(text)
            (bin_dir / fname).chmod(0o755)
        tmp_out = out.with_name(out.name + f".tmp-{os.getpid()}")
        run(["dpkg-deb", "--root-owner-group", "--build", root, tmp_out])
        os.replace(tmp_out, out)
    return out


def standin_nvidia_container_runtime() -> Path:
    """The stand-in .deb (built once with dpkg-deb, cached)."""
    return _standin_deb(
        STANDIN_NCR, STANDIN_NCR_VERSION,
        "Depends: runc\nProvides: nvidia-container-runtime\nConflicts: nvidia-container-runtime\n"
        "Description: gpu-install lab STAND-IN for nvidia-container-runtime\n"
        " /usr/bin/nvidia-container-runtime execs runc. Lab tests only: it injects no GPU.\n",
        {"nvidia-container-runtime": _WRAPPER})


def runtime_debs(progress=print) -> list[Path]:
    """containerd + docker.io with their closure for debian12 nodes, and the runtime and toolkit stand-ins
    (apply with toolkit.mode host installs nvidia-container-toolkit before configuring the runtimes)."""
    return closure("debian12", RUNTIME_PACKAGES, progress=progress) + [standin_nvidia_container_runtime(),
                                                                       standin_nvidia_container_toolkit()]


def nvidia_debs(progress=print) -> list[Path]:
    """The real Debian NVIDIA driver packages (pinned NVIDIA_VERSION) with their closure for debian12 nodes,
    plus containerd (a node needs a container runtime to pass preflight). ~250 MB, cached."""
    return closure("debian12", NVIDIA_PACKAGES + ("containerd",), progress=progress, components=NVIDIA_COMPONENTS)


def standin_nvidia_container_toolkit() -> Path:
    """The STAND-IN nvidia-container-toolkit .deb (depends on the runtime stand-in; built once, cached)."""
    return _standin_deb(
        STANDIN_NCT, STANDIN_NCT_VERSION,
        f"Depends: {STANDIN_NCR} (>= {STANDIN_NCR_VERSION})\n"
        "Description: gpu-install lab STAND-IN for NVIDIA's nvidia-container-toolkit\n"
        " Not NVIDIA's package: /usr/bin/nvidia-ctk only prints a version. The runtime binary comes\n"
        f" from {STANDIN_NCR}. Lab tests only.\n",
        {"nvidia-ctk": _CTK})


def standin_nvidia_container_toolkit_rpm() -> Path:
    """The STAND-IN nvidia-container-toolkit .rpm for the rhel9 flavour (rpmbuild; nvidia-ctk only)."""
    upstream, release = STANDIN_NCT_UPSTREAM, "0.gpuinstall.standin1"
    out = cache_dir() / "lab-rpms" / f"{STANDIN_NCT}-{upstream}-{release}.noarch.rpm"
    if out.exists():
        return out
    if not shutil.which("rpmbuild"):
        raise EnvironmentProblem("rpmbuild not found", hint="apt-get install rpm")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        (top / "SOURCES").mkdir()
        (top / "SOURCES" / "nvidia-ctk").write_text(_CTK)
        spec = top / "standin.spec"
        spec.write_text(
            f"Name: {STANDIN_NCT}\nVersion: {upstream}\nRelease: {release}\n"
            "Summary: gpu-install lab STAND-IN for NVIDIA's nvidia-container-toolkit\n"
            "License: Apache-2.0\nBuildArch: noarch\nSource0: nvidia-ctk\n"
            "%description\ngpu-install lab STAND-IN: not NVIDIA's package; /usr/bin/nvidia-ctk only prints a version.\n"
            "%install\nmkdir -p %{buildroot}/usr/bin\ninstall -m 0755 %{SOURCE0} %{buildroot}/usr/bin/nvidia-ctk\n"
            "%files\n/usr/bin/nvidia-ctk\n"
        )
        run(["rpmbuild", "-bb", "--define", f"_topdir {top}", "--define", "_build_id_links none", str(spec)],
            timeout=300)
        built = next((top / "RPMS" / "noarch").glob("*.rpm"))
        tmp_out = out.with_name(out.name + f".tmp-{os.getpid()}")
        shutil.copyfile(built, tmp_out)
        os.replace(tmp_out, out)
    return out


def driver_toolkit_debs(progress=print) -> list[Path]:
    """What the driver/toolkit lab serves: the Debian NVIDIA driver closure (+ containerd), and the
    runtime + toolkit stand-ins."""
    return nvidia_debs(progress=progress) + [standin_nvidia_container_runtime(), standin_nvidia_container_toolkit()]
