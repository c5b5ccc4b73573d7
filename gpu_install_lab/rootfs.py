"""Node root filesystems: one mmdebstrap rootfs per flavour, cached under the user's cache dir and
keyed by a hash of everything that goes into it. Nodes mount it read-only as an overlay lower dir.

Flavours (both are Debian 12 userland; see docs/lab.md for why):
  debian12  apt family; stands in for Ubuntu (the Ubuntu archive is not reachable from here)
  rhel9     STAND-IN for Rocky Linux 9: /etc/os-release + /etc/redhat-release of Rocky 9.5 and
            Debian's dnf + rpm, so Ansible sees os_family=RedHat and runs real dnf transactions
            against the lab RPM repo. It is not a Red Hat userland.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from gpu_install_lab import FLAVOURS
from gpu_install_lab.sh import run
from installer.errors import ConfigError
from installer.util import cache_dir

SUITE = "bookworm"
ENV_MIRROR = "GPU_INSTALL_LAB_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
LAB_USER = "lab"

COMMON_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "sudo", "iproute2",
    "ca-certificates", "curl", "skopeo", "procps", "kmod",
]
FLAVOUR_PACKAGES = {
    "debian12": ["python3-apt"],
    "rhel9": ["dnf", "rpm"],
}

ROCKY_OS_RELEASE = """\
NAME="Rocky Linux"
VERSION="9.5 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.5"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.5 (Blue Onyx) [gpu-install lab stand-in: Debian 12 userland]"
ANSI_COLOR="0;32"
CPE_NAME="cpe:/o:rocky:rocky:9::baseos"
HOME_URL="https://rockylinux.org/"
VARIANT="gpu-install lab stand-in"
"""
ROCKY_RELEASE = "Rocky Linux release 9.5 (Blue Onyx)\n"

# STAND-IN for RHEL's update-ca-trust (ca-certificates + p11-kit, not in Debian), installed into every rhel9 node at
# `lab up` (nodes.customise; per node, so the cached rootfs and its key stay as they are). Only `extract`, the
# command the registry_trust role runs: the base set (Debian's Mozilla certificates) plus the anchors become the
# bundle files RHEL has, and /etc/pki/tls/certs/ca-bundle.crt, /etc/pki/tls/cert.pem and (on this Debian userland,
# whose curl/OpenSSL/Python/Go read it) /etc/ssl/certs/ca-certificates.crt point at the PEM bundle, as RHEL's
# /etc/ssl/certs does. No trust flags, no blocklist, no p11-kit: a CA is trusted iff it is an anchor or in the base.
UPDATE_CA_TRUST = r"""#!/bin/sh
# update-ca-trust -- gpu-install lab STAND-IN for RHEL's update-ca-trust (rhel9 lab flavour: Debian userland).
# Implements `extract` only: anchors + base set -> /etc/pki/ca-trust/extracted/{pem,openssl}, RHEL's bundle paths.
set -eu
case "${1:-extract}" in
  extract) ;;
  *) echo "update-ca-trust (gpu-install lab STAND-IN): only 'extract' is implemented" >&2; exit 2;;
esac
ex=/etc/pki/ca-trust/extracted
mkdir -p "$ex/pem" "$ex/openssl" /etc/pki/tls/certs /etc/pki/ca-trust/source/anchors
tmp="$ex/pem/.tls-ca-bundle.pem.$$"
for f in /usr/share/ca-certificates/mozilla/*.crt /usr/share/pki/ca-trust-source/anchors/*          /etc/pki/ca-trust/source/anchors/*; do
  [ -f "$f" ] || continue
  cat "$f"; echo
done | sed '/^$/d' > "$tmp"
chmod 0444 "$tmp"
cp "$tmp" "$ex/openssl/.ca-bundle.trust.crt.$$"
mv -f "$ex/openssl/.ca-bundle.trust.crt.$$" "$ex/openssl/ca-bundle.trust.crt"
mv -f "$tmp" "$ex/pem/tls-ca-bundle.pem"
ln -sfn "$ex/pem/tls-ca-bundle.pem" /etc/pki/tls/certs/ca-bundle.crt
ln -sfn "$ex/pem/tls-ca-bundle.pem" /etc/pki/tls/cert.pem
ln -sfn /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/certs/ca-certificates.crt
"""

# Runs in the finished rootfs ($1). Bump HOOK_VERSION-relevant text and the cache key changes.
_COMMON_HOOK = f"""
set -e
R="$1"
chroot "$R" useradd --create-home --shell /bin/bash {LAB_USER}
echo '{LAB_USER} ALL=(ALL) NOPASSWD:ALL' > "$R/etc/sudoers.d/{LAB_USER}"
chmod 0440 "$R/etc/sudoers.d/{LAB_USER}"
rm -f "$R"/etc/ssh/ssh_host_*                      # per-node host keys are made at `lab up`
: > "$R/etc/machine-id"                            # per-node machine id too
: > "$R/etc/apt/sources.list"                      # nodes see only the lab repository
rm -f "$R"/etc/apt/sources.list.d/*
for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \\
         fstrim.timer e2scrub_reap.service; do ln -sf /dev/null "$R/etc/systemd/system/$u"; done
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/*
"""
_FLAVOUR_HOOK = {
    "debian12": "",
    "rhel9": f"""
rm -f "$R/etc/os-release"
cat > "$R/etc/os-release" <<'EOF'
{ROCKY_OS_RELEASE}EOF
printf '%s' '{ROCKY_RELEASE}' > "$R/etc/redhat-release"
ln -sf redhat-release "$R/etc/rocky-release"
ln -sf redhat-release "$R/etc/system-release"
mkdir -p "$R/etc/yum.repos.d" "$R/etc/dnf/vars" "$R/etc/pki/ca-trust/source/anchors"
echo 9 > "$R/etc/dnf/vars/releasever"
# Debian's rpm keeps a per-user database (~/.rpmdb); a RHEL system has one at /var/lib/rpm.
mkdir -p "$R/etc/rpm" "$R/var/lib/rpm"
echo '%_dbpath /var/lib/rpm' > "$R/etc/rpm/macros.gpu-install-lab"
chroot "$R" rpm --initdb
test "$(chroot "$R" rpm --eval '%_dbpath')" = /var/lib/rpm
""",
}


def _check(flavour: str) -> None:
    if flavour not in FLAVOURS:
        raise ConfigError(f"unknown lab flavour {flavour!r}", hint=f"choose from {', '.join(FLAVOURS)}")


def packages(flavour: str) -> list[str]:
    _check(flavour)
    return COMMON_PACKAGES + FLAVOUR_PACKAGES[flavour]


def hook(flavour: str) -> str:
    _check(flavour)
    return _COMMON_HOOK + _FLAVOUR_HOOK[flavour]


def mirror() -> str:
    return os.environ.get(ENV_MIRROR) or DEFAULT_MIRROR


def cache_key(flavour: str) -> str:
    material = "\n".join([SUITE, mirror(), ",".join(packages(flavour)), hook(flavour)])
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def rootfs_path(flavour: str) -> Path:
    return cache_dir() / "rootfs" / f"{flavour}-{cache_key(flavour)}"


def _prune(flavour: str, keep: Path) -> None:
    """Drop older cached rootfs of this flavour that no mounted overlay uses."""
    mounts = Path("/proc/self/mountinfo").read_text()
    for old in keep.parent.glob(f"{flavour}-*"):
        if old != keep and old.is_dir() and f"lowerdir={old}" not in mounts and ".tmp-" not in old.name:
            shutil.rmtree(old, ignore_errors=True)


def ensure_rootfs(flavour: str, progress: Callable[[str], object] = print) -> Path:
    """The cached rootfs of a flavour, built with mmdebstrap on first use (~45 s, needs the mirror)."""
    path = rootfs_path(flavour)
    if (path / "etc" / "os-release").exists():
        return path
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    # one build per flavour at a time: a second lab starting meanwhile waits, then finds the rootfs (two builds
    # racing to rename into the same directory would fail with ENOTEMPTY)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "etc" / "os-release").exists():
            return path
        return _build(flavour, path, progress)


def _build(flavour: str, path: Path, progress: Callable[[str], object]) -> Path:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    progress(f"rootfs {flavour}: building with mmdebstrap from {mirror()} (once; cached at {path})")
    hook_file = tmp.with_name(tmp.name + ".hook.sh")
    hook_file.write_text(hook(flavour))
    try:
        run(
            ["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
             "--include=" + ",".join(packages(flavour)),
             f"--customize-hook=sh {hook_file} \"$1\"", SUITE, tmp, mirror()],
            timeout=1800,
        )
        os.replace(tmp, path)
        _prune(flavour, keep=path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        hook_file.unlink(missing_ok=True)
    return path
