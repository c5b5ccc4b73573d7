"""`mirror pull` / `mirror push` for the OS packages: the distro tools resolve, this module fetches, verifies,
records and publishes.

pull (connected side): for each node OS of the mirror plan, the package ROOTS the roles install there
(installer.mirror.plan) with their whole dependency closure, resolved by the OS's own package manager against the
upstream repositories the site file lists for that OS (`mirror.packageRepositories.<os>`):
  - apt: `apt-get update` and `apt-get install --print-uris` with a private configuration (APT_CONFIG: its own
    sources, lists, empty dpkg status, trusted keys = only the keys the site file names; nothing of this machine's
    /etc/apt is read). The suite's Release signature is checked by apt with the repository's `key`; the closure is
    what a node with nothing installed needs (complete by construction, whatever the node already has). Each .deb is
    fetched and checked against the sha256 of the signed index.
  - dnf: `dnf download --url --resolve --alldeps` in an empty installroot with its own reposdir (gpgcheck on, the
    repository's `key`); each .rpm is fetched and its signature checked with rpmkeys against the OS's keys only: an
    unsigned package, or one another key signed, is refused.
The files go to BUNDLE/packages/<os>/ (dnf: the upstream keys too, under keys/); the lock's "packages" section
records each (os, name, version, arch, source URL, sha256, size), "packageSets" each OS's manager, roots and
sources. A re-run fetches only what the bundle does not hold with the right sha256 (kill -9 safe: a file is
fetched to a .part name and renamed).

push --repo-dir DIR (air-gapped side): every package file of the lock is checked by sha256 before anything is
written; then each OS gets a SIGNED repository under DIR/packages/<os>/ -- apt: pool/ + dists/gpu-install/ (Packages
by apt-ftparchive, Release signed as InRelease and Release.gpg); dnf: the .rpm files + repodata/ (createrepo_c) with
repodata/repomd.xml.asc, and the upstream keys as RPM-GPG-KEYS-upstream.asc (the packages keep their upstream
signatures). The signing key is the site's: generated once on first push (RSA 3072, sign only) in the signing home
(default <state dir>/signing, 0700; `--signing-home`), kept there, and exported to DIR/gpu-install-site.asc: the key
`packages.key` names for apply, which trusts it on the nodes (roles/package_repo) -- no trusted=yes, no gpgcheck=0.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, EnvironmentProblem, HostFailures
from installer.mirror import bundle as lockfile
from installer.mirror.charts import fetch
from installer.util import atomic_write, sha256_file

PACKAGES, SETS, BASE = "packages", "packageSets", "packageBase"
KIND, SET_KIND, BASE_KIND = "package", "packageset", "packagebase"
SUITE, COMPONENT = "gpu-install", "main"  # of every published apt repository
SITE_KEY = "gpu-install-site.asc"  # DIR/<this>: the site's public key, what packages.key names
UPSTREAM_KEYS = "RPM-GPG-KEYS-upstream.asc"  # DIR/packages/<os>/<this>: the keys the dnf packages are signed with
KEY_NAME = "gpu-install site package repository"
APT_ARCH, RPM_ARCH = "amd64", "x86_64"  # the architecture resolved and published (GPU nodes: x86-64 for now)
TOOL_TIMEOUT = 900.0
Say = Callable[[str], None]


class PackageFailures(HostFailures):
    """An OS's closure could not be resolved, or a package could not be fetched or checked (each named); exit 4."""


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


def check_sources(site: Any, sets: Sequence[Any]) -> None:
    """Every node OS whose packages are planned has upstream repositories of the right kind in the site file, and
    their keys are readable: ConfigError (exit 2) naming the field, before anything is fetched."""
    repos = site.mirror.packageRepositories
    for s in sets:
        field = f"mirror.packageRepositories.{s.os}"
        sources = repos.get(s.os)
        if not sources:
            roots = ", ".join(p.spec for p in s.packages)
            example = ("[{url: http://archive.ubuntu.com/ubuntu, suite: jammy, components: [main, universe], "
                       "key: ubuntu-archive-keyring.gpg}]" if s.manager == "apt" else
                       "[{url: https://dl.rockylinux.org/pub/rocky/9/BaseOS/x86_64/os, key: RPM-GPG-KEY-Rocky-9}]")
            raise ConfigError(f"{field}: not set, and the nodes with OS {s.os} install packages ({roots}) whose "
                              "dependency closure mirror pull resolves against those repositories",
                              hint=f"add it to the site file, e.g. {s.os}: {example}")
        for i, src in enumerate(sources):
            where = f"{field}[{i}]"
            if s.manager == "apt" and not src.suite:
                raise ConfigError(f"{where}.suite: not set; {s.os} resolves its packages with apt",
                                  hint="give the suite (jammy, bookworm) or '/' for a flat repository such as "
                                       "NVIDIA's CUDA repository")
            if s.manager == "apt" and src.suite.endswith("/") and "components" in src.model_fields_set:
                raise ConfigError(f"{where}.components: a flat repository (suite {src.suite!r}) has no components",
                                  hint="leave components out")
            if s.manager == "dnf" and (src.suite or "components" in src.model_fields_set):
                raise ConfigError(f"{where}: suite/components are apt settings; {s.os} uses dnf",
                                  hint="give url (the directory holding repodata/) and key only")
            try:
                data = src.key.read_bytes()
            except OSError as exc:
                raise ConfigError(f"{where}.key: cannot read {src.key} ({exc.strerror})",
                                  hint="the repository's OpenPGP public key file (armored or binary)") from None
            if not data.strip():
                raise ConfigError(f"{where}.key: {src.key} is empty", hint="the repository's OpenPGP public key")


# ---------------------------------------------------------------- resolution (what the distro tools say)


def _apt_conf(work: Path, sources: Sequence[Any], ca: Path | None) -> dict[str, str]:
    """A private apt: configuration, sources, lists, an empty dpkg status; the environment that selects it."""
    for d in ("lists/partial", "archives/partial", "conf.d", "preferences.d", "trusted.d"):
        (work / d).mkdir(parents=True, exist_ok=True)
    (work / "status").write_text("")
    lines = []
    for src in sources:
        opts = f"[signed-by={src.key.resolve()} arch={APT_ARCH}]"
        if src.suite.endswith("/"):
            lines.append(f"deb {opts} {src.url}/ {src.suite}")
        else:
            lines.append(f"deb {opts} {src.url} {src.suite} {' '.join(src.components)}")
    (work / "sources.list").write_text("\n".join(lines) + "\n")
    conf = {
        "Dir::Etc::main": "/dev/null", "Dir::Etc::Parts": work / "conf.d", "Dir::Etc::sourcelist": work / "sources.list",
        "Dir::Etc::sourceparts": "-", "Dir::Etc::preferences": "/dev/null",
        "Dir::Etc::preferencesparts": work / "preferences.d", "Dir::Etc::trusted": "/dev/null",
        "Dir::Etc::trustedparts": work / "trusted.d", "Dir::State": work, "Dir::State::Lists": work / "lists",
        "Dir::State::status": work / "status", "Dir::Cache": work, "Dir::Cache::archives": work / "archives",
        "Dir::Cache::pkgcache": "", "Dir::Cache::srcpkgcache": "", "Dir::Log": work, "Debug::NoLocking": "1",
        "APT::Architecture": APT_ARCH, "APT::Install-Recommends": "0", "APT::Install-Suggests": "0",
        "APT::Get::AllowUnauthenticated": "0", "Acquire::AllowInsecureRepositories": "0",
        "Acquire::AllowDowngradeToInsecureRepositories": "0", "Acquire::Languages": "none",
        "APT::Sandbox::User": "root" if os.geteuid() == 0 else "",
    }
    if ca:
        conf["Acquire::https::CaInfo"] = ca.resolve()
    text = "".join(f'{k} "{v}";\n' for k, v in conf.items() if not (k == "APT::Sandbox::User" and not v))
    text += f'APT::Architectures {{ "{APT_ARCH}"; }};\n'
    (work / "apt.conf").write_text(text)
    return {**os.environ, "APT_CONFIG": str(work / "apt.conf"), "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}


_PRINT_URI = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) (?P<hash>\S+)")


def _apt_resolve(s: Any, sources: Sequence[Any], ca: Path | None, work: Path, dest: Path) -> list[dict[str, Any]]:
    """What a node with nothing installed needs to install the roots, [{uri, file, size}], downloaded by apt into
    dest. Raises ValueError with apt's message."""
    apt = _tool("apt-get", f"the packages of {s.os} are resolved with apt",
                "run mirror pull on a Debian or Ubuntu machine (apt-get), or install apt")
    env = _apt_conf(work, sources, ca)
    proc = _run([apt, "update", "-q"], env=env)
    if proc.returncode != 0 or re.search(r"^(E|W): ", proc.stdout + proc.stderr, re.M):
        raise ValueError(f"apt-get update: {_errors(proc.stdout + proc.stderr)}")
    roots = [p.spec for p in s.packages]
    proc = _run([apt, "install", "--print-uris", "-y", "-q", *roots], env=env)
    if proc.returncode != 0:
        raise ValueError(_errors(proc.stdout + proc.stderr))
    out = [{"uri": m["uri"], "file": m["file"], "size": int(m["size"]), "sha256": None}
           for m in map(_PRINT_URI.match, proc.stdout.splitlines()) if m]
    if not out:
        raise ValueError(f"apt resolved nothing to download for {', '.join(roots)}")
    # apt fetches them itself into the bundle's directory: it checks every file against the signed index's hashes,
    # and keeps (after checking) what a killed pull already brought
    (dest / "partial").mkdir(parents=True, exist_ok=True)
    proc = _run([apt, "install", "--download-only", "-y", "-q", "-o", f"Dir::Cache::archives={dest}", *roots],
                env=env)
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / "lock").unlink(missing_ok=True)
    if proc.returncode != 0:
        raise ValueError(_errors(proc.stdout + proc.stderr))
    return out


def _dnf_resolve(s: Any, sources: Sequence[Any], ca: Path | None, work: Path, dest: Path) -> list[dict[str, Any]]:
    """The URLs of the roots and their whole closure (an empty installroot) as dnf resolves them (fetched later, each
    checked against the repository's key)."""
    dnf = _tool("dnf", f"the packages of {s.os} are resolved with dnf",
                "install dnf and its download plugin (Debian/Ubuntu: apt-get install dnf dnf-plugins-core)")
    repos = work / "repos.d"
    repos.mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(sources):
        (repos / f"upstream{i}.repo").write_text(
            f"[upstream{i}]\nname=upstream {i} ({src.url})\nbaseurl={src.url}/\nenabled=1\ngpgcheck=1\n"
            f"gpgkey=file://{src.key.resolve()}\nmetadata_expire=0\n" + (f"sslcacert={ca.resolve()}\n" if ca else ""))
    (work / "dnf.conf").write_text("[main]\ninstall_weak_deps=False\nkeepcache=False\n")
    major = re.sub(r"^\D*", "", s.os).split(".")[0] or "9"
    # only the download plugin: another one (dnf-plugins-core's `local`) would add its own repository
    argv = [dnf, "download", "--url", "-q", "--resolve", "--alldeps", "--disableplugin=*", "--enableplugin=download",
            f"--config={work / 'dnf.conf'}",
            f"--installroot={work / 'root'}", f"--setopt=reposdir={repos}", f"--setopt=cachedir={work / 'cache'}",
            f"--releasever={major}", f"--forcearch={RPM_ARCH}", "--setopt=install_weak_deps=False",
            *[p.spec for p in s.packages]]
    proc = _run(argv, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode != 0:
        raise ValueError(_errors(proc.stdout + proc.stderr))
    urls = [ln.strip() for ln in proc.stdout.splitlines() if re.match(r"^(https?|file)://\S+\.rpm$", ln.strip())]
    if not urls:
        raise ValueError(f"dnf resolved nothing to download for {', '.join(p.spec for p in s.packages)}")
    return [{"uri": u, "file": urllib.parse.unquote(u.rsplit("/", 1)[1]), "size": None, "sha256": None}
            for u in dict.fromkeys(urls)]


# ---------------------------------------------------------------- fetch and check


@contextlib.contextmanager
def _rpm_keyring(keys: Sequence[Path]) -> Iterator[Path]:
    """A throw-away rpm database that trusts exactly these keys."""
    rpmkeys = _tool("rpmkeys", "the rpm packages' signatures are checked with it",
                    "install rpm (Debian/Ubuntu: apt-get install rpm)")
    with tempfile.TemporaryDirectory(prefix="gpu-install-rpmdb-") as db:
        for key in keys:
            proc = _run([rpmkeys, "--dbpath", db, "--import", str(key)])
            if proc.returncode != 0:
                raise ConfigError(f"{key}: not an OpenPGP public key rpm can import ({_errors(proc.stderr)})",
                                  hint="give the repository's signing key (RPM-GPG-KEY-…), armored")
        yield Path(db)


def _rpm_signed(db: Path, path: Path) -> str | None:
    """None when the package's digests are intact and a trusted key signed it, else why not."""
    proc = _run(["rpmkeys", "--dbpath", str(db), "--checksig", str(path)], env={**os.environ, "LC_ALL": "C"})
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 0 and re.search(r"\bsignatures OK\b", text):
        return None
    if proc.returncode == 0:
        return "not signed: only its digests check out (the repository's key must sign every package)"
    return "signature check failed: " + (text.split(":", 1)[-1].strip() or "rpmkeys failed")[:500]


def _rpm_identity(paths: Sequence[Path]) -> dict[str, tuple[str, str, str]]:
    rpm = _tool("rpm", "the rpm packages are read with it", "install rpm (Debian/Ubuntu: apt-get install rpm)")
    out: dict[str, tuple[str, str, str]] = {}
    for chunk in range(0, len(paths), 200):
        part = paths[chunk:chunk + 200]
        proc = _run([rpm, "-qp", "--nosignature", "--nodigest", "--qf",
                     "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\n", *map(str, part)])
        rows = [ln.split("\t") for ln in proc.stdout.splitlines() if ln.count("\t") == 2]
        if proc.returncode != 0 or len(rows) != len(part):
            raise ValueError(f"rpm cannot read {', '.join(p.name for p in part)}: {_errors(proc.stderr)}")
        for p, (name, version, arch) in zip(part, rows, strict=True):
            out[p.name] = (name, version.removeprefix("0:"), arch)
    return out


def _deb_identity(file: str) -> tuple[str, str, str]:
    """name, version, architecture from apt's archive file name (name_version_arch.deb, the epoch as %3a)."""
    stem = file.removesuffix(".deb")
    parts = stem.split("_")
    if len(parts) != 3:
        raise ValueError(f"{file}: not an apt archive name (name_version_arch.deb)")
    return parts[0], urllib.parse.unquote(parts[1]), parts[2]


def _safe(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or "\\" in name:
        raise ValueError(f"{name!r} is not a plain file name")
    return name


# ---------------------------------------------------------------- pull


def _base_of(since: Path | None) -> dict[str, str]:
    """--since OLD.lock.json: the package files (os/file name) that older bundle carried (or built on), with sha256."""
    if since is None:
        return {}
    from installer.mirror.images import read_since

    old_lock, _ = read_since(since)
    return {f"{e.get('os')}/{Path(str(e.get('file'))).name}": str(e.get("sha256"))
            for e in [*(old_lock.get(PACKAGES) or []), *(old_lock.get(BASE) or [])]
            if isinstance(e, dict) and not e.get("key")}


def pull(site: Any, sets: Sequence[Any], bundle: Path, say: Say = lambda m: None, since: Path | None = None) -> None:
    """Each OS's closure into BUNDLE/packages/<os>/ and the lock (sections packages, packageSets); raises
    PackageFailures (exit 4) naming what failed, after trying every OS; the bundle stays incomplete then. since: an
    older bundle's lock: a package file it has with the same sha256 is not carried but listed in section packageBase
    (push then requires the site repository to hold it)."""
    check_sources(site, sets)
    ca = site.mirror.upstreamCa
    lock = lockfile.load_for_update(bundle)
    old = {str(e.get("file")): e for e in lock.get(PACKAGES) or [] if isinstance(e, dict)}
    base_of = _base_of(since)
    base: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for s in sets:
        sources = site.mirror.packageRepositories[s.os]
        out = bundle / PACKAGES / _safe(s.os)
        out.mkdir(parents=True, exist_ok=True)
        records.append({"os": s.os, "manager": s.manager, "roots": [p.spec for p in s.packages],
                        "sources": [{"url": x.url, **({"suite": x.suite, "components": x.components} if x.suite
                                                      else {})} for x in sources],
                        "architecture": APT_ARCH if s.manager == "apt" else RPM_ARCH})
        say(f"packages {s.os}: resolving {len(s.packages)} root(s) and their closure with {s.manager}")
        with tempfile.TemporaryDirectory(prefix=f"gpu-install-{s.manager}-") as tmp:
            try:
                wanted = (_apt_resolve if s.manager == "apt" else _dnf_resolve)(s, sources, ca, Path(tmp), out)
            except ValueError as exc:
                failed.append({"ref": f"{s.os} ({', '.join(p.spec for p in s.packages)})", "error": str(exc)})
                say(f"packages {s.os}: FAILED: {exc}")
                continue
        say(f"packages {s.os}: {len(wanted)} package(s) in the closure")
        got = _fetch_all(s, wanted, out, old, ca, failed, say)
        if s.manager == "dnf":
            got = _check_rpms(s, sources, got, out, failed, say)
            got += _keys(s, sources, out)
        for e in got:  # --since: what the older bundle already carried stays out of this one
            ref = f"{s.os}/{Path(str(e['file'])).name}"
            if not e.get("key") and base_of.get(ref) == e["sha256"]:
                (bundle / str(e["file"])).unlink(missing_ok=True)
                base.append(e)
            else:
                entries.append(e)
        if base_of:
            say(f"packages {s.os}: {sum(1 for e in base if e['os'] == s.os)} in the base bundle, not carried")
    lockfile.put_section(bundle, BASE_KIND, BASE, base, [])
    lockfile.put_section(bundle, SET_KIND, SETS, records, [])
    lockfile.put_section(bundle, KIND, PACKAGES, entries, failed)
    if failed:
        raise PackageFailures(f"{len(failed)} OS package problem(s); the bundle is incomplete:\n"
                              + "\n".join(f"  {f['ref']}: {f['error']}" for f in failed),
                              hint="check mirror.packageRepositories (URL, suite, components, key) and that the "
                                   "pinned versions are there; run pull again: what the bundle holds is not "
                                   "fetched again")


def record_skipped(sets: Sequence[Any], bundle: Path) -> None:
    """`mirror pull --skip-packages`: the lock says which roots were left out, per OS (nothing is fetched)."""
    lockfile.put_section(bundle, SET_KIND, SETS, [{"os": s.os, "manager": s.manager, "roots": [p.spec for p in s.packages],
                                                   "skipped": True} for s in sets], [])
    lockfile.put_section(bundle, KIND, PACKAGES, [], [])


def _fetch_all(s: Any, wanted: Sequence[Mapping[str, Any]], out: Path, old: Mapping[str, Mapping[str, Any]],
               ca: Path | None, failed: list[dict[str, str]], say: Say) -> list[dict[str, Any]]:
    got = []
    for w in wanted:
        try:
            name = _safe(str(w["file"]))
        except ValueError as exc:
            failed.append({"ref": f"{s.os}/{w['file']}", "error": str(exc)})
            continue
        rel = f"{PACKAGES}/{s.os}/{name}"
        dest = out / name
        prev = old.get(rel)
        have = prev.get("sha256") if prev and dest.is_file() else None
        if have and sha256_file(dest) == have:
            got.append(dict(prev))  # type: ignore[arg-type]
            continue
        if s.manager == "dnf" or not dest.is_file():  # apt fetched and checked its files already
            try:
                fetch(str(w["uri"]), dest, ca)
            except (OSError, ValueError, ssl.SSLError) as exc:
                failed.append({"ref": f"{s.os}/{name}", "error": f"{w['uri']}: {getattr(exc, 'reason', None) or exc}"})
                say(f"packages {s.os}: {name}: FAILED: {exc}")
                continue
        digest = sha256_file(dest)
        if w["size"] is not None and dest.stat().st_size != w["size"]:
            dest.unlink()
            failed.append({"ref": f"{s.os}/{name}", "error": f"{dest.stat().st_size} bytes, the index says {w['size']}"})
            continue
        entry: dict[str, Any] = {"os": s.os, "manager": s.manager, "file": rel, "source": w["uri"], "sha256": digest,
                                 "size": dest.stat().st_size}
        if s.manager == "apt":
            n, v, a = _deb_identity(name)
            entry = {**entry, "name": n, "version": v, "arch": a}
        say(f"packages {s.os}: {name} ({entry['size']} bytes)")
        got.append(entry)
    return got


def _check_rpms(s: Any, sources: Sequence[Any], got: list[dict[str, Any]], out: Path,
                failed: list[dict[str, str]], say: Say) -> list[dict[str, Any]]:
    """Keep the rpms a key of this OS's repositories signed (the others are removed and named) with their identity."""
    kept: list[dict[str, Any]] = []
    with _rpm_keyring([src.key for src in sources]) as db:
        for e in got:
            path = out / str(e["file"]).rsplit("/", 1)[1]
            why = _rpm_signed(db, path)
            if why:
                path.unlink(missing_ok=True)
                failed.append({"ref": f"{s.os}/{path.name}", "error": why})
                say(f"packages {s.os}: {path.name}: REFUSED: {why}")
                continue
            kept.append(e)
    if kept:
        ids = _rpm_identity([out / str(e["file"]).rsplit("/", 1)[1] for e in kept])
        for e in kept:
            n, v, a = ids[str(e["file"]).rsplit("/", 1)[1]]
            e.update({"name": n, "version": v, "arch": a})
    return kept


def _keys(s: Any, sources: Sequence[Any], out: Path) -> list[dict[str, Any]]:
    """The dnf OS's upstream keys into the bundle (the nodes check the packages' signatures with them)."""
    (out / "keys").mkdir(exist_ok=True)
    entries = []
    for i, src in enumerate(sources):
        name = f"upstream{i}{''.join(src.key.suffixes[-1:]) or '.asc'}"
        dest = out / "keys" / name
        shutil.copyfile(src.key, dest)
        entries.append({"os": s.os, "manager": s.manager, "key": True, "file": f"{PACKAGES}/{s.os}/keys/{name}",
                        "source": str(src.key), "sha256": sha256_file(dest), "size": dest.stat().st_size})
    return entries


# ---------------------------------------------------------------- push: verify, sign, publish


OS_TAG = re.compile(r"([a-z][a-z0-9-]*?)([0-9]+(?:\.[0-9]+)*)")  # ID+VERSION_ID: ubuntu22.04, rocky9.4, centos7
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~%:@=-]{0,254}")  # a package file name (apt quotes an epoch: %3a)


def check_entry(where: Path, section: str, i: int, e: Any) -> None:
    """A packages (or packageBase) entry of the lock names a plain OS tag of a supported OS, a package manager the
    roles use (apt, dnf) and a file packages/<os>/<name> (or packages/<os>/keys/<name>) with a plain file name:
    ConfigError (exit 2) naming the entry otherwise. Nothing of it can lead publish outside DIR/packages/<os>/."""
    from installer import platforms

    hint = ("the bundle's lock does not match what mirror pull writes: pull the bundle again (or check that the "
            "bundle comes from your connected side)")
    if not isinstance(e, dict):
        raise ConfigError(f"{where}: {section}[{i}] is not an object", hint=hint)
    os_tag = e.get("os")
    m = OS_TAG.fullmatch(os_tag) if isinstance(os_tag, str) else None
    if m is None or m[1] not in platforms.ANSIBLE_OS:
        raise ConfigError(f"{where}: {section}[{i}]: os {str(os_tag)[:100]!r} is not a node OS tag (ID+VERSION_ID of "
                          f"{', '.join(sorted(platforms.ANSIBLE_OS))})", hint=hint)
    if e.get("manager") not in ("apt", "dnf"):
        raise ConfigError(f"{where}: {section}[{i}] ({os_tag}): manager {str(e.get('manager'))[:50]!r} is not apt or "
                          "dnf", hint=hint)
    rel = e.get("file")
    parts = rel.split("/") if isinstance(rel, str) else []
    key = bool(e.get("key"))
    shape = [PACKAGES, os_tag, "keys", parts[-1] if parts else ""] if key else [PACKAGES, os_tag,
                                                                              parts[-1] if parts else ""]
    if parts != shape or not FILE_NAME.fullmatch(parts[-1]) or (
            not key and not parts[-1].endswith(".deb" if e.get("manager") == "apt" else ".rpm")):
        raise ConfigError(f"{where}: {section}[{i}] ({os_tag}): file {str(rel)[:200]!r} is not "
                          f"{PACKAGES}/{os_tag}/{'keys/' if key else ''}<a plain "
                          f"{'key file' if key else ('.deb' if e.get('manager') == 'apt' else '.rpm') + ' file'} "
                          "name>", hint=hint)


def verify(bundle: Path, lock: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every package file of the lock is in the bundle -- a regular file inside it, symlinks resolved -- with its
    sha256 (ConfigError naming the first that is not), every entry (and every packageBase entry) of plain shape
    (check_entry)."""
    from installer.mirror.images import inside_bundle

    out = []
    hint = "the bundle was damaged in transit: pull it again and carry the whole directory"
    for i, e in enumerate(lock.get(BASE) or []):
        check_entry(bundle / lockfile.LOCK, BASE, i, e)
    for i, e in enumerate(lock.get(PACKAGES) or []):
        check_entry(bundle / lockfile.LOCK, PACKAGES, i, e)
        rel = str(e["file"])
        path = inside_bundle(bundle, rel, f"packages[{i}] file")
        if path.is_symlink() or not path.is_file():
            raise ConfigError(f"{bundle}: {rel} is missing or not a regular file", hint=hint)
        got = sha256_file(path)
        if got != e.get("sha256"):
            raise ConfigError(f"{bundle}: {rel}: sha256 {got}, the lock says {e.get('sha256')}", hint=hint)
        out.append(dict(e))
    return out


def signing_home(given: Path | None = None) -> Path:
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
    """The site signing key in home, generated once: (fingerprint, armored public key)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
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


def _copy_in(src: Path, dest: Path, sha256: str) -> bool:
    """Copy a verified file into the repository unless it is there already; True when it was copied."""
    if dest.is_file() and sha256_file(dest) == sha256:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
    return True


def publish(bundle: Path, lock: Mapping[str, Any], repo_dir: Path, home: Path | None = None,
            say: Say = lambda m: None) -> list[str]:
    """The lock's packages into signed repositories under repo_dir/packages/<os>/; what was done, as lines."""
    entries = verify(bundle, lock)
    require_base(lock, repo_dir)
    if not entries:
        return []
    home = signing_home(home)
    fpr, public = site_key(home, say)
    key_file = repo_dir / SITE_KEY
    if not key_file.is_file() or key_file.read_text() != public:
        atomic_write(key_file, public)
    done = [f"site signing key {fpr} ({home}); public key {key_file} (packages.key)"]
    by_os: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_os.setdefault(str(e["os"]), []).append(e)
    for os_tag, items in sorted(by_os.items()):
        root = repo_dir / PACKAGES / os_tag
        manager = str(items[0].get("manager"))
        if manager == "apt":
            copied = sum(_copy_in(bundle / str(e["file"]), root / "pool" / COMPONENT / Path(str(e["file"])).name,
                                  str(e["sha256"])) for e in items)
            _apt_index(root, home, fpr)
        elif manager == "dnf":
            pkgs = [e for e in items if not e.get("key")]
            copied = sum(_copy_in(bundle / str(e["file"]), root / Path(str(e["file"])).name, str(e["sha256"]))
                         for e in pkgs)
            keys = "".join((bundle / str(e["file"])).read_text() for e in items if e.get("key"))
            if not (root / UPSTREAM_KEYS).is_file() or (root / UPSTREAM_KEYS).read_text() != keys:
                atomic_write(root / UPSTREAM_KEYS, keys)
            _rpm_index(root, home, fpr)
        else:
            raise ConfigError(f"{bundle / lockfile.LOCK}: packages of {os_tag} have manager {manager!r}")
        n = sum(1 for e in items if not e.get("key"))
        done.append(f"packages {os_tag}: {n} in {root} ({copied} new), signed by the site key")
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


def _rpm_index(root: Path, home: Path, fpr: str) -> None:
    createrepo = _tool("createrepo_c", "the site's rpm repositories are indexed with it",
                       "install createrepo-c (Debian/Ubuntu: apt-get install createrepo-c; RHEL: dnf install "
                       "createrepo_c)")
    proc = _run([createrepo, "--quiet", "--update", "--simple-md-filenames", "--no-database", str(root)])
    if proc.returncode != 0:
        raise EnvironmentProblem(f"createrepo_c {root}: {_errors(proc.stdout + proc.stderr)}")
    _sign(home, fpr, root / "repodata" / "repomd.xml", root / "repodata" / "repomd.xml.asc")


# ---------------------------------------------------------------- verify: the site repository as the nodes see it


def _get(url: str, ca: Path | None = None) -> bytes:
    ctx = ssl.create_default_context()
    if ca:
        ctx.load_verify_locations(cafile=str(ca))
    with urllib.request.urlopen(url, timeout=60, context=ctx) as resp:  # noqa: S310 - the site's own repository
        data: bytes = resp.read()
    return data


def _gpgv(key: Path, *files: Path, output: Path | None = None) -> str | None:
    """None when gpgv accepts the signature with exactly this (armored) key, else why not. output: where gpgv writes
    the signed content it verified (of a clear-signed file: the text inside the signature, nothing around it)."""
    gpgv = _tool("gpgv", "the site repository's signature is checked with it", "install gpgv (apt-get install gpgv)")
    with tempfile.TemporaryDirectory(prefix="gpu-install-gpgv-") as tmp:
        ring = Path(tmp) / "site.gpg"
        proc = _run(["gpg", "--batch", "--quiet", "--homedir", tmp, "--dearmor", "--output", str(ring), str(key)])
        if proc.returncode != 0:
            raise ConfigError(f"packages.key {key}: not an armored OpenPGP public key ({_errors(proc.stderr)})",
                              hint="give DIR/gpu-install-site.asc as `mirror push` exported it")
        out = ["--output", str(output)] if output is not None else []
        proc = _run([gpgv, "--keyring", str(ring), *out, *map(str, files)], env={**os.environ, "LC_ALL": "C"})
    if proc.returncode == 0:
        return None
    return "signature not made by the site key (" + _errors(proc.stderr).split(";")[0] + ")"


def _sha256_of(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def repo_index(url: str, os_tag: str, manager: str, key: Path) -> dict[str, dict[str, str]]:
    """The site repository <url>/packages/<os_tag> as a node reads it, its index's signature checked with the site
    key: {file name: {name, version, sha256}}. Raises ValueError saying what is wrong."""
    base = f"{url.rstrip('/')}/{PACKAGES}/{os_tag}"
    with tempfile.TemporaryDirectory(prefix="gpu-install-repo-") as tmp:
        work = Path(tmp)
        try:
            if manager == "apt":
                (work / "InRelease").write_bytes(_get(f"{base}/dists/{SUITE}/InRelease"))
                why = _gpgv(key, work / "InRelease", output=work / "Release.verified")
                if why:
                    raise ValueError(f"{base}/dists/{SUITE}/InRelease: {why}")
                # only what the signature covers: gpgv's output, never the text around the signed block
                text = (work / "Release.verified").read_text(errors="replace")
                want = re.search(rf"^ ([0-9a-f]{{64}})\s+\d+\s+{COMPONENT}/binary-{APT_ARCH}/Packages$", text.split(
                    "SHA256:", 1)[-1], re.M)
                if not want:
                    raise ValueError(f"{base}: InRelease lists no {COMPONENT}/binary-{APT_ARCH}/Packages")
                data = _get(f"{base}/dists/{SUITE}/{COMPONENT}/binary-{APT_ARCH}/Packages")
                if _sha256_of(data) != want[1]:
                    raise ValueError(f"{base}: Packages does not match its signed InRelease")
                out: dict[str, dict[str, str]] = {}
                for stanza in data.decode(errors="replace").split("\n\n"):
                    f = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, re.M))
                    if "Filename" in f:
                        out[f["Filename"].rsplit("/", 1)[-1]] = {"name": f.get("Package", ""),
                                                                 "version": f.get("Version", ""),
                                                                 "sha256": f.get("SHA256", ""),
                                                                 "href": f["Filename"]}
                return out
            (work / "repomd.xml").write_bytes(_get(f"{base}/repodata/repomd.xml"))
            (work / "repomd.xml.asc").write_bytes(_get(f"{base}/repodata/repomd.xml.asc"))
            why = _gpgv(key, work / "repomd.xml.asc", work / "repomd.xml")
            if why:
                raise ValueError(f"{base}/repodata/repomd.xml: {why}")
            ns = {"r": "http://linux.duke.edu/metadata/repo", "c": "http://linux.duke.edu/metadata/common"}
            primary = ET.fromstring((work / "repomd.xml").read_bytes()).find("r:data[@type='primary']", ns)
            loc = primary.find("r:location", ns) if primary is not None else None
            csum = primary.find("r:checksum", ns) if primary is not None else None
            if loc is None or csum is None or csum.get("type") != "sha256":
                raise ValueError(f"{base}: repomd.xml names no primary metadata with a sha256")
            data = _get(f"{base}/{loc.get('href')}")
            if _sha256_of(data) != (csum.text or "").strip():
                raise ValueError(f"{base}: the primary metadata does not match its signed repomd.xml")
            out = {}
            for pkg in ET.fromstring(gzip.decompress(data)).findall("c:package", ns):
                v = pkg.find("c:version", ns)
                href = pkg.find("c:location", ns)
                sha = pkg.find("c:checksum", ns)
                if v is None or href is None:
                    continue
                epoch = v.get("epoch") or "0"
                version = f"{'' if epoch == '0' else epoch + ':'}{v.get('ver')}-{v.get('rel')}"
                out[str(href.get("href")).rsplit("/", 1)[-1]] = {
                    "name": (pkg.findtext("c:name", "", ns)), "version": version,
                    "sha256": (sha.text or "") if sha is not None and sha.get("type") == "sha256" else "",
                    "href": str(href.get("href"))}
            return out
        except (OSError, ssl.SSLError, SyntaxError, EOFError) as exc:  # SyntaxError: ElementTree's ParseError
            raise ValueError(f"{base}: cannot be read ({getattr(exc, 'reason', None) or exc})") from None


def _served(url: str, size: int) -> str | None:
    """None when the web server serves url with this size (a HEAD request), else what it says."""
    try:
        req = urllib.request.Request(url, method="HEAD")  # noqa: S310 - the site's own repository
        with urllib.request.urlopen(req, timeout=60, context=ssl.create_default_context()) as resp:  # noqa: S310
            length = resp.headers.get("Content-Length")
    except (OSError, ssl.SSLError) as exc:
        return f"not served ({getattr(exc, 'reason', None) or exc})"
    if length is not None and int(length) != size:
        return f"served with {length} bytes, the bundle has {size}"
    return None


def check_repo(site: Any, *, sets: Sequence[Any] = (), lock: Mapping[str, Any] | None = None) -> list[str]:
    """What the site repository (packages.url, as the nodes read it) lacks: with a lock, every package of it by
    sha256; else every root of the plan's package sets (a package of that name whose version the pin matches). One
    line per finding (empty: all there)."""
    url, key = site.packages.url, site.packages.key
    if not url or key is None:
        return []
    wanted: dict[tuple[str, str], list[Any]] = {}
    if lock is not None:
        for e in [*(lock.get(PACKAGES) or []), *(lock.get(BASE) or [])]:
            if isinstance(e, dict) and not e.get("key"):
                wanted.setdefault((str(e["os"]), str(e["manager"])), []).append(e)
    else:
        for s in sets:
            wanted.setdefault((s.os, s.manager), []).extend(s.packages)
    out: list[str] = []
    for (os_tag, manager), items in sorted(wanted.items()):
        try:
            index = repo_index(url, os_tag, manager, Path(key))
        except ValueError as exc:
            out.append(f"  {os_tag} packages: {exc}")
            continue
        if lock is not None:
            for e in items:
                name = Path(str(e["file"])).name
                got = index.get(name)
                if got is None:
                    out.append(f"  {os_tag}/{name}: not in the site repository")
                elif got["sha256"] != e["sha256"]:
                    out.append(f"  {os_tag}/{name}: sha256 {got['sha256']} in the site repository, the bundle "
                               f"{e['sha256']}")
                else:
                    why = _served(f"{url.rstrip('/')}/{PACKAGES}/{os_tag}/{got['href']}", int(e["size"]))
                    if why:
                        out.append(f"  {os_tag}/{name}: listed in the signed index but {why}")
            continue
        for p in items:
            have = [i for i in index.values() if i["name"] == p.name]
            ok = [i for i in have if not p.version or re.sub(r"^\d+:", "", i["version"]).startswith(p.version)]
            if not ok:
                out.append(f"  {os_tag}/{p.spec}: not in the site repository" + (
                    f" (it has {', '.join(sorted(i['version'] for i in have))})" if have else ""))
    return out
