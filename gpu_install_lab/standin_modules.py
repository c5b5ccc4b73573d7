"""A STAND-IN for NVIDIA's RHEL 9 driver repository: the driver as dnf module streams.

NVIDIA's CUDA repository for RHEL/Rocky 8 and 9 ships the driver as streams of the dnf module `nvidia-driver`:
`<branch>-open` (open GPU kernel modules, kmod-nvidia-open-dkms) and `<branch>-dkms` (proprietary,
kmod-nvidia-latest-dkms), each stream listing its packages (artifacts) at every version of the branch, with a
default stream (NVIDIA's genmodules.py: `latest`); dnf hides a stream's packages unless that stream is enabled (or is
the module's default). Nothing of NVIDIA's is obtainable here, so module_repository() builds the same shape:

  - STAND-IN RPMs under NVIDIA's names at two versions of branch 580 (VERSIONS), epoch 3 as NVIDIA's: nvidia-driver,
    nvidia-driver-cuda (an nvidia-smi that exits 9), kmod-nvidia-latest-dkms, nvidia-persistenced (the lab's driver
    STAND-IN builder, gpu_install_lab.packages.standin_nvidia_driver_rpms), and kmod-nvidia-open-dkms and the
    nvidia-open metapackage; every Summary/Description says STAND-IN. They hold no driver, no module sources, and the
    two kmod packages do not conflict as NVIDIA's do (the builder has no Conflicts);
  - modules.yaml: `document: modulemd` version 2 for nvidia-driver:580-open and nvidia-driver:580-dkms (artifacts:
    the packages of each flavour at both versions; profile default as NVIDIA's install guide installs it), and a
    modulemd-defaults document making 580-dkms the default stream (as NVIDIA's `latest` default: a node that enables no
    stream gets the proprietary one);
  - the repository: real createrepo_c, then real modifyrepo_c adding modules.yaml as the `modules` metadata. With a
    GnuPG home, every RPM signed first (the STAND-IN upstream's key, gpu_install_lab.upstream.rpm_sign).

build_tool_rpms(): STAND-INs for what DKMS needs from the distribution (dkms from EPEL; gcc, make,
elfutils-libelf-devel from AppStream/BaseOS), non-modular, for an upstream `mirror pull` resolves against.

The lab test (tests/integration/test_rhel_path.py) serves the repository from the bastion to the rhel9 node, whose real
(Debian) dnf enables the stream; the mirror test (tests/integration/test_mirror_packages.py) pulls from it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gpu_install_lab.packages import (
    RPM_RELEASE,
    STANDIN_DRIVER_EPOCH,
    FileSpec,
    _standin_rpm,
    standin_nvidia_driver_rpms,
)
from gpu_install_lab.sh import run

MODULE = "nvidia-driver"
BRANCH = "580"
VERSIONS = ("580.82.07", "580.95.05")  # two versions of the branch: a pin picks one inside the stream
OPEN, DKMS = f"{BRANCH}-open", f"{BRANCH}-dkms"
DEFAULT_STREAM = DKMS
MODULE_VERSION = 20260101000000
# the packages of each stream (NVIDIA's: the driver, its CUDA part, the flavour's kernel module package, the
# persistence daemon; nvidia-open, the open flavour's metapackage)
STREAM_PACKAGES = {
    OPEN: ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-open-dkms", "nvidia-open", "nvidia-persistenced"),
    DKMS: ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms", "nvidia-persistenced"),
}
PROFILES = {OPEN: ("nvidia-open",), DKMS: ("nvidia-driver", "kmod-nvidia-latest-dkms")}
BUILD_TOOLS = {"dkms": "EPEL", "gcc": "AppStream", "make": "BaseOS", "elfutils-libelf-devel": "AppStream"}
_DOC = "gpu-install lab STAND-IN, not NVIDIA's package: "


def driver_rpms(version: str) -> dict[str, Path]:
    """The STAND-IN driver RPMs of one version, by package name."""
    evr = f"{STANDIN_DRIVER_EPOCH}:{version}"
    out = {p.name.split(f"-{version}-")[0]: p for p in standin_nvidia_driver_rpms(version)}
    extra: list[tuple[str, str, dict[str, FileSpec], tuple[str, ...], tuple[str, ...]]] = [
        ("kmod-nvidia-open-dkms", "no open kernel module sources (the lab shares the bastion's kernel)",
         {"/usr/share/doc/kmod-nvidia-open-dkms/STANDIN": _DOC + "no module sources, DKMS builds nothing.\n"},
         (), (f"nvidia-kmod = {evr}",)),
        ("nvidia-open", "the open flavour's metapackage",
         {"/usr/share/doc/nvidia-open/STANDIN": _DOC + "metapackage.\n"},
         (f"nvidia-driver = {evr}", f"nvidia-driver-cuda = {evr}", f"kmod-nvidia-open-dkms = {evr}"), ()),
    ]
    for name, what, files, req, prov in extra:
        out[name] = _standin_rpm(name, version, RPM_RELEASE, f"gpu-install lab STAND-IN for NVIDIA's {name}",
                                 _DOC + what, files, epoch=STANDIN_DRIVER_EPOCH, requires=req, provides=prov)
    return out


def build_tool_rpms() -> list[Path]:
    """STAND-INs named dkms, gcc, make, elfutils-libelf-devel (what DKMS needs from EPEL and AppStream/BaseOS)."""
    return [_standin_rpm(name, "1.0", RPM_RELEASE, f"gpu-install lab STAND-IN for {name} ({repo})",
                         f"gpu-install lab STAND-IN, not the distribution's {name}: it holds one text file.",
                         {f"/usr/share/doc/gpu-install-standin/{name}": f"STAND-IN {name} ({repo})\n"})
            for name, repo in BUILD_TOOLS.items()]


def _nevra(path: Path) -> str:
    out = subprocess.run(["rpm", "-qp", "--nosignature", "--nodigest", "--qf",
                          "%{NAME}-%{EPOCHNUM}:%{VERSION}-%{RELEASE}.%{ARCH}", str(path)],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def modules_yaml(rpms: dict[str, dict[str, Path]], defaults: bool = True) -> str:
    """modules.yaml for the RPMs by version and name: one modulemd document per stream (its packages at every
    version as artifacts), and with defaults the modulemd-defaults document (default stream DEFAULT_STREAM)."""
    docs = []
    for stream, names in STREAM_PACKAGES.items():
        artifacts = "".join(f"      - {_nevra(rpms[v][n])}\n" for v in sorted(rpms) for n in names)
        profile = "".join(f"        - {n}\n" for n in PROFILES[stream])
        docs.append(
            f"---\ndocument: modulemd\nversion: 2\ndata:\n  name: {MODULE}\n  stream: {stream}\n"
            f"  version: {MODULE_VERSION}\n  context: 00000000\n  arch: x86_64\n"
            f"  summary: gpu-install lab STAND-IN of NVIDIA's driver stream {stream}\n"
            f"  description: >-\n    gpu-install lab STAND-IN, not NVIDIA's module: the stream's packages are STAND-INs.\n"
            f"  license:\n    module:\n      - MIT\n"
            f"  profiles:\n    default:\n      description: Default installation\n      rpms:\n{profile}"
            f"  artifacts:\n    rpms:\n{artifacts}...\n")
    if defaults:
        docs.append(f"---\ndocument: modulemd-defaults\nversion: 1\ndata:\n  module: {MODULE}\n"
                    f"  stream: {DEFAULT_STREAM}\n  profiles:\n"
                    + "".join(f"    {s}: [default]\n" for s in STREAM_PACKAGES) + "...\n")
    return "".join(docs)


def module_repository(directory: Path, home: Path | None = None, *, tools: bool = False,
                      defaults: bool = True) -> Path:
    """directory = an rpm repository (recreated) of the STAND-IN driver RPMs at VERSIONS with the modules metadata of
    nvidia-driver:580-open and :580-dkms (createrepo_c, modifyrepo_c); with home (a GnuPG home) every RPM signed by its
    key; with tools also build_tool_rpms(). Returns directory."""
    from gpu_install_lab.upstream import rpm_sign

    rpms = {v: driver_rpms(v) for v in VERSIONS}
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    files = [*(p for by_name in rpms.values() for p in by_name.values()), *(build_tool_rpms() if tools else [])]
    copies = [Path(shutil.copy(p, directory / p.name)) for p in files]
    if home is not None:
        rpm_sign(home, copies)
    run(["createrepo_c", "--quiet", str(directory)])
    meta = directory.parent / f".{directory.name}-modules.yaml"  # beside the repository, not in it
    meta.write_text(modules_yaml(rpms, defaults))
    run(["modifyrepo_c", "--mdtype=modules", "--new-name=modules.yaml", str(meta),
         str(directory / "repodata")])
    meta.unlink()
    return directory
