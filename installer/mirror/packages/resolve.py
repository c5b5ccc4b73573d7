"""`mirror pull` of the OS packages (the connected side): each OS's closure resolved by its own package manager
(apt, dnf) against the site's upstream repositories, fetched into the bundle, checked (apt: the signed index's
sha256; dnf: each rpm's signature against the OS's keys only, with rpmkeys) and recorded in the lock.

A repository's credentials (mirror.packageRepositories.<os>[].credentials: the names of two environment variables)
reach apt as an auth.conf and dnf as its .repo file, both 0600 in the private work directory, and the files fetched
here as an HTTP Basic header for URLs under that repository only; never a command line, the tools' environment (the
variables are dropped from it), a message (redacted), the lock or the plan.

dnf module streams (RHEL 8/9: NVIDIA's nvidia-driver:<branch>-open|-dkms, the plan's OsPackages.modules): enabled in
the private installroot before the download (dnf hides the packages of a stream that is not enabled), and the
documents of exactly those streams from the upstream modules metadata dnf resolved with carried in the bundle
(packages/<os>/modules/modules.yaml, a lock entry with modules: true), read bounded and checked (modulemd)."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError
from installer.mirror import bundle as lockfile
from installer.mirror.common import Login, PackageFailures, Say, fetch, incomplete, read_since, redact, reusable
from installer.mirror.lock import Failure, PackageEntry
from installer.mirror.packages import modulemd
from installer.mirror.packages.tools import (
    APT_ARCH,
    BASE,
    BASE_KIND,
    KIND,
    PACKAGES,
    RPM_ARCH,
    SET_KIND,
    SETS,
    _errors,
    _run,
    _tool,
)
from installer.util import atomic_write, sha256_file

MODULES_DIR = "modules"  # BUNDLE/packages/<os>/modules/modules.yaml: the OS's module streams' metadata

if TYPE_CHECKING:
    from installer.config import PackageSource, Site
    from installer.mirror.plan import OsPackages


def check_sources(site: Site, sets: Sequence[OsPackages]) -> None:
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
            if s.manager == "apt" and (src.suite or "").endswith("/") and "components" in src.model_fields_set:
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
            _login(src, where, s.manager)  # its credentials' variables set and usable (exit 2), before any fetch


def _login(src: PackageSource, where: str, manager: str) -> Login | None:
    """(url, user, password) of a repository with credentials, from the environment variables they name; None without
    credentials. ConfigError (exit 2) naming the field and the variable -- never its value -- when one is unset or
    empty, or holds what apt's auth.conf, dnf's .repo file or HTTP Basic cannot carry (whitespace, a control
    character; a ':' in the user name; for dnf a '$', which it reads as a variable such as $releasever)."""
    cred = src.credentials
    if cred is None:
        return None
    values: list[str] = []
    for field, name, what in (("usernameEnv", cred.usernameEnv, "user name"),
                              ("passwordEnv", cred.passwordEnv, "password/token")):
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"{where}.credentials.{field}: environment variable {name} is not set",
                              hint=f"export {name} with the package repository's {what} before mirror pull")
        if any(c.isspace() or not c.isprintable() for c in value) or (field == "usernameEnv" and ":" in value):
            raise ConfigError(f"{where}.credentials.{field}: environment variable {name} holds whitespace, a control "
                              f"character{' or a colon' if field == 'usernameEnv' else ''}, which apt's auth.conf, "
                              "dnf's .repo file and HTTP Basic authentication cannot carry",
                              hint=f"use a {what} without them (a token for the repository)")
        if manager == "dnf" and "$" in value:
            raise ConfigError(f"{where}.credentials.{field}: environment variable {name} holds a '$', which dnf reads "
                              "as a variable ($releasever, $basearch) in the repository's .repo file",
                              hint=f"use a {what} without '$' (a token for the repository)")
        values.append(value)
    return src.url, values[0], values[1]


def _secrets(logins: Sequence[Login]) -> list[str]:
    """What a message must never show of these logins: each password and its Basic token (user:password, base64)."""
    return [x for _, user, password in logins
            for x in (password, base64.b64encode(f"{user}:{password}".encode()).decode())]


def _tool_env(site: Site) -> dict[str, str]:
    """This process's environment without the variables any package repository's credentials name: apt, dnf and rpm
    never see them (they read the credentials from the work directory's 0600 files)."""
    names = {n for sources in site.mirror.packageRepositories.values() for src in sources if src.credentials
             for n in (src.credentials.usernameEnv, src.credentials.passwordEnv)}
    return {k: v for k, v in os.environ.items() if k not in names}


def _private_file(path: Path, text: str) -> None:
    """text into a new file only this user can read (0600, O_CREAT|O_EXCL|O_NOFOLLOW: never one planted there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


# ---------------------------------------------------------------- resolution (what the distro tools say)


def _apt_conf(work: Path, sources: Sequence[PackageSource], ca: Path | None, logins: Sequence[Login] = (),
              env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A private apt: configuration, sources, lists, an empty dpkg status; the environment that selects it (env, by
    default this process's, with APT_CONFIG). logins: written to work/auth.conf (0600), the only login file apt
    reads (Dir::Etc::netrc; netrcparts an empty directory of work, never the system's), one `machine` line per
    repository: scheme, host, port and the path below the repository's URL."""
    for d in ("lists/partial", "archives/partial", "conf.d", "preferences.d", "trusted.d", "auth.conf.d"):
        (work / d).mkdir(parents=True, exist_ok=True)
    if logins:
        lines = []
        for url, user, password in logins:
            parts = urllib.parse.urlsplit(url)
            lines.append(f"machine {parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/ login {user} "
                         f"password {password}\n")
        _private_file(work / "auth.conf", "".join(lines))
    (work / "status").write_text("")
    lines = []
    for src in sources:
        opts = f"[signed-by={src.key.resolve()} arch={APT_ARCH}]"
        if (src.suite or "").endswith("/"):
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
        "Dir::Etc::netrc": work / "auth.conf" if logins else "/dev/null", "Dir::Etc::netrcparts": work / "auth.conf.d",
    }
    if ca:
        conf["Acquire::https::CaInfo"] = ca.resolve()
    text = "".join(f'{k} "{v}";\n' for k, v in conf.items() if not (k == "APT::Sandbox::User" and not v))
    text += f'APT::Architectures {{ "{APT_ARCH}"; }};\n'
    (work / "apt.conf").write_text(text)
    return {**(os.environ if env is None else env), "APT_CONFIG": str(work / "apt.conf"),
            "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}


_PRINT_URI = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) (?P<hash>\S+)")


def _apt_resolve(s: OsPackages, sources: Sequence[PackageSource], ca: Path | None, work: Path, dest: Path,
                 logins: Sequence[Login] = (), env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """What a node with nothing installed needs to install the roots, [{uri, file, size}], downloaded by apt into
    dest. Raises ValueError with apt's message."""
    apt = _tool("apt-get", f"the packages of {s.os} are resolved with apt",
                "run mirror pull on a Debian or Ubuntu machine (apt-get), or install apt")
    env = _apt_conf(work, sources, ca, logins, env)
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


def _dnf_resolve(s: OsPackages, sources: Sequence[PackageSource], ca: Path | None, work: Path, dest: Path,
                 logins: Sequence[Login] = (), env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The URLs of the roots and their whole closure (an empty installroot) as dnf resolves them (fetched later, each
    checked against the repository's key), with the OS's module streams (s.modules) enabled in the installroot first
    (_enable_streams). logins: a repository's username=/password= in its .repo file; every file of the work directory
    is written 0600."""
    dnf = _tool("dnf", f"the packages of {s.os} are resolved with dnf",
                "install dnf and its download plugin (Debian/Ubuntu: apt-get install dnf dnf-plugins-core)")
    repos = work / "repos.d"
    repos.mkdir(parents=True, exist_ok=True)
    login = {url: (user, password) for url, user, password in logins}
    for i, src in enumerate(sources):
        user, password = login.get(src.url, (None, None))
        _private_file(repos / f"upstream{i}.repo",
                      f"[upstream{i}]\nname=upstream {i} ({src.url})\nbaseurl={src.url}/\nenabled=1\ngpgcheck=1\n"
                      f"gpgkey=file://{src.key.resolve()}\nmetadata_expire=0\n"
                      + (f"sslcacert={ca.resolve()}\n" if ca else "")
                      + (f"username={user}\npassword={password}\n" if password else ""))
    _private_file(work / "dnf.conf", "[main]\ninstall_weak_deps=False\nkeepcache=False\n")
    major = _major(s.os)
    # only the download plugin: another one (dnf-plugins-core's `local`) would add its own repository
    base = [dnf, "--disableplugin=*", f"--config={work / 'dnf.conf'}", f"--installroot={work / 'root'}",
            f"--setopt=reposdir={repos}", f"--setopt=cachedir={work / 'cache'}", f"--releasever={major}",
            f"--forcearch={RPM_ARCH}", "--setopt=install_weak_deps=False",
            f"--setopt=module_platform_id=platform:el{major}"]
    env = {**(os.environ if env is None else env), "LC_ALL": "C"}
    _enable_streams(s, base, work, len(sources), env)
    argv = [*base, "--enableplugin=download", "download", "--url", "-q", "--resolve", "--alldeps",
            *[p.spec for p in s.packages]]
    proc = _run(argv, env=env)
    if proc.returncode != 0:
        raise ValueError(_errors(proc.stdout + proc.stderr))
    urls = [ln.strip() for ln in proc.stdout.splitlines() if re.match(r"^(https?|file)://\S+\.rpm$", ln.strip())]
    if not urls:
        raise ValueError(f"dnf resolved nothing to download for {', '.join(p.spec for p in s.packages)}")
    return [{"uri": u, "file": urllib.parse.unquote(u.rsplit("/", 1)[1]), "size": None, "sha256": None}
            for u in dict.fromkeys(urls)]


def _major(os_tag: str) -> str:
    return re.sub(r"^\D*", "", os_tag).split(".")[0] or "9"


_NO_MODULE = re.compile(r"missing groups or modules|Unable to resolve argument|No matching Modules", re.I)


def _enable_streams(s: OsPackages, base: Sequence[str], work: Path, n_repos: int, env: Mapping[str, str]) -> None:
    """`dnf module enable` of each of the OS's streams in the private installroot (the node's platform,
    platform:el<major>), so that the download resolves the stream's packages (dnf hides a modular package of a stream
    that is not enabled). Upstream repositories that offer no stream of the module at all (no modules metadata for it:
    its packages are not modular there) leave it off: _carry_modules says so. ValueError naming the streams offered
    when the module is there without the stream, or with dnf's words."""
    for spec in s.modules:
        name, stream = modulemd.split_spec(spec)
        proc = _run([*base, "-y", "-q", "module", "enable", spec], env=env)
        if proc.returncode == 0:
            continue
        text = proc.stdout + proc.stderr
        if not _NO_MODULE.search(text):
            raise ValueError(f"dnf module enable {spec}: {_errors(text)}")
        offered = sorted({x.stream for _, docs in _cached(work, n_repos, name) for x in docs})
        if offered:
            raise ValueError(f"dnf module stream {spec} is not in mirror.packageRepositories.{s.os} (the module {name} "
                             f"is, with the streams {', '.join(offered)}): the driver branch and kernel modules "
                             "flavour of the site need that stream")


def _cached(work: Path, n_repos: int, module: str) -> list[tuple[str, list[modulemd.Stream]]]:
    return modulemd.cached_streams(work / "cache", [f"upstream{i}" for i in range(n_repos)], module)


def _carry_modules(s: OsPackages, sources: Sequence[PackageSource], work: Path, out: Path,
                   say: Say) -> tuple[list[str], list[str]]:
    """The modules metadata of the streams _enable_streams enabled (the documents of exactly those streams, from the
    upstream repositories' metadata dnf resolved with) into out/modules/modules.yaml; (the streams carried, the URLs
    of the repositories their documents came from). A stream
    left off (the upstream repositories have no such module) is said; no stream: no file (an older pull's goes)."""
    carried: list[modulemd.Stream] = []
    specs: list[str] = []
    urls: set[str] = set()
    for spec in s.modules:
        name, stream = modulemd.split_spec(spec)
        state = work / "root" / "etc" / "dnf" / "modules.d" / f"{name}.module"
        text = state.read_text(errors="replace")[:65536] if state.is_file() else ""
        if not re.search(rf"^stream={re.escape(stream)}$", text, re.M) or not re.search(r"^state=enabled$", text,
                                                                                           re.M):
            say(f"packages {s.os}: mirror.packageRepositories.{s.os} offer no {name} module (no modules metadata): "
                f"resolved without the stream {spec}; the nodes install the packages without it")
            continue
        docs = [(repo, x) for repo, found in _cached(work, len(sources), name) for x in found if x.stream == stream]
        if not docs:
            raise ValueError(f"dnf enabled {spec}, and no modules metadata of the upstream repositories holds it")
        carried += [x for _, x in docs]
        specs.append(spec)
        came = sorted({sources[int(repo.removeprefix("upstream"))].url for repo, _ in docs})
        urls.update(came)
        say(f"packages {s.os}: module stream {spec}: {len(docs)} modules document(s) from {', '.join(came)}")
    target = out / MODULES_DIR / modulemd.FILE
    if carried:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, modulemd.render(carried))
    else:
        target.unlink(missing_ok=True)
    return specs, sorted(urls)


def _modules_entry(s: OsPackages, out: Path, urls: Sequence[str]) -> PackageEntry:
    """The lock's entry of the modules metadata _carry_modules wrote."""
    path = out / MODULES_DIR / modulemd.FILE
    return {"os": s.os, "manager": s.manager, "modules": True, "file": f"{PACKAGES}/{s.os}/{MODULES_DIR}/{modulemd.FILE}",
            "source": " ".join(urls), "sha256": sha256_file(path), "size": path.stat().st_size}


# ---------------------------------------------------------------- fetch and check


@contextlib.contextmanager
def _rpm_keyring(keys: Sequence[Path], env: Mapping[str, str] | None = None) -> Iterator[Path]:
    """A throw-away rpm database that trusts exactly these keys."""
    rpmkeys = _tool("rpmkeys", "the rpm packages' signatures are checked with it",
                    "install rpm (Debian/Ubuntu: apt-get install rpm)")
    with tempfile.TemporaryDirectory(prefix="gpu-install-rpmdb-") as db:
        for key in keys:
            proc = _run([rpmkeys, "--dbpath", db, "--import", str(key)], env=env)
            if proc.returncode != 0:
                raise ConfigError(f"{key}: not an OpenPGP public key rpm can import ({_errors(proc.stderr)})",
                                  hint="give the repository's signing key (RPM-GPG-KEY-…), armored")
        yield Path(db)


def _rpm_signed(db: Path, path: Path, env: Mapping[str, str] | None = None) -> str | None:
    """None when the package's digests are intact and a trusted key signed it, else why not."""
    proc = _run(["rpmkeys", "--dbpath", str(db), "--checksig", str(path)],
                env={**(os.environ if env is None else env), "LC_ALL": "C"})
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 0 and re.search(r"\bsignatures OK\b", text):
        return None
    if proc.returncode == 0:
        return "not signed: only its digests check out (the repository's key must sign every package)"
    return "signature check failed: " + (text.split(":", 1)[-1].strip() or "rpmkeys failed")[:500]


def _rpm_identity(paths: Sequence[Path], env: Mapping[str, str] | None = None) -> dict[str, tuple[str, str, str]]:
    rpm = _tool("rpm", "the rpm packages are read with it", "install rpm (Debian/Ubuntu: apt-get install rpm)")
    out: dict[str, tuple[str, str, str]] = {}
    for chunk in range(0, len(paths), 200):
        part = paths[chunk:chunk + 200]
        proc = _run([rpm, "-qp", "--nosignature", "--nodigest", "--qf",
                     "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\n", *map(str, part)], env=env)
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
    old_lock, _ = read_since(since)
    return {f"{e.get('os')}/{Path(str(e.get('file'))).name}": str(e.get("sha256"))
            for e in [*(old_lock.get(PACKAGES) or []), *(old_lock.get(BASE) or [])]
            if isinstance(e, dict) and not e.get("key") and not e.get("modules")}


def pull(site: Site, sets: Sequence[OsPackages], bundle: Path, say: Say = lambda m: None,
         since: Path | None = None) -> None:
    """Each OS's closure into BUNDLE/packages/<os>/ and the lock (sections packages, packageSets); raises
    PackageFailures (exit 4) naming what failed, after trying every OS; the bundle stays incomplete then. since: an
    older bundle's lock: a package file it has with the same sha256 is not carried but listed in section packageBase
    (push then requires the site repository to hold it)."""
    check_sources(site, sets)
    ca = site.mirror.upstreamCa
    lock = lockfile.load_for_update(bundle)
    old: dict[str, Any] = {str(e.get("file")): e for e in lock.get(PACKAGES) or [] if isinstance(e, dict)}
    base_of = _base_of(since)
    base: list[PackageEntry] = []
    entries: list[PackageEntry] = []
    records: list[dict[str, Any]] = []
    failed: list[Failure] = []
    env = _tool_env(site)
    for s in sets:
        sources = site.mirror.packageRepositories[s.os]
        logins = [x for i, src in enumerate(sources)
                  if (x := _login(src, f"mirror.packageRepositories.{s.os}[{i}]", s.manager)) is not None]
        secrets = _secrets(logins)
        out = bundle / PACKAGES / _safe(s.os)
        out.mkdir(parents=True, exist_ok=True)
        records.append({"os": s.os, "manager": s.manager, "roots": [p.spec for p in s.packages],
                        "sources": [{"url": x.url, **({"suite": x.suite, "components": x.components} if x.suite
                                                      else {})} for x in sources],
                        "architecture": APT_ARCH if s.manager == "apt" else RPM_ARCH,
                        **({"modules": list(s.modules)} if s.modules else {})})
        say(f"packages {s.os}: resolving {len(s.packages)} root(s) and their closure with {s.manager}"
            + (f", module stream(s) {', '.join(s.modules)} enabled" if s.modules else ""))
        carried: tuple[list[str], list[str]] = ([], [])
        with tempfile.TemporaryDirectory(prefix=f"gpu-install-{s.manager}-") as tmp:
            try:
                wanted = (_apt_resolve if s.manager == "apt" else _dnf_resolve)(s, sources, ca, Path(tmp), out,
                                                                                 logins, env)
                if s.manager == "dnf" and s.modules:
                    carried = _carry_modules(s, sources, Path(tmp), out, say)
                    records[-1]["modules"] = carried[0]  # the streams whose metadata the bundle carries
            except ValueError as exc:
                why = redact(str(exc), secrets)
                failed.append({"ref": f"{s.os} ({', '.join(p.spec for p in s.packages)})", "error": why})
                say(f"packages {s.os}: FAILED: {why}")
                continue
        say(f"packages {s.os}: {len(wanted)} package(s) in the closure")
        got = _fetch_all(s, wanted, out, old, ca, failed, say, logins)
        if s.manager == "dnf":
            got = _check_rpms(s, sources, got, out, failed, say, env)
            got += _keys(s, sources, out)
            if carried[0]:
                got.append(_modules_entry(s, out, carried[1]))
        for e in got:  # --since: what the older bundle already carried stays out of this one
            ref = f"{s.os}/{Path(str(e['file'])).name}"
            if not e.get("key") and not e.get("modules") and base_of.get(ref) == e["sha256"]:
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
        raise incomplete(PackageFailures, f"{len(failed)} OS package problem(s)", failed,
                         hint="check mirror.packageRepositories (URL, suite, components, key) and that the pinned "
                              "versions are there; run pull again: what the bundle holds is not fetched again")


def record_skipped(sets: Sequence[OsPackages], bundle: Path) -> None:
    """`mirror pull --skip-packages`: the lock says which roots were left out, per OS (nothing is fetched)."""
    lockfile.put_section(bundle, SET_KIND, SETS, [{"os": s.os, "manager": s.manager, "roots": [p.spec for p in s.packages],
                                                   **({"modules": list(s.modules)} if s.modules else {}),
                                                   "skipped": True} for s in sets], [])
    lockfile.put_section(bundle, KIND, PACKAGES, [], [])


def _fetch_all(s: OsPackages, wanted: Sequence[Mapping[str, Any]], out: Path, old: Mapping[str, PackageEntry],
               ca: Path | None, failed: list[Failure], say: Say, logins: Sequence[Login] = ()) -> list[PackageEntry]:
    """The files of wanted into out (what apt fetched already, or the older lock holds, is kept); logins go with the
    URLs under their repositories only (fetch)."""
    secrets = _secrets(logins)
    got = []
    for w in wanted:
        try:
            name = _safe(str(w["file"]))
        except ValueError as exc:
            failed.append({"ref": f"{s.os}/{w['file']}", "error": str(exc)})
            continue
        rel = f"{PACKAGES}/{s.os}/{name}"
        dest = out / name
        if (prev := reusable(old, rel, dest)) is not None:
            got.append(prev)
            continue
        if s.manager == "dnf" or not dest.is_file():  # apt fetched and checked its files already
            try:
                fetch(str(w["uri"]), dest, ca, logins)
            except (OSError, ValueError, ssl.SSLError) as exc:
                why = redact(f"{w['uri']}: {getattr(exc, 'reason', None) or exc}", secrets)
                failed.append({"ref": f"{s.os}/{name}", "error": why})
                say(f"packages {s.os}: {name}: FAILED: {redact(str(exc), secrets)}")
                continue
        digest = sha256_file(dest)
        if w["size"] is not None and dest.stat().st_size != w["size"]:
            dest.unlink()
            failed.append({"ref": f"{s.os}/{name}", "error": f"{dest.stat().st_size} bytes, the index says {w['size']}"})
            continue
        entry: PackageEntry = {"os": s.os, "manager": s.manager, "file": rel, "source": w["uri"], "sha256": digest,
                               "size": dest.stat().st_size}
        if s.manager == "apt":
            n, v, a = _deb_identity(name)
            entry.update({"name": n, "version": v, "arch": a})
        say(f"packages {s.os}: {name} ({entry['size']} bytes)")
        got.append(entry)
    return got


def _check_rpms(s: OsPackages, sources: Sequence[PackageSource], got: list[PackageEntry], out: Path,
                failed: list[Failure], say: Say, env: Mapping[str, str] | None = None) -> list[PackageEntry]:
    """Keep the rpms a key of this OS's repositories signed (the others are removed and named) with their identity.
    env: rpm's environment (default this process's)."""
    kept: list[PackageEntry] = []
    with _rpm_keyring([src.key for src in sources], env) as db:
        for e in got:
            path = out / str(e["file"]).rsplit("/", 1)[1]
            why = _rpm_signed(db, path, env)
            if why:
                path.unlink(missing_ok=True)
                failed.append({"ref": f"{s.os}/{path.name}", "error": why})
                say(f"packages {s.os}: {path.name}: REFUSED: {why}")
                continue
            kept.append(e)
    if kept:
        ids = _rpm_identity([out / str(e["file"]).rsplit("/", 1)[1] for e in kept], env)
        for e in kept:
            n, v, a = ids[str(e["file"]).rsplit("/", 1)[1]]
            e.update({"name": n, "version": v, "arch": a})
    return kept


def _keys(s: OsPackages, sources: Sequence[PackageSource], out: Path) -> list[PackageEntry]:
    """The dnf OS's upstream keys into the bundle (the nodes check the packages' signatures with them)."""
    (out / "keys").mkdir(exist_ok=True)
    entries: list[PackageEntry] = []
    for i, src in enumerate(sources):
        name = f"upstream{i}{''.join(src.key.suffixes[-1:]) or '.asc'}"
        dest = out / "keys" / name
        shutil.copyfile(src.key, dest)
        entries.append({"os": s.os, "manager": s.manager, "key": True, "file": f"{PACKAGES}/{s.os}/keys/{name}",
                        "source": str(src.key), "sha256": sha256_file(dest), "size": dest.stat().st_size})
    return entries
