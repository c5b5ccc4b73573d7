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
/usr/bin/nvidia-container-runtime (reused, not duplicated); so does the .rpm on its .rpm twin.

rhel_rpms(): the rhel9 flavour is a Debian userland with dnf, and no containerd or driver RPMs are
obtainable here. One rpmbuild builder (_standin_rpm) makes: gpu-install-standin-containerd (Debian's
real containerd + runc binaries from the debian12 closure, repackaged unmodified), the runtime and
toolkit stand-ins as RPMs, and STAND-IN NVIDIA driver RPMs under NVIDIA's RHEL 9 names (nvidia-smi
exits 9). standin_runfile(): NVIDIA-Linux-x86_64-<v>-STANDIN.run for driver.mode runfile (served
under the repo's files/). See docs/lab.md.

Put them into a lab with `gpu-install lab repo-add $(...)`, then `apt-get install` on the node.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gpu_install_lab import rootfs
from gpu_install_lab.sh import run
from installer.errors import ConfigError, EnvironmentProblem
from installer.util import cache_dir

Progress = Callable[[str], object]
# what a stand-in rpm holds at a path: text, (text, mode), a file to copy, or ("symlink", target)
FileSpec = str | Path | tuple[str, int] | tuple[str, str]

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


def _private_apt(components: tuple[str, ...], progress: Progress) -> list[str]:
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


def closure(flavour: str = "debian12", packages: tuple[str, ...] = RUNTIME_PACKAGES, progress: Progress = print,
            components: tuple[str, ...] = ("main",)) -> list[Path]:
    """The .debs a node of this flavour needs to `apt-get install` the packages (cached).

    A package may be pinned as `name=version` (apt's syntax, `*` allowed). Components other than main
    are resolved with a private apt sources list (see _private_apt)."""
    if flavour != "debian12":
        raise ConfigError(f"{flavour}: no runtime packages for this lab flavour",
                          hint="the closure comes from Debian's archive for debian12 nodes; rhel9 nodes get "
                               "containerd from standin_containerd_rpm()")
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


def _standin_deb(name: str, version: str, control: str, files: dict[str, str], architecture: str = "all",
                 section: str = "misc") -> Path:
    """Build a stand-in .deb once with dpkg-deb (cached by a hash of what goes into it): `control` holds the fields
    after Package/Version/Architecture, `files` maps /usr/bin names to executable script text, and absolute paths to
    text files (0644). Every stand-in owns at least one file: dpkg lets a package that owns none disappear."""
    files = files or {f"/usr/share/doc/{name}/STAND-IN": f"{name} {version}: a gpu-install lab STAND-IN package.\n"}
    key = (name, version, control, sorted(files.items())) + ((architecture, section) if (architecture, section) !=
                                                              ("all", "misc") else ())
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    out = cache_dir() / "lab-debs" / digest / f"{name}_{version}_{architecture}.deb"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: {architecture}\n{control}"
            f"Maintainer: gpu-install lab <lab@gpu-install.invalid>\nSection: {section}\nPriority: optional\n")
        bin_dir = root / "usr" / "bin"
        for fname, text in files.items():
            path = root / fname.lstrip("/") if fname.startswith("/") else bin_dir / fname
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o644 if fname.startswith("/") and "/bin/" not in fname else 0o755)
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


def runtime_debs(progress: Progress = print) -> list[Path]:
    """containerd + docker.io with their closure for debian12 nodes, and the runtime and toolkit stand-ins
    (apply with toolkit.mode host installs nvidia-container-toolkit before configuring the runtimes)."""
    return closure("debian12", RUNTIME_PACKAGES, progress=progress) + [standin_nvidia_container_runtime(),
                                                                       standin_nvidia_container_toolkit(),
                                                                       *standin_toolkit_siblings()[0]]


def nvidia_debs(progress: Progress = print) -> list[Path]:
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


def _standin_rpm(name: str, version: str, release: str, summary: str, description: str,
                 files: Mapping[str, FileSpec], *, epoch: int | None = None, requires: tuple[str, ...] = (),
                 provides: tuple[str, ...] = (), config: tuple[str, ...] = ()) -> Path:
    """Build a stand-in .rpm once with rpmbuild (cached by a hash of everything that goes into it).

    files maps absolute target paths to: str (script/text; 0755 under */bin/, else 0644), (str, mode),
    Path (a file copied byte for byte, its mode kept) or ("symlink", target). noarch unless a Path is an
    ELF binary. No automatic dependencies (the rhel9 stand-in's rpm database holds only lab RPMs, not glibc),
    no strip/debuginfo/brp post-processing: repackaged binaries stay byte-identical."""
    binary = any(isinstance(v, Path) and v.read_bytes()[:4] == b"\x7fELF" for v in files.values())
    header = [f"Name: {name}", f"Version: {version}", f"Release: {release}", f"Summary: {summary}",
              "License: Apache-2.0" + (" (repackaged Debian binaries: see /usr/share/doc)" if binary else ""),
              "AutoReqProv: no", *([f"Epoch: {epoch}"] if epoch is not None else []),
              *(["BuildArch: noarch"] if not binary else []),
              *(f"Requires: {r}" for r in requires), *(f"Provides: {p}" for p in provides)]
    listed = "\n".join((f"%config(noreplace) \"{t}\"" if t in config else f"\"{t}\"") for t in sorted(files))
    spec = ("%global debug_package %{nil}\n%global __os_install_post %{nil}\n%define _build_id_links none\n"
            + "\n".join(header) + f"\n%description\n{description}\n"
            "%install\ncp -a %{_sourcedir}/root/. %{buildroot}/\n"
            f"%files\n{listed}\n")
    digest = hashlib.sha256(spec.encode())
    for target in sorted(files):
        v = files[target]
        digest.update(target.encode() + b"\0" + (v.read_bytes() if isinstance(v, Path) else repr(v).encode()))
    out_dir = cache_dir() / "lab-rpms" / digest.hexdigest()[:12]
    done = sorted(out_dir.glob(f"{name}-{version}-{release}.*.rpm"))
    if done:
        return done[0]
    if not shutil.which("rpmbuild"):
        raise EnvironmentProblem("rpmbuild not found", hint="apt-get install rpm")
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        root = top / "SOURCES" / "root"
        for target, v in files.items():
            dest = root / target.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            match v:
                case ("symlink", str(link)):
                    os.symlink(link, dest)
                case Path():
                    shutil.copy2(v, dest)
                case (str(text), int(mode)):
                    dest.write_text(text)
                    dest.chmod(mode)
                case str(text):
                    dest.write_text(text)
                    dest.chmod(0o755 if "/bin/" in target else 0o644)
                case _:
                    raise TypeError(f"stand-in rpm {name}: {target}: {v!r} is not text, (text, mode), a Path or "
                                    "('symlink', target)")
        (top / "standin.spec").write_text(spec)
        run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {top}", str(top / "standin.spec")], timeout=300)
        built = next((top / "RPMS").glob("*/*.rpm"))
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp_out = out_dir / (built.name + f".tmp-{os.getpid()}")
        shutil.copyfile(built, tmp_out)
        os.replace(tmp_out, out_dir / built.name)
        return out_dir / built.name


RPM_RELEASE = "1.el9.gpuinstall.standin1"  # every stand-in RPM says STAND-IN in its release


def standin_nvidia_container_runtime_rpm() -> Path:
    """The runtime stand-in as an RPM (a runc wrapper; runc comes from the containerd stand-in)."""
    return _standin_rpm(STANDIN_NCR, STANDIN_NCR_VERSION, RPM_RELEASE,
                        "gpu-install lab STAND-IN for nvidia-container-runtime",
                        "/usr/bin/nvidia-container-runtime execs runc. Lab tests only: it injects no GPU.",
                        {"/usr/bin/nvidia-container-runtime": _WRAPPER}, requires=("runc",),
                        provides=("nvidia-container-runtime",))


def standin_nvidia_container_toolkit_rpm() -> Path:
    """The STAND-IN nvidia-container-toolkit .rpm for the rhel9 flavour (nvidia-ctk prints a version; needs the
    runtime stand-in like the .deb)."""
    return _standin_rpm(STANDIN_NCT, STANDIN_NCT_UPSTREAM, RPM_RELEASE,
                        "gpu-install lab STAND-IN for NVIDIA's nvidia-container-toolkit",
                        "gpu-install lab STAND-IN: not NVIDIA's package; /usr/bin/nvidia-ctk only prints a version.",
                        {"/usr/bin/nvidia-ctk": _CTK}, requires=(f"{STANDIN_NCR} >= {STANDIN_NCR_VERSION}",))


STANDIN_CONTAINERD = "gpu-install-standin-containerd"


def standin_containerd_rpm(progress: Progress = print) -> Path:
    """containerd + runc for the rhel9 stand-in: Debian's REAL containerd 1.6.20 and runc binaries (the debian12
    closure, cached), repackaged unmodified as one RPM named as a stand-in. The rhel9 flavour is a Debian userland,
    so Debian's binaries are its native ones; no containerd RPM is obtainable here. Provides containerd and runc."""
    debs = {d.name.split("_")[0]: d for d in closure("debian12", RUNTIME_PACKAGES, progress=progress)}
    staging = cache_dir() / "lab-rpms" / "containerd-src"
    files: dict[str, FileSpec] = {}
    versions = {}
    for pkg in ("containerd", "runc"):
        deb = debs[pkg]
        versions[pkg] = deb.name.split("_")[1]
        tree = staging / deb.stem
        if not (tree / _DONE).exists():
            shutil.rmtree(tree, ignore_errors=True)
            tree.mkdir(parents=True)
            run(["dpkg-deb", "-x", deb, tree])
            (tree / _DONE).write_text("")
        for path in sorted(tree.rglob("*")):
            rel = "/" + str(path.relative_to(tree))
            keep_doc = rel.startswith("/usr/share/doc/") and path.name in ("copyright", "NOTICE")
            if rel == "/" + _DONE or "/share/" in rel and not keep_doc or path.is_dir() and not path.is_symlink():
                continue
            files[rel] = ("symlink", os.readlink(path)) if path.is_symlink() else path
    upstream = versions["containerd"].split("~")[0]
    return _standin_rpm(
        STANDIN_CONTAINERD, upstream, RPM_RELEASE, "gpu-install lab STAND-IN: Debian's containerd and runc as an RPM",
        f"Debian's containerd {versions['containerd']} and runc {versions['runc']} binaries, unmodified, for the\n"
        "gpu-install rhel9 lab stand-in (a Debian userland). Not a Red Hat or Docker package.",
        files, provides=(f"containerd = {upstream}", "runc"), config=("/etc/containerd/config.toml",))


# Stand-in NVIDIA driver RPMs named as NVIDIA's CUDA repository names them for RHEL 9
# (roles/nvidia_driver/vars/RedHat.yml),
# epoch 3 as NVIDIA's are. Not NVIDIA's packages: no libraries, no kernel module.
STANDIN_DRIVER_VERSION = "535.216.03"
STANDIN_DRIVER_EPOCH = 3
_SMI = """\
#!/bin/sh
# gpu-install lab STAND-IN for nvidia-smi (driver {version}): like the real one on a machine without an NVIDIA
# kernel module, it cannot talk to the driver and exits 9.
case "$1" in
  --version) echo "NVIDIA-SMI version  : {version} (gpu-install lab STAND-IN)"; exit 0;;
esac
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running. (gpu-install lab STAND-IN)"
exit 9
"""
_PERSISTENCED = """\
#!/bin/sh
# gpu-install lab STAND-IN for nvidia-persistenced: there is no NVIDIA driver to keep initialised.
echo "nvidia-persistenced (gpu-install lab STAND-IN): no NVIDIA kernel module loaded" >&2
exit 1
"""
_PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon (gpu-install lab STAND-IN)
Wants=syslog.target
ConditionPathExists=/proc/driver/nvidia/version

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def standin_nvidia_driver_rpms(version: str = STANDIN_DRIVER_VERSION) -> list[Path]:
    """nvidia-driver, nvidia-driver-cuda (nvidia-smi), kmod-nvidia-latest-dkms and nvidia-persistenced STAND-INs."""
    evr = f"{STANDIN_DRIVER_EPOCH}:{version}"
    smi = _SMI.replace("{version}", version)
    doc = "gpu-install lab STAND-IN, not NVIDIA's package: "
    spec = [
        ("nvidia-driver", "the driver metapackage (no libraries)",
         {"/usr/share/doc/nvidia-driver/STANDIN": doc + "metapackage.\n"},
         (f"nvidia-kmod = {evr}", f"nvidia-driver-cuda = {evr}"), ()),
        ("nvidia-driver-cuda", "nvidia-smi that exits 9 (no driver to talk to)", {"/usr/bin/nvidia-smi": smi},
         (f"nvidia-driver = {evr}",), ()),
        ("kmod-nvidia-latest-dkms", "no kernel module sources (the lab shares the bastion's kernel)",
         {"/usr/share/doc/kmod-nvidia-latest-dkms/STANDIN": doc + "no module sources, DKMS builds nothing.\n"},
         (), (f"nvidia-kmod = {evr}",)),
        ("nvidia-persistenced", "a unit that starts only with a loaded driver",
         {"/usr/bin/nvidia-persistenced": _PERSISTENCED, "/usr/lib/systemd/system/nvidia-persistenced.service":
          _PERSISTENCED_UNIT}, (), ()),
    ]
    return [_standin_rpm(name, version, RPM_RELEASE, f"gpu-install lab STAND-IN for NVIDIA's {name}", doc + what,
                         files, epoch=STANDIN_DRIVER_EPOCH, requires=req, provides=prov)
            for name, what, files, req, prov in spec]


def rhel_rpms(progress: Progress = print) -> list[Path]:
    """What the rhel9 stand-in's RPM repo serves for `apply` (toolkit and driver mode host): the containerd stand-in
    (preflight wants a runtime), the runtime and toolkit stand-ins, the driver stand-ins."""
    return [standin_containerd_rpm(progress), standin_nvidia_container_runtime_rpm(),
            standin_nvidia_container_toolkit_rpm(), *standin_toolkit_siblings()[1], *standin_nvidia_driver_rpms()]


def driver_toolkit_debs(progress: Progress = print) -> list[Path]:
    """What the driver/toolkit lab serves: the Debian NVIDIA driver closure (+ containerd), and the
    runtime + toolkit stand-ins."""
    return nvidia_debs(progress=progress) + [standin_nvidia_container_runtime(), standin_nvidia_container_toolkit(),
                                             *standin_toolkit_siblings()[0]]


# The runfile STAND-IN: NVIDIA's .run installers are not obtainable here. This one is a shell script named as a
# stand-in that accepts nvidia-installer's unattended options (--silent, --no-questions, --ui=none, --dkms,
# --no-nouveau-check, ...; anything else fails like nvidia-installer's "Unrecognized option"), installs a stand-in
# nvidia-smi (exits 9) and a stand-in /usr/bin/nvidia-installer whose --driver-info reports the installed version
# from the record it keeps under /var/lib/nvidia (the real one reads its backup log there), and refuses to install
# over a distro driver package's nvidia-smi.
_RUNFILE = r"""#!/bin/sh
# NVIDIA-Linux-x86_64-{version}-STANDIN.run -- gpu-install lab STAND-IN for NVIDIA's driver runfile {version}.
# Not NVIDIA's installer: no libraries, no kernel module. It installs /usr/bin/nvidia-smi (exits 9, as without a
# driver), /usr/bin/nvidia-installer (--driver-info, --uninstall) and records the version in /var/lib/nvidia.
VERSION={version}
ui=ncurses; questions=yes; dkms=no
# the kernel modules' flavour as nvidia-installer takes it (-m/--kernel-module-build-directory=kernel|kernel-open,
# from R560 also -M/--kernel-module-type=open|proprietary); its default from R560 is open
if [ "${VERSION%%.*}" -ge 560 ]; then modtype=open; else modtype=proprietary; fi
for a in "$@"; do
  case "$a" in
    -s|--silent) ui=none; questions=no;;
    -q|--no-questions) questions=no;;
    --ui=none) ui=none;;
    --ui=ncurses) ui=ncurses;;
    --dkms) dkms=yes;;
    -m=kernel|--kernel-module-build-directory=kernel|-M=proprietary|--kernel-module-type=proprietary) modtype=proprietary;;
    -m=kernel-open|--kernel-module-build-directory=kernel-open|-M=open|--kernel-module-type=open) modtype=open;;
    -m=*|--kernel-module-build-directory=*|-M=*|--kernel-module-type=*)
      echo "ERROR: Invalid kernel module type or build directory '${a#*=}' (gpu-install lab STAND-IN)" >&2; exit 1;;
    -a|--accept-license|-z|--no-nouveau-check|-Z|--disable-nouveau|--no-x-check|--no-cc-version-check|    -n|--no-precompiled-interface|--no-drm|--no-peermem|--no-opengl-files|--no-kernel-module-source|    --install-libglvnd|--no-install-libglvnd|--systemd|--no-systemd) ;;
    -v|--version) echo "nvidia-installer:  version $VERSION (gpu-install lab STAND-IN)"; exit 0;;
    --info) echo "Identification    : NVIDIA Accelerated Graphics Driver for Linux-x86_64 $VERSION (gpu-install lab STAND-IN)"; exit 0;;
    *) echo "ERROR: Unrecognized option: '$a'; see '$0 --help' for usage information. (gpu-install lab STAND-IN)" >&2; exit 1;;
  esac
done
if [ "$(id -u)" != 0 ]; then echo "ERROR: nvidia-installer must be run as root (gpu-install lab STAND-IN)" >&2; exit 1; fi
if [ "$ui" != none ] || [ "$questions" != no ]; then
  echo "ERROR: this STAND-IN only installs unattended: pass --silent (or --ui=none --no-questions)" >&2; exit 1
fi
for db in "dpkg -S /usr/bin/nvidia-smi" "rpm -qf /usr/bin/nvidia-smi"; do
  if command -v ${db%% *} >/dev/null 2>&1 && $db >/dev/null 2>&1; then
    echo "ERROR: /usr/bin/nvidia-smi belongs to a distribution package ($($db 2>/dev/null | head -n1)); uninstall the NVIDIA driver packages first (gpu-install lab STAND-IN)" >&2
    exit 1
  fi
done
mkdir -p /usr/bin /var/lib/nvidia /var/log
cat > /usr/bin/nvidia-smi <<'EOS'
{smi}EOS
cat > /usr/bin/nvidia-installer <<'EOS'
#!/bin/sh
# gpu-install lab STAND-IN for nvidia-installer as the runfile installs it.
case "$1" in
  -i|--driver-info)
    if [ -s /var/lib/nvidia/gpu-install-standin.version ]; then
      echo "The currently installed driver is: 'NVIDIA Accelerated Graphics Driver for Linux-x86_64 (gpu-install lab STAND-IN)' (version: $(cat /var/lib/nvidia/gpu-install-standin.version))."
      exit 0
    fi
    echo "There is no NVIDIA driver currently installed." ; exit 1;;
  --uninstall)
    rm -f /usr/bin/nvidia-smi /usr/bin/nvidia-uninstall /var/lib/nvidia/gpu-install-standin.version
    rm -f /var/lib/nvidia/gpu-install-standin.kernel-module-type
    rm -f /usr/bin/nvidia-installer; exit 0;;
  -v|--version) echo "nvidia-installer:  version $(cat /var/lib/nvidia/gpu-install-standin.version 2>/dev/null) (gpu-install lab STAND-IN)"; exit 0;;
esac
echo "nvidia-installer (gpu-install lab STAND-IN): only --driver-info, --uninstall and --version" >&2; exit 1
EOS
chmod 0755 /usr/bin/nvidia-smi /usr/bin/nvidia-installer
ln -sf nvidia-installer /usr/bin/nvidia-uninstall
echo "$VERSION" > /var/lib/nvidia/gpu-install-standin.version
echo "$modtype" > /var/lib/nvidia/gpu-install-standin.kernel-module-type
echo "$(date -u +%FT%TZ) installed $VERSION (gpu-install lab STAND-IN) dkms=$dkms kernel modules $modtype: no kernel module built" >> /var/log/nvidia-installer.log
exit 0
"""


def standin_runfile(version: str = STANDIN_DRIVER_VERSION) -> Path:
    """NVIDIA-Linux-x86_64-<version>-STANDIN.run (cached): the runfile stand-in (see _RUNFILE)."""
    text = _RUNFILE.replace("{version}", version).replace("{smi}", _SMI.replace("{version}", version))
    out = cache_dir() / "lab-files" / f"NVIDIA-Linux-x86_64-{version}-STANDIN.run"
    if out.exists() and out.read_text() == text:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------- STAND-IN upstream toolkit repository
# NVIDIA's real dependency chain, as STAND-INs under the real names (nothing from NVIDIA is obtainable here):
#   nvidia-container-toolkit (V) -> nvidia-container-toolkit-base (= V), libnvidia-container-tools (>= V)
#   libnvidia-container-tools (V) -> libnvidia-container1 (>= V)
# nvidia-container-toolkit-base carries /usr/bin/nvidia-ctk (prints V) and /usr/bin/nvidia-container-runtime (execs
# runc), as NVIDIA's does since 1.11. `gpu-install mirror` tests and the demo resolve their closure from a stand-in
# upstream built from these.
UPSTREAM_CHAIN_RELEASE = "1gpuinstall.upstream.standin"


def _chain_ctk(version: str) -> str:
    return _CTK.replace(STANDIN_NCT_UPSTREAM, version)


def _siblings(dv: str, version: str, release: str, ctk: str | None) -> tuple[list[Path], list[Path]]:
    """nvidia-container-toolkit-base, libnvidia-container-tools, libnvidia-container1 STAND-INs (.debs at dv, .rpms at
    version-release); base carries /usr/bin/nvidia-ctk (ctk, its script) and /usr/bin/nvidia-container-runtime (a runc
    wrapper), as NVIDIA's does, when ctk is given (the .deb then replaces the lab's runtime stand-in)."""
    note = " gpu-install STAND-IN with NVIDIA's package name and dependencies; not NVIDIA's package.\n"
    desc = note.strip()
    debs = [
        _standin_deb("nvidia-container-toolkit-base", dv,
                     (f"Conflicts: {STANDIN_NCR}\nReplaces: {STANDIN_NCR}\nProvides: nvidia-container-runtime\n"
                      if ctk else "") + f"Description: STAND-IN nvidia-container-toolkit-base\n{note}",
                     {"nvidia-ctk": ctk, "nvidia-container-runtime": _WRAPPER} if ctk else {}),
        _standin_deb("libnvidia-container-tools", dv, f"Depends: libnvidia-container1 (>= {dv})\n"
                     f"Description: STAND-IN libnvidia-container-tools\n{note}", {}),
        _standin_deb("libnvidia-container1", dv, f"Description: STAND-IN libnvidia-container1\n{note}", {}),
    ]

    def doc(name: str) -> dict[str, FileSpec]:
        return {f"/usr/share/doc/gpu-install-standin/{name}-{version}": (desc + "\n", 0o644)}

    rpms = [
        _standin_rpm("nvidia-container-toolkit-base", version, release, "STAND-IN nvidia-container-toolkit-base", desc,
                     {"/usr/bin/nvidia-ctk": ctk, "/usr/bin/nvidia-container-runtime": _WRAPPER} if ctk
                     else doc("nvidia-container-toolkit-base"), provides=("nvidia-container-runtime",) if ctk else ()),
        _standin_rpm("libnvidia-container-tools", version, release, "STAND-IN libnvidia-container-tools", desc,
                     doc("libnvidia-container-tools"), requires=(f"libnvidia-container1 >= {version}-{release}",)),
        _standin_rpm("libnvidia-container1", version, release, "STAND-IN libnvidia-container1", desc,
                     doc("libnvidia-container1")),
    ]
    return debs, rpms


def standin_toolkit_siblings() -> tuple[list[Path], list[Path]]:
    """The lab repository's siblings of its nvidia-container-toolkit stand-in, at its version (the role installs all
    four pinned, as NVIDIA's install guide does); nvidia-ctk stays in the toolkit stand-in."""
    return _siblings(STANDIN_NCT_VERSION, STANDIN_NCT_UPSTREAM, RPM_RELEASE, None)


def standin_toolkit_chain(version: str) -> tuple[list[Path], list[Path]]:
    """The STAND-IN toolkit chain at one version for a STAND-IN upstream repository: (.debs, .rpms), built once each
    and cached (unsigned: the upstream stand-in signs its copies)."""
    rel = UPSTREAM_CHAIN_RELEASE
    dv = f"{version}-{rel}"
    note = " gpu-install STAND-IN with NVIDIA's package name and dependencies; not NVIDIA's package.\n"
    debs, rpms = _siblings(dv, version, rel, _chain_ctk(version))
    top_deb = _standin_deb("nvidia-container-toolkit", dv,
                           f"Depends: nvidia-container-toolkit-base (= {dv}), libnvidia-container-tools (>= {dv})\n"
                           f"Description: STAND-IN nvidia-container-toolkit\n{note}", {})
    top_rpm = _standin_rpm("nvidia-container-toolkit", version, rel, "STAND-IN nvidia-container-toolkit", note.strip(),
                           {f"/usr/share/doc/gpu-install-standin/nvidia-container-toolkit-{version}":
                            (note.strip() + "\n", 0o644)},
                           requires=(f"nvidia-container-toolkit-base = {version}-{rel}",
                                     f"libnvidia-container-tools >= {version}-{rel}"))
    return [top_deb, *debs], [top_rpm, *rpms]
