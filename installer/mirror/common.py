"""What every kind of the mirror (images, charts and files, OS packages) and `mirror verify` share: the site's
credentials as a temporary authfile and their redaction, the CA as a temporary cert dir, skopeo (the runner and the
one `skopeo copy` command line), fetching a file, reading the older lock of `--since`, keeping a path the lock names
inside the bundle, re-using what a bundle already holds, and the failure types with the "bundle is incomplete" raise.

It imports nothing of installer.mirror but the lock's file names (installer.mirror.bundle): the modules of the kinds
import it, never each other for these.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, TypedDict, TypeVar

from installer.errors import ConfigError, EnvironmentProblem, HostFailures
from installer.mirror.bundle import LOCK, SCHEMA
from installer.util import sha256_file

if TYPE_CHECKING:
    from installer.config import Site

Say = Callable[[str], None]

DEFAULT_JOBS = 4
DEFAULT_PLATFORM = "linux/amd64"
ALL_PLATFORMS = "all"
SKOPEO_TIMEOUT = 3600.0
INSPECT_TIMEOUT = 120.0

HINT_FORGED = ("the bundle's lock does not match what this site's plan pulls: pull the bundle again with this site's "
               "file (or check that the bundle comes from your connected side)")
HINT_DAMAGED = "the bundle was damaged in transit: pull it again and carry the whole directory"


# ---------------------------------------------------------------- failures


class TransferFailures(HostFailures):
    """Some images could not be copied (each named with skopeo's message); the others were. Exit code 4."""


class ChartFailures(HostFailures):
    """A chart or file could not be pulled or pushed (each named with the reason); exit 4."""


class PackageFailures(HostFailures):
    """An OS's closure could not be resolved, or a package could not be fetched or checked (each named); exit 4."""


class DiskFull(EnvironmentProblem):
    """The file system under the bundle is full (skopeo's or our own write: ENOSPC). Exit code 8."""


NO_SPACE = re.compile(r"no space left on device", re.IGNORECASE)


def disk_full(path: Path, need: int | None, what: str = "the images not pulled yet") -> DiskFull:
    """DiskFull naming path, the bytes free on its file system and, when known, the bytes what still needs."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    needs = f"; {what} need {need} bytes more ({need / 2**20:.1f} MiB)" if need else ""
    return DiskFull(f"{path}: no space left on device ({free} bytes free there{needs})",
                    hint="free space on that file system (or pull to a directory on a larger one with -o) and run "
                         "pull again: what the bundle already holds is kept and not copied again")


class Failure(TypedDict):
    """What a kind's pull could not bring: the reference and why (the lock's "failed" list, with the kind)."""

    ref: str
    error: str


F = TypeVar("F", bound=HostFailures)


def incomplete(kind: type[F], what: str, failed: Sequence[Failure], hint: str) -> F:
    """The failure of a kind's pull: what failed (each {ref, error}), the bundle left incomplete (push refuses it)."""
    return kind(f"{what}; the bundle is incomplete:\n" + "\n".join(f"  {f['ref']}: {f['error']}" for f in failed),
                hint=hint)


# ---------------------------------------------------------------- the bundle


E = TypeVar("E", bound=Mapping[str, Any])


def reusable(old: Mapping[str, E], rel: str, dest: Path) -> E | None:
    """The older lock's entry for bundle file rel when dest holds exactly it (its sha256): a re-run keeps it."""
    prev = old.get(rel)
    want = prev.get("sha256") if prev else None
    return prev if want and dest.is_file() and sha256_file(dest) == want else None


def inside_bundle(bundle: Path, rel: Any, what: str) -> Path:
    """bundle/rel for a path the lock names: relative, no '..', and -- symlinks resolved -- inside the bundle
    directory; ConfigError (exit 2) naming the entry otherwise."""
    text = rel if isinstance(rel, str) else ""
    parts = PurePosixPath(text).parts
    if not text or "\\" in text or "\0" in text or PurePosixPath(text).is_absolute() or ".." in parts:
        raise ConfigError(f"{bundle / LOCK}: {what} {str(rel)[:200]!r} is not a path inside the bundle",
                          hint=HINT_FORGED)
    path = bundle / text
    real, root = os.path.realpath(path), os.path.realpath(bundle)
    if os.path.commonpath([real, root]) != root:
        raise ConfigError(f"{bundle / LOCK}: {what} {text!r} leads outside the bundle (to {real})", hint=HINT_FORGED)
    return path


def open_part(tmp: Path) -> int:
    """A write descriptor on tmp, a .part name, created NEW: whatever lies there (a stale file of a killed run, a
    symlink someone planted) is removed first -- never followed, never written through -- and tmp is then created
    with O_CREAT|O_EXCL|O_NOFOLLOW (0644 less the umask). EnvironmentProblem (exit 8) when it cannot be, e.g. when
    something recreates the name in between."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise EnvironmentProblem(f"{tmp}: cannot create it new ({exc.strerror})",
                                 hint="check who else writes to that directory (a name there was recreated or is a "
                                      "directory) and run again") from None


@contextlib.contextmanager
def written_whole(dest: Path) -> Iterator[BinaryIO]:
    """A file object writing dest's content through .<name>.part, created new (open_part), moved onto dest when the
    block ends well and removed when it does not (an error, Ctrl-C): dest is never half written."""
    tmp = dest.with_name(f".{dest.name}.part")
    fd = open_part(tmp)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def copy_in(src: Path, dest: Path, sha256: str) -> bool:
    """Copy a verified file (push: the staged copy, never the bundle's) into a published repository unless it is
    there already (by sha256), through a .part name created new (written_whole); True when it was copied."""
    if dest.is_file() and sha256_file(dest) == sha256:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(dest) as out, open(src, "rb") as fh:
        shutil.copyfileobj(fh, out, 1 << 20)
    return True


def read_since(path: Path) -> tuple[dict[str, Any], str]:
    """The lock an incremental pull builds on, and its sha256 (checked against PATH.sha256 when that file is there)."""
    hint = "give the bundle.lock.json of the bundle last pushed to this site (copied back from the air-gapped side)"
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--since {path}: cannot read it ({exc.strerror})", hint=hint) from None
    sha = hashlib.sha256(raw).hexdigest()
    side = Path(f"{path}.sha256")
    if side.exists() and side.read_text().split()[:1] != [sha]:
        raise ConfigError(f"--since {path}: checksum mismatch with {side.name}: the lock was changed", hint=hint)
    try:
        lock = json.loads(raw)
    except ValueError:
        raise ConfigError(f"--since {path}: not valid JSON", hint=hint) from None
    if not isinstance(lock, dict) or lock.get("schema") != SCHEMA or not isinstance(lock.get("images"), list):
        raise ConfigError(f"--since {path}: not a {SCHEMA} lock", hint=hint)
    return lock, sha


#: (repository URL, user, password): HTTP Basic credentials fetch sends to URLs under that repository only
Login = tuple[str, str, str]


def fetch(source: str, dest: Path, ca: Path | None, logins: Sequence[Login] = ()) -> None:
    """A file from an http(s) URL (the system CAs and ca trusted), a file: URL (apt names local archives so) or a path
    on this machine, into dest atomically (through a .part name created new, written_whole: a killed fetch leaves no half
    file under dest, and a planted .part symlink is removed, never written through).

    logins: the Authorization: Basic header goes with a request -- the first one and any a redirect leads to -- only
    when its URL is under one of these repository URLs (same scheme, host and port, the path below the repository's;
    urllib's password manager decides, and sends it as an unredirected header): a redirect to another host, port,
    scheme or path never carries it. The password is in no message (urllib's errors name the URL and status only)."""
    with written_whole(dest) as out:
        if source.startswith("file:"):
            with open(urllib.parse.unquote(urllib.parse.urlparse(source).path), "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
        elif source.startswith(("http://", "https://")):
            ctx = ssl.create_default_context()
            if ca:
                ctx.load_verify_locations(cafile=str(ca))
            handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=ctx)]
            if logins:
                known = urllib.request.HTTPPasswordMgrWithPriorAuth()
                for url, user, password in logins:
                    known.add_password(None, url.rstrip("/") + "/", user, password, is_authenticated=True)
                handlers.append(urllib.request.HTTPBasicAuthHandler(known))
            with urllib.request.build_opener(*handlers).open(source, timeout=120) as resp:  # noqa: S310
                shutil.copyfileobj(resp, out, 1 << 20)
        else:
            with open(Path(source).expanduser(), "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)


# ---------------------------------------------------------------- credentials and CA


def credentials(site: Site) -> bytes | None:
    """The site registry's docker config.json from registry.pullSecret (env vars or file), or None without one."""
    from installer.kube import docker_config_json

    ps = site.registry.pullSecret
    return docker_config_json(site.registry) if ps and (ps.dockerConfigFile or ps.usernameEnv) else None


@contextlib.contextmanager
def cert_dir(ca: Path | None) -> Iterator[str | None]:
    """A temporary directory holding ca as ca.crt (what skopeo's --*-cert-dir reads), or None without a CA."""
    if ca is None:
        yield None
        return
    try:
        pem = Path(ca).read_bytes()
    except OSError as exc:
        raise ConfigError(f"CA file {ca}: cannot read it ({exc.strerror})", hint="check the path in the site file") from None
    with tempfile.TemporaryDirectory(prefix="gpu-install-certs-") as tmp:
        (Path(tmp) / "ca.crt").write_bytes(pem)
        yield tmp


@contextlib.contextmanager
def authfile(config_json: bytes | None) -> Iterator[str | None]:
    """A temporary 0600 auth file holding config_json (docker config.json), deleted afterwards; None without one."""
    if config_json is None:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="gpu-install-auth-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(config_json)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def secrets_of(config_json: bytes | None) -> list[str]:
    """Every secret string in a docker config.json (password, auth, identity and registry tokens -- not the user
    name, which is no secret): redacted from any message that could echo it."""
    if not config_json:
        return []
    try:
        doc = json.loads(config_json)
    except ValueError:
        return []
    out: list[str] = []
    for entry in (doc.get("auths") or {}).values() if isinstance(doc, dict) else ():
        if isinstance(entry, dict):
            out += [str(v) for k, v in entry.items() if k in ("password", "auth", "identitytoken", "registrytoken")
                    and v]
    return out


def redact(text: str, secrets: Sequence[str]) -> str:
    """text with every secret and every URL's user:password@ replaced with *** (installer.jsonout.hide: a secret
    shorter than MIN_EMBEDDED characters only as a whole word)."""
    from installer.jsonout import hide

    return hide(text, secrets)


# ---------------------------------------------------------------- skopeo


def skopeo() -> str:
    path = shutil.which("skopeo")
    if path is None:
        raise EnvironmentProblem("skopeo is not installed: `gpu-install mirror` copies images with it",
                                 hint="install it (Debian/Ubuntu: apt-get install skopeo; RHEL: dnf install skopeo)")
    return path


# Go's crypto/x509 on a certificate out of its dates: "current time <now> is after <notAfter>" (expired) or "is
# before <notBefore>" (not valid yet: this machine's clock is behind, or the certificate was issued ahead of time)
_CERT_DATES = re.compile(r"x509: certificate has expired or is not yet valid: current time (\S+) is (after|before) "
                         r"(\S+)")
_TLS_HOST = re.compile(r'(?:pinging container registry |https://)([^/\s:"]+(?::\d+)?)')


def cert_dates_problem(text: str) -> str | None:
    """What a TLS failure over a certificate's dates means, naming the registry host, the certificate's date and this
    machine's time, and the fix; None for any other message."""
    m = _CERT_DATES.search(text)
    if m is None:
        return None
    now, side, date = m.groups()
    h = _TLS_HOST.search(text)
    host = h.group(1) if h else "the registry"
    if side == "after":
        return (f"the certificate of {host} expired on {date} (this machine's time is {now}): renew the registry's "
                "certificate; if it has not expired, this machine's clock is ahead: set it right (NTP)")
    return (f"the certificate of {host} is valid only from {date} and this machine's time is {now}: this machine's "
            "clock is behind (set it right: NTP, e.g. chronyc makestep) or the certificate was issued with a start "
            "date in the future (reissue it)")


def skopeo_message(stderr: str, secrets: Sequence[str]) -> str:
    """skopeo's own message, without its log prefix (time="…" level=fatal msg="…"); a certificate out of its dates
    explained (cert_dates_problem)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else "(no message)"
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', text)
    if m:
        text = m.group(1).replace('\\"', '"')
    dates = cert_dates_problem(text)
    return redact(f"{dates} ({text})" if dates else text, secrets)[:2000]


def run_skopeo(argv: list[str], secrets: Sequence[str] = (), timeout: float = SKOPEO_TIMEOUT) -> tuple[int, str, str]:
    """(exit code, stdout, skopeo's message with the secrets redacted); 124 when it ran past timeout."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, "", f"skopeo did not finish in {timeout:.0f}s"
    out = proc.stdout.decode(errors="replace")
    return proc.returncode, out, skopeo_message(proc.stderr.decode(errors="replace"), secrets)


def copy_argv(src: str, dest: str, *, platform: str | None = None, digestfile: Path | None = None,
              src_certs: str | None = None, dest_certs: str | None = None, dest_auth: str | None = None,
              dest_tls: bool = True) -> list[str]:
    """`skopeo copy` of src to dest, digests preserved: platform ALL_PLATFORMS copies a manifest list / index whole,
    OS/ARCH[/VARIANT] that platform's instance, None leaves the choice to skopeo (a `dir:` source holds one manifest);
    the digest written to digestfile; the cert dirs and the authfile as cert_dir and authfile made them."""
    argv = [skopeo(), "copy", "--quiet", "--preserve-digests", "--retry-times", "2"]
    if digestfile is not None:
        argv += ["--digestfile", str(digestfile)]
    if platform == ALL_PLATFORMS:
        argv += ["--all"]
    elif platform is not None:
        os_, _, arch = platform.partition("/")
        arch, _, variant = arch.partition("/")
        argv += ["--override-os", os_, "--override-arch", arch] + (["--override-variant", variant] if variant else [])
    argv += ["--src-cert-dir", src_certs] if src_certs else []
    argv += ["--dest-cert-dir", dest_certs] if dest_certs else []
    argv += ["--dest-authfile", dest_auth] if dest_auth else []
    argv += [] if dest_tls else ["--dest-tls-verify=false"]
    return [*argv, src, dest]


def raw_manifest(ref: str, *, cert: str | None = None, auth: str | None = None, tls_verify: bool = True,
                 secrets: Sequence[str] = ()) -> tuple[bytes | None, str]:
    """(the raw manifest at docker://ref, "") or (None, skopeo's message)."""
    argv = [skopeo(), "inspect", "--raw", "--retry-times", "2"]
    if cert:
        argv += ["--cert-dir", cert]
    if auth:
        argv += ["--authfile", auth]
    if not tls_verify:
        argv += ["--tls-verify=false"]
    try:
        proc = subprocess.run([*argv, f"docker://{ref}"], capture_output=True, timeout=INSPECT_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"skopeo inspect did not finish in {INSPECT_TIMEOUT:.0f}s"
    if proc.returncode != 0:
        return None, skopeo_message(proc.stderr.decode(errors="replace"), secrets)
    return proc.stdout, ""


def manifest_digest(ref: str, *, cert: str | None = None, auth: str | None = None, tls_verify: bool = True,
                    secrets: Sequence[str] = ()) -> tuple[str | None, str]:
    """(sha256:… of the raw manifest at docker://ref, "") or (None, skopeo's message)."""
    raw, err = raw_manifest(ref, cert=cert, auth=auth, tls_verify=tls_verify, secrets=secrets)
    return (None, err) if raw is None else ("sha256:" + hashlib.sha256(raw).hexdigest(), "")
