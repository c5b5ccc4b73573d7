"""The GPU Operator's driver container in a full air gap, for the lab (docs/lab.md): what it installs at start, a
signed site repository holding it, and an image that installs it with the real apt.

NVIDIA's driver container (gpu-driver-container, ubuntu*/nvidia-driver `init`) runs `apt-get -qq update` against the
sources mounted from driver.repoConfig, then `apt-get install -y --no-install-recommends linux-headers-<uname -r>`.
The lab's nodes run this machine's kernel (`uname -r`, e.g. 6.18.44-fc-v657), for which no distribution ships a header
package, and NVIDIA's images are not obtainable here. So:

  STAND-IN linux-headers-<uname -r>   header_deb(): a .deb under the real name (dpkg-deb), Description and version
                                      saying STAND-IN, holding a README only; it Depends on Debian's real libelf1 (as
                                      Ubuntu's linux-headers-*-generic do), which the image lacks: apt resolves and
                                      installs a real closure from the site repository.
  STAND-IN driver container image     driver_image_layout(): a Debian 12 userland with apt (mmdebstrap --variant=apt,
                                      the image's own sources.list left pointing at deb.debian.org as NVIDIA's point at
                                      archive.ubuntu.com: unreachable behind the air gap) plus /usr/local/bin/
                                      nvidia-driver, which runs the two package steps of NVIDIA's `init` verbatim and
                                      builds no driver (there is no GPU). OCI layout by umoci, no Docker.

publish_site_repo() puts the .debs into a signed site repository with the real `mirror push --repo-dir` code
(installer.mirror.packages.publish: staged, sha256-checked, apt-ftparchive, signed by the site key in a real GnuPG
home), so the repository the pod reads is byte for byte what a site serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

from gpu_install_lab import rootfs
from gpu_install_lab.packages import _standin_deb
from gpu_install_lab.sh import run
from installer.errors import EnvironmentProblem
from installer.util import cache_dir, sha256_file

Progress = Callable[[str], object]
HEADER_VERSION = "0.0-0gpuinstall.standin1"
HEADER_DEPENDS = ("libelf1",)  # a real Debian package the image lacks (Ubuntu's headers depend on libelf1 too)
IMAGE = ("gpu-install-lab/standin-driver", "bookworm")
STANDIN_MARK = "gpu-install lab STAND-IN driver container"
_DONE = ".complete"

#: the package steps of NVIDIA's nvidia-driver `init` (_update_package_cache, the header install of
#: _install_prerequisites), with what they print; then a line saying what this STAND-IN does not do
NVIDIA_DRIVER = f"""#!/bin/sh
# {STANDIN_MARK}: the package steps of NVIDIA's nvidia-driver `init` (gpu-driver-container ubuntu*/nvidia-driver:
# _update_package_cache, then the header install of _install_prerequisites). It builds no driver: there is no GPU.
set -eu
KERNEL_VERSION=$(uname -r)
for f in /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  echo "== $f"
  cat "$f"
done
echo "Updating the package cache..."
if ! apt-get -qq update; then
    echo "ERROR: Failed to update package cache. Ensure that the cluster can access the proper networks."
    exit 1
fi
echo "Installing Linux kernel headers..."
apt-get install -y --no-install-recommends "linux-headers-${{KERNEL_VERSION}}"
dpkg-query -W -f='${{Package}} ${{Version}} ${{Status}}\\n' "linux-headers-${{KERNEL_VERSION}}"
echo "{STANDIN_MARK}: linux-headers-${{KERNEL_VERSION}} installed; no driver is built (no GPU)"
"""


#: runs in the finished image root ($1): no package lists or caches, no documentation or translations (half the
#: size; apt needs none of it), and the STAND-IN nvidia-driver
HOOK = ('set -e\nrm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/usr/share/locale/* "$1"/usr/share/doc/* '
        '"$1"/usr/share/man/* "$1"/usr/share/info/*\nmkdir -p "$1/usr/local/bin"\n'
        f"cat > \"$1/usr/local/bin/nvidia-driver\" <<'EOF'\n{NVIDIA_DRIVER}EOF\n"
        'chmod 0755 "$1/usr/local/bin/nvidia-driver"\n')


def kernel_release() -> str:
    """The lab nodes' kernel: this machine's (the nodes share its kernel)."""
    return os.uname().release


def header_name(kernel: str | None = None) -> str:
    name = f"linux-headers-{kernel or kernel_release()}"
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", name):
        raise EnvironmentProblem(f"{name!r} is not a Debian package name (the kernel release has other characters)",
                                 hint="run the lab on a kernel whose `uname -r` is lower case letters, digits, . + -")
    return name


def header_deb(kernel: str | None = None) -> Path:
    """The STAND-IN linux-headers-<kernel> .deb (amd64, built once with dpkg-deb, cached by content)."""
    kernel = kernel or kernel_release()
    name = header_name(kernel)
    readme = (f"{name} {HEADER_VERSION}: a gpu-install lab STAND-IN. No distribution ships headers of the kernel the "
              "lab's nodes run (this machine's); the lab's driver-container test installs this package under the "
              "real name from the signed site repository, as NVIDIA's driver container installs the node kernel's "
              "headers. It holds no header file.\n")
    control = (f"Depends: {', '.join(HEADER_DEPENDS)}\n"
               f"Description: STAND-IN (gpu-install lab) for the Linux kernel headers of {kernel}\n"
               " Stands in for the header package NVIDIA's driver container installs at start; holds a README only.\n")
    return _standin_deb(name, HEADER_VERSION, control, {f"/usr/src/{name}/README.STAND-IN": readme},
                        architecture="amd64", section="kernel")


# ---------------------------------------------------------------- the image


def _image_key() -> str:
    material = "\n".join([rootfs.SUITE, rootfs.mirror(), "variant=apt", HOOK])
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def _image_dir() -> Path:
    return cache_dir() / "lab-files" / "standin-driver" / _image_key()


def image_rootfs(progress: Progress = print) -> Path:
    """The image's root filesystem as a tar (mmdebstrap --variant=apt, built once, cached; needs the Debian mirror
    the first time)."""
    base = _image_dir()
    tar = base / "rootfs.tar"
    if (base / _DONE).exists():
        return tar
    for tool in ("mmdebstrap", "umoci", "skopeo"):
        if shutil.which(tool) is None:
            raise EnvironmentProblem(f"{tool} missing", hint="apt-get install mmdebstrap umoci skopeo")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    progress(f"STAND-IN driver container: mmdebstrap --variant=apt {rootfs.SUITE} from {rootfs.mirror()} (once; "
             f"cached at {base})")
    hook_file = base / "hook.sh"
    hook_file.write_text(HOOK)
    run(["mmdebstrap", "--variant=apt", "--mode=root", "--quiet", f"--customize-hook=sh {hook_file} \"$1\"",
         rootfs.SUITE, tar, rootfs.mirror()], timeout=1800)
    (base / _DONE).write_text("")
    return tar


def image_status(tar: Path) -> str:
    """The image's dpkg status file (what it has installed)."""
    with tarfile.open(tar) as t:
        for name in ("./var/lib/dpkg/status", "var/lib/dpkg/status"):
            try:
                member = t.extractfile(name)
            except KeyError:
                continue
            if member is not None:
                return member.read().decode()
    raise EnvironmentProblem(f"{tar}: no var/lib/dpkg/status")


def driver_image_layout(progress: Progress = print) -> Path:
    """The STAND-IN driver container image as an OCI layout (tag IMAGE[1]), built once from image_rootfs()."""
    tar = image_rootfs(progress)
    layout = tar.parent / "layout"
    if (layout / _DONE).exists():
        return layout
    shutil.rmtree(layout, ignore_errors=True)
    ref = f"{layout}:{IMAGE[1]}"
    run(["umoci", "init", "--layout", layout])
    run(["umoci", "new", "--image", ref])
    run(["umoci", "raw", "add-layer", "--image", ref, tar], timeout=600)
    run(["umoci", "config", "--image", ref, "--config.entrypoint", "/usr/local/bin/nvidia-driver",
         "--config.cmd", "init", "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
         "--config.label", f"org.opencontainers.image.title={STANDIN_MARK}",
         "--config.label", "org.opencontainers.image.description=Debian 12 with apt; installs the node kernel's "
                           "headers as NVIDIA's driver container does, builds no driver"])
    run(["umoci", "gc", "--layout", layout])
    (layout / _DONE).write_text(json.dumps({"tag": IMAGE[1]}) + "\n")
    return layout


def push_driver_image(registry: str, ca: Path, progress: Progress = print) -> str:
    """The image in the lab registry; its reference."""
    from gpu_install_lab import images

    layout = driver_image_layout(progress)
    ref = f"{registry}/{IMAGE[0]}:{IMAGE[1]}"
    images.push(layout, IMAGE[1], ref, ca)
    return ref


# ---------------------------------------------------------------- the closure and the site repository


def dependency_debs(progress: Progress = print) -> list[Path]:
    """The real Debian .debs HEADER_DEPENDS need in the image, resolved by this machine's apt against the image's dpkg
    status (what it lacks, nothing more), downloaded once into the cache."""
    tar = image_rootfs(progress)
    out = tar.parent / "depends"
    if (out / _DONE).exists():
        return sorted(out.glob("*.deb"))
    shutil.rmtree(out, ignore_errors=True)
    (out / "partial").mkdir(parents=True)
    status = tar.parent / "status"
    status.write_text(image_status(tar))
    progress(f"STAND-IN driver container: the closure of {', '.join(HEADER_DEPENDS)} against the image")
    run(["apt-get", "install", "--yes", "--download-only", "--no-install-recommends", "--quiet",
         "-o", f"Dir::State::status={status}", "-o", f"Dir::Cache::archives={out}", "-o", "Debug::NoLocking=1",
         "-o", "APT::Get::AllowUnauthenticated=false", *HEADER_DEPENDS],
        timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    debs = sorted(out.glob("*.deb"))
    if not {d.name.split("_")[0] for d in debs} >= set(HEADER_DEPENDS):
        shutil.rmtree(out, ignore_errors=True)
        raise EnvironmentProblem(f"apt downloaded {[d.name for d in debs]}, not all of {list(HEADER_DEPENDS)}",
                                 hint="run `apt-get update` on this machine (its lists resolve the closure)")
    shutil.rmtree(out / "partial")
    (out / _DONE).write_text("")
    return debs


def _control(deb: Path) -> dict[str, str]:
    text = run(["dpkg-deb", "--field", deb, "Package", "Version", "Architecture"]).stdout
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def publish_site_repo(debs: Sequence[Path], repo_dir: Path, signing_home: Path, work: Path,
                      os_tag: str = "debian12") -> Path:
    """The .debs as a signed site repository repo_dir/packages/<os_tag>/, published by `mirror push --repo-dir`'s own
    code from a bundle-shaped directory under work (its lock entries as `mirror pull` writes them); the site key is
    generated in signing_home on first use. Returns the exported public key (repo_dir/gpu-install-site.asc)."""
    from installer.mirror.packages import SITE_KEY, publish

    bundle = work / "bundle"
    (bundle / "packages" / os_tag).mkdir(parents=True, exist_ok=True)
    entries = []
    for deb in debs:
        rel = f"packages/{os_tag}/{deb.name}"
        shutil.copyfile(deb, bundle / rel)
        c = _control(deb)
        entries.append({"os": os_tag, "manager": "apt", "file": rel, "name": c["Package"], "version": c["Version"],
                        "arch": c["Architecture"], "sha256": sha256_file(deb), "size": deb.stat().st_size,
                        "source": f"file://{deb}"})
    staging = work / "staging"
    staging.mkdir(exist_ok=True)
    publish(bundle, {"packages": entries}, repo_dir, signing_home, staging_dir=staging)
    return repo_dir / SITE_KEY

