"""`mirror push --repo-dir` of the OS packages (the air-gapped side): every package file of the lock read once from
the bundle into push's private staging directory and checked there by sha256 (installer.mirror.staging), then each OS
gets a repository signed by the site's key (apt: pool/ + dists/gpu-install/, InRelease and Release.gpg; dnf:
repodata/ by createrepo_c with repomd.xml.asc, and the dnf module streams' metadata the bundles carried added by
modifyrepo_c) from the staged copies, the key generated once in the signing home."""

from __future__ import annotations

import gzip
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, EnvironmentProblem
from installer.mirror import bundle as lockfile
from installer.mirror.common import Say, copy_in
from installer.mirror.lock import PackageEntry, check_entry
from installer.mirror.packages import modulemd
from installer.mirror.packages.tools import (
    APT_ARCH,
    BASE,
    COMPONENT,
    KEY_NAME,
    PACKAGES,
    SITE_KEY,
    SUITE,
    UPSTREAM_KEYS,
    _errors,
    _run,
    _tool,
)
from installer.mirror.staging import Staging, staging
from installer.util import atomic_write, sha256_file

MODULES_STATE = "modules/streams.yaml"  # DIR/packages/<os>/<this>: the module streams every push so far published

SIGNING_HOME_HINT = ("give `mirror push --signing-home` (or GPU_INSTALL_SIGNING_HOME) a directory of your own: the "
                     "site key is generated there on first use, and packages.key must then pin that key")


def signing_home(given: Path | None = None) -> Path:
    """The GnuPG home of the site's package key: --signing-home, else $GPU_INSTALL_SIGNING_HOME, else
    <state dir>/signing. Only where it is: site_key checks it before gpg uses it."""
    if given:
        return given
    from installer.ansible import state_dir

    return Path(os.environ.get("GPU_INSTALL_SIGNING_HOME") or state_dir() / "signing")


def _gpg(home: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    gpg = _tool("gpg", "the site's package repositories are signed with it",
                "install GnuPG (Debian/Ubuntu: apt-get install gpg gpg-agent; RHEL: dnf install gnupg2)")
    return _run([gpg, "--batch", "--quiet", "--no-tty", "--homedir", str(home), *argv],
                env={**os.environ, "LC_ALL": "C"}, stdin=stdin)


def site_key(home: Path, say: Say = lambda m: None) -> tuple[str, str]:
    """The site signing key in home, generated once: (fingerprint, armored public key). The home is created 0700 or,
    when it exists, must be the current user's alone, as must the keys gpg keeps in it (signing.gnupg_home:
    ConfigError naming the file otherwise; never chmod-ed, never followed through a symlink)."""
    from installer import signing

    signing.gnupg_home(home, SIGNING_HOME_HINT)
    proc = _gpg(home, "--with-colons", "--list-secret-keys", KEY_NAME)
    fprs = [ln.split(":")[9] for ln in proc.stdout.splitlines() if ln.startswith("fpr:")]
    if not fprs:
        say(f"signing key: none in {home}; generating the site's package signing key (RSA 3072, sign only)")
        params = (f"%no-protection\nKey-Type: RSA\nKey-Length: 3072\nKey-Usage: sign\nName-Real: {KEY_NAME}\n"
                  "Expire-Date: 0\n%commit\n")
        gen = _gpg(home, "--gen-key", stdin=params)
        if gen.returncode != 0:
            raise EnvironmentProblem(f"gpg could not generate the signing key in {home}: {_errors(gen.stderr)}",
                                     hint="check that gpg-agent is installed and the directory is writable")
        proc = _gpg(home, "--with-colons", "--list-secret-keys", KEY_NAME)
        fprs = [ln.split(":")[9] for ln in proc.stdout.splitlines() if ln.startswith("fpr:")]
    if not fprs:
        raise EnvironmentProblem(f"no signing key '{KEY_NAME}' in {home}", hint="check the signing home")
    pub = _gpg(home, "--armor", "--export", fprs[0])
    if pub.returncode != 0 or "BEGIN PGP PUBLIC KEY BLOCK" not in pub.stdout:
        raise EnvironmentProblem(f"gpg could not export the signing key from {home}: {_errors(pub.stderr)}")
    return fprs[0], pub.stdout


def _sign(home: Path, fpr: str, path: Path, out: Path, clear: bool = False) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.unlink(missing_ok=True)
    mode = ["--clearsign"] if clear else ["--armor", "--detach-sign"]
    proc = _gpg(home, "--yes", "--local-user", fpr, "--digest-algo", "SHA256", *mode, "--output", str(tmp), str(path))
    if proc.returncode != 0:
        raise EnvironmentProblem(f"gpg could not sign {path}: {_errors(proc.stderr)}")
    os.replace(tmp, out)


def needs(lock: Mapping[str, Any]) -> int:
    """The bytes staging the lock's package files takes (their sizes in the lock)."""
    return sum(e["size"] for e in lock.get(PACKAGES) or []
               if isinstance(e, dict) and isinstance(e.get("size"), int) and e["size"] > 0)


def stage(bundle: Path, lock: Mapping[str, Any], into: Staging) -> list[tuple[PackageEntry, Path]]:
    """Every package file (and upstream key file) of the lock staged: every entry (and packageBase entry) of plain
    shape first (check_entry), then each file read once from the bundle, copied while hashed and matched with the
    lock's sha256 and size (Staging.take). ConfigError (exit 2) naming the first that is not. The entries, each with
    its staged copy: the only file publish reads."""
    for i, e in enumerate(lock.get(BASE) or []):
        check_entry(bundle / lockfile.LOCK, BASE, i, e)
    entries = [check_entry(bundle / lockfile.LOCK, PACKAGES, i, e) for i, e in enumerate(lock.get(PACKAGES) or [])]
    return [(entry, into.take(bundle, entry["file"], e.get("sha256"), e.get("size"), f"packages[{i}] file"))
            for i, (entry, e) in enumerate(zip(entries, lock.get(PACKAGES) or [], strict=True))]


def publish(bundle: Path, lock: Mapping[str, Any], repo_dir: Path, home: Path | None = None,
            say: Say = lambda m: None, *, staged: list[tuple[PackageEntry, Path]] | None = None,
            staging_dir: Path | None = None) -> list[str]:
    """The lock's packages into signed repositories under repo_dir/packages/<os>/, each file (and the upstream keys)
    from its STAGED copy (stage: read once from the bundle, matched with the lock), never the bundle's; what was done,
    as lines. staged: what `mirror push` staged with the images and charts; else staged here, under staging_dir,
    removed afterwards."""
    if staged is None:
        with staging(staging_dir, bundle) as into:
            return publish(bundle, lock, repo_dir, home, say, staged=stage(bundle, lock, into))
    copy = {id(e): path for e, path in staged}
    entries = [e for e, _ in staged]
    require_base(lock, repo_dir)
    if not entries:
        return []
    home = signing_home(home)
    fpr, public = site_key(home, say)
    key_file = repo_dir / SITE_KEY
    if not key_file.is_file() or key_file.read_text() != public:
        atomic_write(key_file, public)
    done = [f"site signing key {fpr} ({home}); public key {key_file} (packages.key)"]
    by_os: dict[str, list[PackageEntry]] = {}
    for e in entries:
        by_os.setdefault(str(e["os"]), []).append(e)
    for os_tag, items in sorted(by_os.items()):
        root = repo_dir / PACKAGES / os_tag
        manager = str(items[0].get("manager"))
        if manager == "apt":
            copied = sum(copy_in(copy[id(e)], root / "pool" / COMPONENT / Path(str(e["file"])).name,
                                 str(e["sha256"])) for e in items)
            _apt_index(root, home, fpr)
        elif manager == "dnf":
            pkgs = [e for e in items if not e.get("key") and not e.get("modules")]
            copied = sum(copy_in(copy[id(e)], root / Path(str(e["file"])).name, str(e["sha256"])) for e in pkgs)
            keys = "".join(copy[id(e)].read_text() for e in items if e.get("key"))
            if not (root / UPSTREAM_KEYS).is_file() or (root / UPSTREAM_KEYS).read_text() != keys:
                atomic_write(root / UPSTREAM_KEYS, keys)
            streams = _modules(root, [copy[id(e)] for e in items if e.get("modules")], bundle)
            _rpm_index(root, home, fpr, streams)
        else:
            raise ConfigError(f"{bundle / lockfile.LOCK}: packages of {os_tag} have manager {manager!r}")
        n = sum(1 for e in items if not e.get("key") and not e.get("modules"))
        done.append(f"packages {os_tag}: {n} in {root} ({copied} new), signed by the site key")
        if manager == "dnf" and (root / MODULES_STATE).is_file():
            done.append(f"packages {os_tag}: dnf module streams {', '.join(_specs(root / MODULES_STATE))} in its "
                        "modules metadata")
        say(f"packages {os_tag}: {n} package(s) published in {root} ({copied} new)")
    return done


def _published(repo_dir: Path, e: Mapping[str, Any]) -> Path:
    """Where publish puts a package file of the lock in repo_dir."""
    name = Path(str(e["file"])).name
    root = repo_dir / PACKAGES / str(e["os"])
    return root / "pool" / COMPONENT / name if e.get("manager") == "apt" else root / name


def require_base(lock: Mapping[str, Any], repo_dir: Path) -> None:
    """An incremental bundle (pulled --since an older lock) builds on packages the site repository must hold
    already (by sha256): PreflightError (exit 3) naming the missing ones, before anything is written."""
    from installer.errors import PreflightError

    base = [e for e in lock.get(BASE) or [] if isinstance(e, dict)]
    missing = [e for e in base if not _published(repo_dir, e).is_file()
               or sha256_file(_published(repo_dir, e)) != e.get("sha256")]
    if missing:
        raise PreflightError(f"the bundle builds on {len(base)} package(s) of an older bundle; {repo_dir} lacks "
                             f"{len(missing)} of them:\n" + "\n".join(f"  {e['os']}/{Path(str(e['file'])).name}"
                                                                       for e in missing),
                             hint="push the bundle that --since lock belongs to into this --repo-dir first (or pull a "
                                  "full bundle, without --since)")


def _apt_index(root: Path, home: Path, fpr: str) -> None:
    ftp = _tool("apt-ftparchive", "the site's apt repositories are indexed with it",
                "install apt-utils (Debian/Ubuntu: apt-get install apt-utils)")
    dist = root / "dists" / SUITE
    binary = dist / COMPONENT / f"binary-{APT_ARCH}"
    binary.mkdir(parents=True, exist_ok=True)
    proc = _run([ftp, "packages", f"pool/{COMPONENT}"], cwd=root)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"apt-ftparchive packages {root}: {_errors(proc.stderr)}")
    atomic_write(binary / "Packages", proc.stdout)
    with open(binary / ".Packages.gz.tmp", "wb") as fh:
        fh.write(gzip.compress(proc.stdout.encode(), mtime=0))
    os.replace(binary / ".Packages.gz.tmp", binary / "Packages.gz")
    proc = _run([ftp, "-o", f"APT::FTPArchive::Release::Origin={KEY_NAME}", "-o",
                 f"APT::FTPArchive::Release::Label={SUITE}", "-o", f"APT::FTPArchive::Release::Suite={SUITE}",
                 "-o", f"APT::FTPArchive::Release::Codename={SUITE}", "-o",
                 f"APT::FTPArchive::Release::Components={COMPONENT}", "-o",
                 f"APT::FTPArchive::Release::Architectures={APT_ARCH}", "release", "."], cwd=dist)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"apt-ftparchive release {dist}: {_errors(proc.stderr)}")
    atomic_write(dist / "Release", proc.stdout)
    _sign(home, fpr, dist / "Release", dist / "InRelease", clear=True)
    _sign(home, fpr, dist / "Release", dist / "Release.gpg")


def _modules(root: Path, staged: list[Path], bundle: Path) -> Path | None:
    """The dnf module streams' metadata the site repository publishes: what earlier pushes published there
    (root/modules/streams.yaml) merged with the bundle's (its staged copies), each document checked again (modulemd);
    written back to root/modules/streams.yaml. None when neither has any. ConfigError (exit 2) naming the bundle's file
    when it is not modules metadata gpu-install carries."""
    state = root / MODULES_STATE
    old: list[modulemd.Stream] = []
    if state.is_file():
        try:
            old = modulemd.read_file(state)
        except ValueError as exc:
            raise ConfigError(f"{state}: {exc}", hint="the site repository's modules metadata is not what mirror push "
                                                      "wrote: remove the file and push every bundle again") from None
    new: list[modulemd.Stream] = []
    for path in staged:
        try:
            new += modulemd.read_file(path)
        except ValueError as exc:
            raise ConfigError(f"{bundle / lockfile.LOCK}: the modules metadata it lists: {exc}",
                              hint="pull the bundle again (or check that the bundle comes from your connected "
                                   "side)") from None
    merged = modulemd.merge(old, new)
    if not merged:
        return None
    text = modulemd.render(merged)
    if not state.is_file() or state.read_text() != text:
        state.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(state, text)
    return state


def _specs(state: Path) -> list[str]:
    return sorted({s.spec for s in modulemd.read_file(state)})


def _rpm_index(root: Path, home: Path, fpr: str, modules: Path | None = None) -> None:
    """root/repodata by createrepo_c (and, with modules, the modules metadata added by modifyrepo_c as type modules),
    repomd.xml signed by the site key."""
    createrepo = _tool("createrepo_c", "the site's rpm repositories are indexed with it",
                       "install createrepo-c (Debian/Ubuntu: apt-get install createrepo-c; RHEL: dnf install "
                       "createrepo_c)")
    proc = _run([createrepo, "--quiet", "--update", "--simple-md-filenames", "--no-database", str(root)])
    if proc.returncode != 0:
        raise EnvironmentProblem(f"createrepo_c {root}: {_errors(proc.stdout + proc.stderr)}")
    if modules is not None:
        modifyrepo = _tool("modifyrepo_c", "the dnf module streams' metadata is added to the site repository with it",
                           "install createrepo-c (Debian/Ubuntu: apt-get install createrepo-c; RHEL: dnf install "
                           "createrepo_c)")
        proc = _run([modifyrepo, "--mdtype=modules", "--simple-md-filenames", f"--new-name={modulemd.FILE}",
                     str(modules), str(root / "repodata")])
        if proc.returncode != 0:
            raise EnvironmentProblem(f"modifyrepo_c {root}: {_errors(proc.stdout + proc.stderr)}")
    _sign(home, fpr, root / "repodata" / "repomd.xml", root / "repodata" / "repomd.xml.asc")
