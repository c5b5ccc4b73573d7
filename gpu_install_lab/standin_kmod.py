"""A STAND-IN kernel module named like NVIDIA's, built and signed by the REAL DKMS against REAL Debian kernel headers.

What is real: Debian 12's `dkms` (3.0.10), the Debian kernel headers of a kernel this machine does not run
(`linux-headers-<abi>-amd64` + `-common` + `linux-kbuild-6.1`, fetched with `apt-get download` and unpacked with
`dpkg-deb -x`), the kernel's own kbuild and `scripts/sign-file`, and DKMS's signing with `mok_signing_key` /
`mok_certificate` read from `/etc/dkms/framework.conf`. What is a stand-in: the module's source, a few lines of C
that declare `nvidia` (MODULE_LICENSE "Dual MIT/GPL" like NVIDIA's open modules) and say STAND-IN in their
description. Nothing is loaded: no insmod, no modprobe.

Where it runs: on this machine, in a private mount namespace (`unshare --mount --propagation private`, as
staticpods.py does) in which
- the unpacked header packages are layered over /usr with a read-only overlayfs, so the headers sit at the paths the
  packages install them to (/usr/src/linux-headers-*, /usr/lib/linux-kbuild-6.1, /lib/modules/<kernel>/build: the
  packages' Makefiles name absolute paths), and
- a directory under the caller's work dir is bind-mounted on /etc/dkms: the site's framework.conf, naming the site
  key and certificate; another one on /var/lib/dkms (where DKMS would generate a key of its own).
The DKMS tree (--dkmstree) and source tree (--sourcetree) are under the work dir. The machine's own /etc/dkms, /usr,
/lib/modules and /var/lib/dkms are not changed. Needs root (mount namespace), dkms, gcc, make, libelf-dev (all in
scripts/apt-packages.txt) and, the first time, the Debian mirror (the .debs are cached under cache_dir()).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpu_install_lab.sh import run
from installer.errors import EnvironmentProblem
from installer.util import cache_dir

#: The lab's DKMS package version for the stand-in (PACKAGE_VERSION); not an NVIDIA version.
STANDIN_VERSION = "0.0.1-standin"
MODULE = "nvidia"
KBUILD = "linux-kbuild-6.1"

SOURCE = """\
// STAND-IN for NVIDIA's nvidia.ko (gpu-install lab): built and signed by DKMS, never loaded.
#include <linux/module.h>
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("STAND-IN for NVIDIA's nvidia.ko: gpu-install lab, built and signed by DKMS, never loaded");
"""


def dkms_conf(version: str = STANDIN_VERSION) -> str:
    """dkms.conf of the stand-in: one module, `nvidia`, installed under updates/dkms like NVIDIA's DKMS packages."""
    return (f'PACKAGE_NAME="{MODULE}"\nPACKAGE_VERSION="{version}"\nBUILT_MODULE_NAME[0]="{MODULE}"\n'
            'DEST_MODULE_LOCATION[0]="/updates/dkms"\nAUTOINSTALL="yes"\n')


def source_tree(root: Path, version: str = STANDIN_VERSION) -> Path:
    """Write the DKMS source tree <root>/nvidia-<version>/ (nvidia.c, Kbuild Makefile, dkms.conf); returns it."""
    d = root / f"{MODULE}-{version}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "nvidia.c").write_text(SOURCE)
    (d / "Makefile").write_text("obj-m := nvidia.o\n")
    (d / "dkms.conf").write_text(dkms_conf(version))
    return d


def headers_abi() -> str:
    """The Debian kernel ABI (e.g. 6.1.0-56-amd64) linux-headers-amd64 points at in this machine's apt lists."""
    out = run(["apt-cache", "depends", "linux-headers-amd64"]).stdout
    m = re.search(r"Depends: linux-headers-(\d+\.\d+\.\d+-\d+-amd64)\b", out)
    if not m:
        raise EnvironmentProblem("apt-cache knows no linux-headers-amd64 -> linux-headers-<abi>-amd64",
                                 hint="apt-get update (Debian 12 main)")
    return m.group(1)


def header_debs(abi: str) -> list[Path]:
    """The three real Debian packages the headers of kernel <abi> need, downloaded once into cache_dir()."""
    d = cache_dir() / "lab-debs" / f"kernel-headers-{abi}"
    names = [f"linux-headers-{abi}", f"linux-headers-{abi.rsplit('-', 1)[0]}-common", KBUILD]
    if not all(any(d.glob(f"{n}_*.deb")) for n in names):
        d.mkdir(parents=True, exist_ok=True)
        run(["apt-get", "download", *names], cwd=d)
    return sorted(p for n in names for p in d.glob(f"{n}_*.deb"))


@dataclass(frozen=True)
class Built:
    ko: Path  # the signed module in the DKMS tree
    kernel: str  # the kernel release it was built for
    log: str  # dkms's output


def build_signed(work: Path, key: Path, cert: Path, *, abi: str | None = None,
                 version: str = STANDIN_VERSION) -> Built:
    """`dkms add` + `dkms build -k <abi>` of the stand-in under <work>, signed by DKMS with key/cert (framework.conf
    mok_signing_key / mok_certificate). Guarantees the returned .ko exists; raises EnvironmentProblem with dkms's
    output when the build fails or leaves no module."""
    for tool in ("dkms", "unshare", "dpkg-deb", "make", "gcc"):
        if not shutil.which(tool):
            raise EnvironmentProblem(f"{tool} is not installed", hint="apt-get install $(grep -v '^#' "
                                     "scripts/apt-packages.txt)")
    abi = abi or headers_abi()
    root = work / "headers-root"
    root.mkdir(parents=True, exist_ok=True)
    for deb in header_debs(abi):
        run(["dpkg-deb", "-x", str(deb), str(root)])
    # Debian 12 is merged-/usr: the packages' /lib/modules/<abi>/build link belongs under the /usr overlay
    if (root / "lib").is_dir():
        shutil.copytree(root / "lib", root / "usr" / "lib", symlinks=True, dirs_exist_ok=True)
    etc = work / "etc-dkms"
    (etc / "framework.conf.d").mkdir(parents=True, exist_ok=True)
    (etc / "framework.conf").write_text(f'mok_signing_key="{key}"\nmok_certificate="{cert}"\n')
    src = work / "src"
    source_tree(src, version)
    tree = work / "dkms"
    tree.mkdir(exist_ok=True)
    var = work / "var-lib-dkms"  # where DKMS would make a key of its own if the site's were not configured
    var.mkdir(exist_ok=True)
    opts = f"--dkmstree {tree} --sourcetree {src} -m {MODULE} -v {version}"
    script = (f"set -e; mount -t overlay overlay -o lowerdir={root / 'usr'}:/usr /usr; mount --bind {etc} /etc/dkms; "
              f"mount --bind {var} /var/lib/dkms; "
              f"dkms add {opts}; dkms build {opts} -k {abi}")
    p = run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script], check=False)
    log = p.stdout + p.stderr
    ko = tree / MODULE / version / abi / "x86_64" / "module" / f"{MODULE}.ko"
    if p.returncode != 0 or not ko.is_file():
        raise EnvironmentProblem(f"dkms build of the stand-in module failed (exit {p.returncode}):\n{log[-4000:]}")
    return Built(ko, abi, log)
