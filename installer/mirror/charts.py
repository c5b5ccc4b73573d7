"""`mirror pull` / `mirror push` for the chart and the files (the driver runfile): helm and HTTP do the transfers,
this module verifies and records.

pull: the plan's GPU Operator chart with `helm pull` (an http(s) chart repository or oci://, site
`mirror.chartRepository`; `mirror.upstreamCa` as helm's --ca-file) into BUNDLE/charts/<name>-<version>.tgz -- checked
to BE that chart (Chart.yaml name and version inside the archive) -- and the plan's files (an http(s) URL or a path on
this machine; `mirror.upstreamCa` trusted for https) into BUNDLE/files/<name>, checked against the site's sha256 where
it gives one. Each is recorded in the lock (sections "charts" and "files") with its sha256 and size; a re-run skips
what the bundle already holds with that sha256. helm runs with its config, cache and data in a temporary directory:
the user's repositories and registry logins are neither used nor changed.

push: before anything is pushed, every chart and file of the lock is read once from the bundle and copied, while it
is hashed, into push's private staging directory (installer.mirror.staging), and the copy matched with the lock's
sha256 and size (a damaged or tampered one is refused, naming it); from then on only the staged copy is used -- helm
pushes it, the repository gets it --, never the bundle's file again. Then the chart goes into registry.host as an OCI
artifact,
oci://<registry.host>/<registry.prefix>/charts/<name>:<version> (registry.ca as --ca-file; the site credentials in
a temporary 0600 registry config, never on a command line), verified by pulling it back (same sha256); one already
there with the same sha256 is not pushed again. With --repo-dir DIR the chart also goes into a static chart
repository DIR/charts/ (the .tgz + index.yaml from `helm repo index`) any web server can serve, and the files into
DIR/files/ with DIR/files/SHA256SUMS.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import ssl
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError, EnvironmentProblem
from installer.mirror import bundle as lockfile
from installer.mirror.common import (
    HINT_DAMAGED,
    HINT_FORGED,
    Say,
    copy_in,
    incomplete,
    redact,
    reusable,
    secrets_of,
)
from installer.mirror.common import ChartFailures as ChartFailures
from installer.mirror.common import fetch as fetch
from installer.mirror.lock import (
    CHARTS,
    FILES,
    ChartEntry,
    Failure,
    FileEntry,
    chart_entry,
    check_charts,
    file_entry,
    safe_name,
)
from installer.mirror.staging import Staging, staging
from installer.patterns import strip_userinfo
from installer.util import sha256_file

if TYPE_CHECKING:
    from installer.config import Site
    from installer.mirror.plan import ChartArtifact, FileArtifact
    from installer.plan import Plan

sha256_of = sha256_file  # the name the push, verify and tests call

HELM_TIMEOUT = 600.0
MAX_CHART_YAML = 1 << 20
MAX_CHART_BYTES = 100 << 20  # helm's MaxDecompressedChartSize: the most a chart archive unpacks to


# ---------------------------------------------------------------- helm


@contextlib.contextmanager
def helm_env() -> Iterator[dict[str, str]]:
    """helm's environment with its own config/cache/data directories (the user's are left alone)."""
    with tempfile.TemporaryDirectory(prefix="gpu-install-helm-") as tmp:
        env = {**os.environ, "HELM_CONFIG_HOME": f"{tmp}/config", "HELM_CACHE_HOME": f"{tmp}/cache",
               "HELM_DATA_HOME": f"{tmp}/data", "HELM_REGISTRY_CONFIG": f"{tmp}/config/registry/config.json"}
        yield env


def _helm(argv: Sequence[str], env: Mapping[str, str], secrets: Sequence[str] = ()) -> tuple[int, str]:
    from installer.tools import ensure_helm

    try:
        proc = subprocess.run([str(ensure_helm()), *argv], capture_output=True, text=True, env=dict(env),
                              timeout=HELM_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, f"helm {argv[0]} did not finish in {HELM_TIMEOUT:.0f}s"
    text = (proc.stderr or proc.stdout).strip().splitlines()
    msg = redact(text[-1] if text else "(no message)", secrets)
    return proc.returncode, msg.removeprefix("Error: ")[:2000]


def chart_identity(tgz: Path) -> tuple[str, str]:
    """(name, version) from the Chart.yaml at the top of a chart archive -- the file helm reads -- checked before
    anything uses them; ValueError saying what is wrong otherwise (the callers name the chart). The archive holds
    exactly one <dir>/Chart.yaml (helm merges every one it finds, so a second could rename the chart helm pushes),
    and at most MAX_CHART_BYTES unpacked (helm's own limit); Chart.yaml is read to at most MAX_CHART_YAML bytes and
    parsed strictly (installer.safefile.parse_yaml: duplicate keys and any YAML alias refused, so a "billion laughs"
    document is refused as it is read instead of expanding); name is a string of helm's name rule
    (installer.mirror.lock.CHART_NAME) and version a SemVer string (CHART_VERSION) of at most 128 characters."""
    from installer.errors import GpuInstallError
    from installer.mirror.lock import CHART_NAME, CHART_VERSION
    from installer.safefile import parse_yaml

    found: list[tuple[str, bytes]] = []
    unpacked = 0
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            for member in tar:
                unpacked += max(member.size, 0)
                if unpacked > MAX_CHART_BYTES:
                    raise ValueError(f"an archive of more than {MAX_CHART_BYTES} bytes unpacked (helm refuses it)")
                # helm drops the first path component and cleans the rest: a/./Chart.yaml is its Chart.yaml too
                rest = member.name.replace("\\", "/").split("/", 1)[1:]
                if not rest or posixpath.normpath(rest[0]) != "Chart.yaml" or member.isdir():
                    continue
                if not member.isfile() or member.size > MAX_CHART_YAML:
                    raise ValueError(f"{member.name[:200]}: not a file of at most {MAX_CHART_YAML} bytes")
                fh = tar.extractfile(member)
                data = fh.read(MAX_CHART_YAML + 1) if fh else b""
                found.append((member.name[:200], data[:MAX_CHART_YAML + 1]))
                if len(found) > 1:
                    raise ValueError(f"two Chart.yaml files ({found[0][0]}, {found[1][0]}): helm would merge them")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"not a chart archive ({str(exc)[:200]})") from None
    if not found:
        raise ValueError("no Chart.yaml at the top of the archive")
    where, data = found[0]
    try:
        doc = parse_yaml(data.decode("utf-8"), where, aliases=False)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except GpuInstallError as exc:
        raise ValueError(exc.message) from None
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: not a mapping")
    name, version = doc.get("name"), doc.get("version")
    if not isinstance(name, str) or not CHART_NAME.fullmatch(name):
        raise ValueError(f"{where}: name {_shown(name)} is not a chart name (a string of lower-case letters, digits "
                         "and '-', at most 63)")
    if not isinstance(version, str) or len(version) > 128 or not CHART_VERSION.fullmatch(version):
        raise ValueError(f"{where}: version {_shown(version)} is not a SemVer version string (at most 128 "
                         "characters)")
    return name, version


def _shown(value: Any) -> str:
    """A Chart.yaml value in a message: a string's repr cut to 100 characters, anything else by its type only (its
    repr could be any size)."""
    return repr(value[:100]) if isinstance(value, str) else f"of type {type(value).__name__}"


def oci_ref(site: Site, name: str) -> str:
    """Where push puts the chart in the site registry: oci://<host>/<prefix>/charts/<name> (the tag is the chart's
    version). This is what `operator.chart` can name on the air-gapped side."""
    prefix = site.registry.prefix.strip("/") if getattr(site.registry, "prefix", None) else ""
    return f"oci://{site.registry.host}/{prefix + '/' if prefix else ''}{CHARTS}/{name}"


# ---------------------------------------------------------------- pull


#: the name helm knows a chart repository with credentials by, in the repositories file of its temporary home
UPSTREAM_REPO = "gpu-install-upstream"


def chart_login(site: Site) -> tuple[str, str] | None:
    """(user, password) for mirror.chartRepository from the environment variables mirror.chartCredentials names;
    None without that field. ConfigError (exit 2) naming a variable that is not set."""
    cred = site.mirror.chartCredentials
    if cred is None:
        return None
    values = []
    for field, name in (("usernameEnv", cred.usernameEnv), ("passwordEnv", cred.passwordEnv)):
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"mirror.chartCredentials.{field}: environment variable {name} is not set",
                              hint=f"export {name} with the chart repository's "
                                   f"{'user name' if field == 'usernameEnv' else 'password/token'}")
        values.append(value)
    return values[0], values[1]


def _private_file(path: Path, data: bytes) -> None:
    """data into a new file only this user can read (0600, O_CREAT|O_EXCL|O_NOFOLLOW: never one planted there)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def login_files(repository: str, login: tuple[str, str], ca: Path | None, env: Mapping[str, str]) -> list[str]:
    """The chart repository's credentials where helm reads them in its temporary home (helm_env), 0600 files, never
    its command line: an http(s) repository as the entry UPSTREAM_REPO of its repositories file (helm pull
    UPSTREAM_REPO/<chart> after `helm repo update`), an oci:// one as its registry config (docker config.json).
    Returns the secrets to hide from helm's messages."""
    import base64
    import json

    import yaml

    user, password = login
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    if repository.startswith("oci://"):
        host = repository[len("oci://"):].split("/", 1)[0]
        _private_file(Path(env["HELM_REGISTRY_CONFIG"]), json.dumps({"auths": {host: {"auth": auth}}}).encode())
    else:
        entry = {"name": UPSTREAM_REPO, "url": repository, "username": user, "password": password,
                 "caFile": str(ca) if ca else "", "certFile": "", "keyFile": "", "insecure_skip_tls_verify": False,
                 "pass_credentials_all": False}
        _private_file(Path(env.get("HELM_REPOSITORY_CONFIG") or f"{env['HELM_CONFIG_HOME']}/repositories.yaml"),
                      yaml.safe_dump({"apiVersion": "", "repositories": [entry]}).encode())
    return [password, auth]


def _pull_chart(c: ChartArtifact, dest: Path, ca: Path | None, env: Mapping[str, str],
                secrets: Sequence[str] | None = None) -> str | None:
    """helm pull c into dest; None when done, else why not. secrets: c's repository is logged in (login_files),
    these are hidden from helm's messages."""
    with tempfile.TemporaryDirectory(prefix="gpu-install-chart-", dir=dest.parent) as tmp:
        named = secrets is not None and not c.oci  # the repositories file's entry, which holds the credentials
        argv = ["pull", f"{c.repository}/{c.name}" if c.oci else f"{UPSTREAM_REPO}/{c.name}" if named else c.name,
                "--version", c.version, "--destination", tmp]
        if not c.oci and not named:
            argv += ["--repo", c.repository]
        if ca:
            argv += ["--ca-file", str(ca)]
        if named:
            rc, msg = _helm(["repo", "update", UPSTREAM_REPO], env, secrets or ())
            if rc != 0:
                return strip_userinfo(msg)
        rc, msg = _helm(argv, env, secrets or ())
        if rc != 0:
            return strip_userinfo(msg)
        got = list(Path(tmp).glob("*.tgz"))
        if len(got) != 1:
            return f"helm pull wrote {len(got)} archives"
        try:
            name, version = chart_identity(got[0])
        except ValueError as exc:
            return f"what the repository served is {exc}"
        if (name, version) != (c.name, c.version):
            return f"the repository served chart {name} {version}, not {c.name} {c.version}"
        os.replace(got[0], dest)
    return None


def pull(plan: Plan, charts: Sequence[ChartArtifact], files: Sequence[FileArtifact], bundle: Path,
         say: Say = lambda m: None) -> None:
    """The plan's charts and files into the bundle and its lock (sections charts, files). Raises ChartFailures
    (exit 4) naming what failed, after trying everything; the bundle stays incomplete then."""
    site = plan.site
    ca = site.mirror.upstreamCa
    lock = lockfile.load_for_update(bundle)
    old: dict[str, Any] = {str(e.get("file")): e for e in [*(lock.get(CHARTS) or []), *(lock.get(FILES) or [])]
                           if isinstance(e, dict)}
    (bundle / CHARTS).mkdir(exist_ok=True)
    failed: dict[str, list[Failure]] = {"chart": [], "file": []}
    chart_entries: list[ChartEntry] = []
    file_entries: list[FileEntry] = []
    def kept(rel: str, into: list[Any], what: str) -> bool:
        """Whether the bundle holds rel as the older lock has it (sha256): its entry is kept, nothing fetched."""
        prev = reusable(old, rel, bundle / rel)
        if prev is not None:
            into.append(prev)
            say(f"{what}: already in the bundle")
        return prev is not None

    login = chart_login(site)
    cred = site.mirror.chartCredentials
    with helm_env() as helm_vars:
        # helm never sees the credential variables: it reads the credentials from the 0600 files of login_files
        env = {k: v for k, v in helm_vars.items() if not cred or k not in (cred.usernameEnv, cred.passwordEnv)}
        secrets = login_files(site.mirror.chartRepository, login, ca, env) if login else None
        for c in charts:
            rel = f"{CHARTS}/{safe_name(c.file, 'chart file')}"
            dest = bundle / rel
            if kept(rel, chart_entries, f"chart {c.name} {c.version}"):
                continue
            shown = strip_userinfo(c.repository)  # printed and recorded: never a URL's user:password@
            say(f"chart {c.name} {c.version}: helm pull from {shown}")
            why = _pull_chart(c, dest, ca, env, secrets if c.repository == site.mirror.chartRepository else None)
            if why:
                failed["chart"].append({"ref": strip_userinfo(c.ref), "error": why})
                say(f"chart {c.name} {c.version}: FAILED: {why}")
                continue
            chart_entries.append({"name": c.name, "version": c.version, "repository": shown, "file": rel,
                                  "sha256": sha256_of(dest), "size": dest.stat().st_size})
    for f in files:
        rel = f"{FILES}/{safe_name(f.name, 'file name')}"
        dest = bundle / rel
        if kept(rel, file_entries, f"file {f.name}"):
            continue
        dest.parent.mkdir(exist_ok=True)
        source = strip_userinfo(f.source)  # printed and recorded: never a URL's user:password@
        say(f"file {f.name}: from {source}")
        try:
            fetch(f.source, dest, ca)
        except (OSError, ValueError, ssl.SSLError) as exc:
            failed["file"].append({"ref": source, "error": strip_userinfo(str(getattr(exc, "reason", None) or exc))})
            say(f"file {f.name}: FAILED: {exc}")
            continue
        digest = sha256_of(dest)
        if f.sha256 and digest != f.sha256.lower():
            dest.unlink()
            failed["file"].append({"ref": source, "error": f"sha256 {digest}, the site file says {f.sha256}"})
            say(f"file {f.name}: FAILED: sha256 mismatch")
            continue
        file_entries.append({"name": f.name, "source": source, "file": rel, "sha256": digest,
                             "size": dest.stat().st_size})
    lockfile.put_section(bundle, "chart", CHARTS, chart_entries, failed["chart"])
    lockfile.put_section(bundle, "file", FILES, file_entries, failed["file"])
    bad = failed["chart"] + failed["file"]
    if bad:
        raise incomplete(ChartFailures, f"{len(bad)} chart(s)/file(s) could not be pulled", bad,
                         hint="check mirror.chartRepository (and that the release's chart version is there), the "
                              "runfile URL and mirror.upstreamCa; run pull again: what the bundle holds is not "
                              "fetched again")


# ---------------------------------------------------------------- push


@dataclass(frozen=True)
class StagedCharts:
    """The lock's charts and files (checked entries), each with its staged copy: what push and publish use."""

    charts: list[tuple[ChartEntry, Path]]
    files: list[tuple[FileEntry, Path]]


def needs(lock: Mapping[str, Any]) -> int:
    """The bytes staging the lock's charts and files takes (their sizes in the lock)."""
    return sum(e["size"] for e in [*(lock.get(CHARTS) or []), *(lock.get(FILES) or [])]
               if isinstance(e, dict) and isinstance(e.get("size"), int) and e["size"] > 0)


def stage(bundle: Path, lock: Mapping[str, Any], site: Site | None, into: Staging) -> StagedCharts:
    """Every chart and file of the lock (check_charts first, with site) staged: read once from the bundle, copied while
    hashed, matched with the lock's sha256 and size (Staging.take); a chart archive is then checked to be the chart
    its entry names, read from the staged copy. ConfigError (exit 2) naming the first that is not."""
    if site is not None:
        check_charts(site, bundle, lock)
    charts: list[tuple[ChartEntry, Path]] = []
    for e in lock.get(CHARTS) or []:
        chart = chart_entry(bundle, e)
        rel = chart["file"]
        path = into.take(bundle, rel, e.get("sha256"), e.get("size"), f"{CHARTS} entry")
        try:
            identity = chart_identity(path)
        except ValueError as exc:
            raise ConfigError(f"{bundle}: {rel}: {exc}", hint=HINT_DAMAGED) from None
        if identity != (e.get("name"), e.get("version")):
            raise ConfigError(f"{bundle}: {rel}: the archive is chart {identity[0][:100]} {identity[1][:100]}, "
                              f"the lock says {e.get('name')} {e.get('version')}", hint=HINT_FORGED)
        charts.append((chart, path))
    files: list[tuple[FileEntry, Path]] = []
    for e in lock.get(FILES) or []:
        file = file_entry(bundle, e)
        files.append((file, into.take(bundle, file["file"], e.get("sha256"), e.get("size"), f"{FILES} entry")))
    return StagedCharts(charts, files)


@contextlib.contextmanager
def _registry_config(config_json: bytes | None, env: Mapping[str, str]) -> Iterator[None]:
    """The site credentials as helm's registry config (docker config.json format), 0600, in helm's temp dir."""
    if config_json:
        path = Path(env["HELM_REGISTRY_CONFIG"])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(config_json)
    yield


def push(site: Site, bundle: Path, lock: Mapping[str, Any], *, config_json: bytes | None, repo_dir: Path | None,
         say: Say = lambda m: None, staged: StagedCharts | None = None, staging_dir: Path | None = None) -> list[str]:
    """The charts into the site registry (and repo_dir), the files into repo_dir, each from its STAGED copy (stage:
    read once from the bundle, matched with the lock); what was done, as lines. staged: what `mirror push` staged
    with the images and packages; else staged here, under staging_dir, removed afterwards. Raises ChartFailures
    (exit 4)."""
    if staged is None:
        with staging(staging_dir, bundle) as into:
            return push(site, bundle, lock, config_json=config_json, repo_dir=repo_dir, say=say,
                        staged=stage(bundle, lock, site, into))
    reg = site.registry
    secrets = secrets_of(config_json)
    done: list[str] = []
    failed: list[str] = []
    with helm_env() as env, _registry_config(config_json, env):
        tls = ["--ca-file", str(reg.ca)] if reg.ca else []
        if reg.insecure:
            tls = ["--insecure-skip-tls-verify"]
        for e, tgz in staged.charts:
            ref = oci_ref(site, str(e["name"]))
            with tempfile.TemporaryDirectory(prefix="gpu-install-chart-") as tmp:
                rc, _ = _helm(["pull", ref, "--version", str(e["version"]), "--destination", tmp, *tls], env, secrets)
                there = next(iter(Path(tmp).glob("*.tgz")), None) if rc == 0 else None
                if there is not None and sha256_of(there) == e["sha256"]:
                    say(f"chart {ref}:{e['version']}: already there")
                    done.append(f"chart {ref}:{e['version']} already there")
                    continue
                say(f"chart {ref}:{e['version']}: helm push")
                rc, msg = _helm(["push", str(tgz), ref.rsplit("/", 1)[0], *tls], env, secrets)
                if rc != 0:
                    failed.append(f"chart {e['name']} {e['version']} to {ref}: {msg}")
                    continue
                check = Path(tmp) / "check"
                check.mkdir()
                rc, msg = _helm(["pull", ref, "--version", str(e["version"]), "--destination", str(check), *tls], env,
                                secrets)
                back = next(iter(check.glob("*.tgz")), None) if rc == 0 else None
                if back is None or sha256_of(back) != e["sha256"]:
                    failed.append(f"chart {ref}:{e['version']}: pulled back " + (
                        f"with sha256 {sha256_of(back)}" if back else f"nothing ({msg})") + f", the bundle has "
                        f"{e['sha256']}")
                    continue
                done.append(f"chart {ref}:{e['version']} pushed")
    if repo_dir is not None:
        done += publish(staged, repo_dir, say)
    if failed:
        raise ChartFailures(f"{len(failed)} chart(s) could not be pushed to {reg.host}:\n"
                            + "\n".join(f"  {f}" for f in failed),
                            hint="check registry.host, the credentials registry.pullSecret names (they need push "
                                 "rights) and registry.ca; run push again")
    return done


def publish(staged: StagedCharts, repo_dir: Path, say: Say = lambda m: None) -> list[str]:
    """The staged charts into repo_dir/charts (+ index.yaml), the staged files into repo_dir/files (+ SHA256SUMS),
    copied from the staging directory (never from the bundle); unchanged ones stay."""
    done: list[str] = []
    changed_charts = False
    charts = [e for e, _ in staged.charts]
    files = [e for e, _ in staged.files]
    items: Sequence[tuple[ChartEntry, Path] | tuple[FileEntry, Path]]
    for section, items in ((CHARTS, staged.charts), (FILES, staged.files)):
        if not items:
            continue
        out = repo_dir / section
        out.mkdir(parents=True, exist_ok=True)
        for e, copy in items:
            name = e["file"].split("/", 1)[1]
            dest = out / name
            if not copy_in(copy, dest, e["sha256"]):
                continue
            changed_charts |= section == CHARTS
            done.append(f"{section[:-1]} {dest}")
            say(f"{section[:-1]} {name}: into {out}")
    if charts and (changed_charts or not (repo_dir / CHARTS / "index.yaml").is_file()):
        with helm_env() as env:
            rc, msg = _helm(["repo", "index", str(repo_dir / CHARTS)], env)
        if rc != 0:
            raise EnvironmentProblem(f"helm repo index {repo_dir / CHARTS}: {msg}")
        done.append(f"index {repo_dir / CHARTS / 'index.yaml'}")
    if files:
        sums = repo_dir / FILES / "SHA256SUMS"
        known = {}
        if sums.is_file():
            for line in sums.read_text().splitlines():
                digest, _, name = line.partition("  ")
                if name:
                    known[name] = digest
        known.update({str(e["file"]).split("/", 1)[1]: str(e["sha256"]) for e in files})
        text = "".join(f"{d}  {n}\n" for n, d in sorted(known.items()))
        if not sums.is_file() or sums.read_text() != text:
            from installer.util import atomic_write

            atomic_write(sums, text)
    return done
