"""The bundle's lock, bundle.lock.json (SCHEMA), and its checksum file: what `mirror pull` wrote, for push and verify.

One lock per bundle directory, with a section per artifact kind: "images" (installer.mirror.images), and the sections
the other kinds add through put_section ("charts", "files", "packages"). Failures of every kind share the "failed" list,
each entry with its "kind" (an entry without one is an image's). Only the orchestrating command (`mirror pull`) marks
a bundle complete, with finish(), after every kind it planned has run: a pull killed between two kinds leaves the
bundle incomplete, which push refuses. Every write rewrites the lock and then its checksum, each atomically, and
removes the lock's signature first: a lock is signed only as finish() wrote it.

The checksum file catches damage (a resumed pull, `sha256sum -c`); what the air-gapped side trusts is the signature,
bundle.lock.json.dsse: a DSSE envelope (installer.signing) whose payload is the exact bytes of the lock, signed at
finish() by the connected side's bundle key. signed_lock() verifies it against the public keys the site pinned
(mirror.trustedKeys, --trusted-key) and returns the lock parsed from the signed payload, never from the file beside it.

finish() also records when it signed ("created", UTC, RFC 3339): a signature does not expire, so an older genuinely
signed bundle of the same release would verify forever; check_bundle() (push and `mirror verify --bundle`) warns on a
bundle older than WARN_AGE_DAYS and refuses one older than mirror.maxBundleAge.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError, GpuInstallError
from installer.util import atomic_write

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.signing import SigningKey

SCHEMA = "gpu-install.bundle-lock/v1"
LOCK = "bundle.lock.json"
CHECKSUM = LOCK + ".sha256"
SIGNATURE = LOCK + ".dsse"
PAYLOAD_TYPE = "application/vnd.gpu-install.bundle-lock+json"
IMAGE = "image"
CREATED_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # RFC 3339, UTC, whole seconds: what finish() writes and nothing else
WARN_AGE_DAYS = 30  # a bundle older than this is named (and refused only past mirror.maxBundleAge)
MAX_AGE_FIELD = "mirror.maxBundleAge"
SKEW = timedelta(days=1)  # a lock "created" further ahead than this: one of the two clocks is wrong
FIRST_TIME = ("first time: on the connected side `gpu-install mirror pull` signs the lock and prints its key's fingerprint and "
              "where the public key is (<key home>/signing-key.pub.pem); carry that .pem across once, out of band, "
              "compare its fingerprint (openssl pkey -pubin -in FILE -outform DER | sha256sum) and list it in the "
              "site file under mirror.trustedKeys (or give --trusted-key FILE); see docs/airgap.md")


def lock_text(lock: Mapping[str, Any]) -> str:
    return json.dumps(lock, indent=2, sort_keys=False) + "\n"


def write_lock(bundle: Path, lock: Mapping[str, Any]) -> None:
    """The lock and its checksum file (sha256sum format), each written atomically; checksum last."""
    text = lock_text(lock)
    with contextlib.suppress(FileNotFoundError):
        (bundle / SIGNATURE).unlink()  # a signature is for the lock finish() signed, not for this one
    atomic_write(bundle / LOCK, text)
    atomic_write(bundle / CHECKSUM, f"{hashlib.sha256(text.encode()).hexdigest()}  {LOCK}\n")


def read_lock(bundle: Path, *, verify: bool = True) -> dict[str, Any]:
    """The bundle's lock; with verify its checksum must match (ConfigError, exit 2, naming the problem)."""
    lock_path, sum_path = bundle / LOCK, bundle / CHECKSUM
    hint = "pull the bundle again (gpu-install mirror pull) and carry the whole directory across"
    from installer import signing

    # bounded, a regular file only (never a FIFO, never read past the cap): the lock a resumed pull or a checksum
    # check reads is as untrusted as the signed one
    raw = signing.read_bounded(lock_path, signing.MAX_ENVELOPE_BYTES, "the bundle lock", hint)
    if verify:
        try:
            want = signing.read_bounded(sum_path, 4096, "the lock's checksum file", hint).decode(
                errors="replace").split()[0].lower()
        except IndexError:
            raise ConfigError(f"{sum_path}: the lock's checksum file is empty", hint=hint) from None
        got = hashlib.sha256(raw).hexdigest()
        if got != want:
            raise ConfigError(f"{lock_path}: checksum mismatch (sha256 {got}, {CHECKSUM} says {want}): the lock was "
                              "changed after pull", hint=hint)
    lock = _parse(lock_path, raw, hint)
    return lock


def catalog_record(plan: Plan) -> dict[str, Any]:
    """The catalog file the release was resolved from: name and sha256 (which pins every image of the release)."""
    path = Path(plan.release.catalog_dir) / f"{plan.release.version}.yaml"
    record: dict[str, Any] = {"release": plan.release.version, "file": path.name}
    with contextlib.suppress(OSError):
        record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return record



_VERIFIED: dict[Path, bytes] = {}  # bundle directory -> the lock payload signed_lock verified in this process


def signed_lock(bundle: Path, trusted: Sequence[Path]) -> dict[str, Any]:
    """The bundle's lock as its signature carries it: bundle.lock.json.dsse must verify against one of the trusted
    public keys (PEM files the site pinned) and bundle.lock.json must be the signed bytes; the lock is parsed from the
    verified payload. ConfigError (exit 2) naming the file and the keys otherwise: unsigned, signed by a key not
    pinned, changed after signing, or no key pinned at all."""
    from installer import signing

    pin_hint = FIRST_TIME
    keys = [(signing.load_public_key(p, pin_hint), str(p)) for p in dict.fromkeys(trusted)]
    if not keys:
        raise ConfigError(f"{bundle}: no bundle signing key is pinned on this side, so the bundle's lock cannot be "
                          "verified (mirror.trustedKeys in the site file, or --trusted-key FILE)", hint=pin_hint)
    sig_path, lock_path = bundle / SIGNATURE, bundle / LOCK
    again = ("pull the bundle again on the connected side (mirror pull signs its lock) and carry the whole directory; "
             "pin a new or changed key only after comparing its fingerprint out of band. " + FIRST_TIME)
    if not sig_path.exists() and not sig_path.is_symlink():
        raise ConfigError(f"{sig_path}: missing: the bundle is unsigned, nothing vouches for its lock", hint=again)
    data = signing.read_bounded(sig_path, signing.MAX_ENVELOPE_BYTES, "the lock's signature", again)
    payload, _key = signing.verify(data, keys, PAYLOAD_TYPE, source=sig_path, hint=again)
    raw = signing.read_bounded(lock_path, signing.MAX_ENVELOPE_BYTES, "the bundle lock", again)
    if raw != payload:
        raise ConfigError(f"{lock_path}: not the lock {SIGNATURE} signed (sha256 {hashlib.sha256(raw).hexdigest()}, "
                          f"signed {hashlib.sha256(payload).hexdigest()}): the lock was changed after signing",
                          hint=again)
    lock = _parse(lock_path, payload, again)
    _VERIFIED[bundle.resolve()] = payload
    return lock


def _parse(lock_path: Path, raw: bytes, hint: str) -> dict[str, Any]:
    from installer.safefile import json_value

    try:
        lock = json_value(raw)  # depth-bounded, a key given twice refused (json would keep the last one)
    except ValueError as exc:
        raise ConfigError(f"{lock_path}: not valid JSON ({exc})", hint=hint) from None
    if not isinstance(lock, dict) or lock.get("schema") != SCHEMA:
        raise ConfigError(f"{lock_path}: not a {SCHEMA} lock", hint=hint)
    return lock


def bundle_for_push(bundle: Path, trusted: Sequence[Path] | None = None, max_age: int | None = None) -> dict[str, Any]:
    """The signed lock (signed_lock) of a complete bundle, checked by check_bundle (exit 2 naming the problem
    otherwise; max_age: mirror.maxBundleAge). Without trusted, the lock this process verified for the bundle before
    (the command verifies once, with the pinned keys, before reading any credential; the steps after it take the lock
    from here, its completeness checked again, its age not), and a bundle not verified so far is refused."""
    if trusted is not None:
        lock = signed_lock(bundle, trusted)
        check_bundle(bundle, lock, max_age)
        return lock
    if bundle.resolve() not in _VERIFIED:
        raise ConfigError(f"{bundle}: the bundle's signature was not verified", hint=FIRST_TIME)
    lock = _parse(bundle / LOCK, _VERIFIED[bundle.resolve()], "")
    check_complete(bundle, lock)
    return lock


def check_complete(bundle: Path, lock: Mapping[str, Any], *, images_required: bool = False) -> None:
    """The (signed) lock is of a complete bundle: ConfigError (exit 2) otherwise, naming what the pull could not get
    (its "failed" entries, each source or reference bounded). Push and `mirror verify --bundle` both check this: an
    incomplete bundle is never pushed, and never verified green. images_required (verify, which reports the images
    it found): a lock with no image at all (neither carried nor in "base") is refused too -- every site's plan deploys
    images (the GPU Operator's own), so such a lock is no pull of a site's plan, and "all 0 images" is no finding."""
    hint = "run gpu-install mirror pull again on the connected side until it exits 0, and carry that bundle"
    if lock.get("complete") is not True:
        failed = [f for f in lock.get("failed") or [] if isinstance(f, dict)]
        names = [str(f.get("source") or f.get("ref"))[:200] for f in failed[:20]]
        more = f", and {len(failed) - 20} more" if len(failed) > 20 else ""
        what = f" (failed: {', '.join(names)}{more})" if names else " (its pull did not finish)"
        raise ConfigError(f"{bundle}: the bundle is incomplete{what}", hint=hint)
    images, base = lock.get("images"), lock.get("base") or []
    if not isinstance(images, list) or not isinstance(base, list):
        raise ConfigError(f"{bundle / LOCK}: no image list", hint=hint)
    if images_required and not images and not base:
        raise ConfigError(f"{bundle / LOCK}: the bundle carries no image (and builds on none): a site's plan always "
                          "has images, so this is not the pull of one", hint=hint)


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def created_now() -> str:
    """The current time as finish() records it in the lock's "created"."""
    return datetime.now(UTC).strftime(CREATED_FORMAT)


def check_age(bundle: Path, lock: Mapping[str, Any], max_age: int | None, *, now: datetime | None = None,
              warn: Callable[[str], None] = _warn) -> None:
    """The (signed) lock's "created" against now: warn (a line on stderr) when the bundle is older than WARN_AGE_DAYS,
    ConfigError (exit 2) naming its age and MAX_AGE_FIELD when it is older than max_age days. A lock without
    "created" (signed by an older gpu-install) is warned about, and refused only when max_age is set; a "created"
    that is not what finish() writes is refused; one more than SKEW ahead of this clock is warned about, and refused
    when max_age is set (it would keep the bundle young past its limit)."""
    now = now or datetime.now(UTC)
    where = f"{bundle / LOCK}"
    fix = ("pull a new bundle of this release on the connected side (gpu-install mirror pull) and carry it across"
           + (f", or raise {MAX_AGE_FIELD} in the site file" if max_age is not None else ""))
    raw = lock.get("created")
    if raw is None:
        if max_age is not None:
            raise ConfigError(f"{where}: the lock records no creation time (a bundle from an older gpu-install), so "
                              f"its age cannot be checked against {MAX_AGE_FIELD} ({max_age} days)", hint=fix)
        warn(f"{where}: the lock records no creation time (a bundle from an older gpu-install): its age is unknown; "
             f"pull a new bundle to have it checked ({MAX_AGE_FIELD} refuses such a bundle)")
        return
    try:
        if not isinstance(raw, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", raw):
            raise ValueError
        created = datetime.strptime(raw, CREATED_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise ConfigError(f"{where}: created {str(raw)[:60]!r} is not a UTC time as mirror pull writes it "
                          "(YYYY-MM-DDTHH:MM:SSZ)", hint=fix) from None
    age = now - created
    if age < -SKEW:
        line = (f"{where}: created {raw}, {-age.days} day(s) ahead of this machine's clock (now "
                f"{now.strftime(CREATED_FORMAT)}): the connected side's clock or this one is wrong")
        if max_age is not None:
            raise ConfigError(line + f", and the age cannot be checked against {MAX_AGE_FIELD}",
                              hint="set the wrong clock right and pull the bundle again")
        warn(line)
        return
    if max_age is not None and age > timedelta(days=max_age):
        raise ConfigError(f"{bundle}: the bundle is {age.days} days old (created {raw}), older than "
                          f"{MAX_AGE_FIELD} ({max_age} days): an old bundle may lack fixes the release got since",
                          hint=fix)
    if age > timedelta(days=WARN_AGE_DAYS):
        warn(f"{bundle}: the bundle is {age.days} days old (created {raw})"
             + (f"; {MAX_AGE_FIELD} refuses it past {max_age} days" if max_age is not None
                else f"; set {MAX_AGE_FIELD} in the site file to refuse bundles past an age"))


def check_bundle(bundle: Path, lock: Mapping[str, Any], max_age: int | None, *, now: datetime | None = None,
                 warn: Callable[[str], None] = _warn) -> None:
    """What push and `mirror verify --bundle` require of a signed lock before anything else: check_complete and
    check_age (max_age: mirror.maxBundleAge, days)."""
    check_complete(bundle, lock)
    check_age(bundle, lock, max_age, now=now, warn=warn)


def load_for_update(bundle: Path) -> dict[str, Any]:
    """The bundle's lock for a pull to resume from: verified by its checksum, else -- a pull killed between writing
    the lock and its checksum -- the lock as it reads (pull reuses an entry only after checking the layout holds that
    image whole, and a chart or file only after hashing it); {} for a new bundle or one whose lock cannot be read."""
    with contextlib.suppress(GpuInstallError):
        return read_lock(bundle, verify=True)
    with contextlib.suppress(GpuInstallError):
        return read_lock(bundle, verify=False)
    return {}


def put_section(bundle: Path, kind: str, section: str, entries: Sequence[Mapping[str, Any]],
                failed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Replace the lock's section (a list of entries) and the failures of kind with these; marks the bundle
    incomplete until finish(). The lock must exist (the images' pull writes its header first)."""
    lock = read_lock(bundle, verify=True)
    lock[section] = [dict(e) for e in entries]
    lock["failed"] = [f for f in lock.get("failed") or [] if isinstance(f, dict) and f.get("kind", IMAGE) != kind]
    lock["failed"] += [{"kind": kind, **f} for f in failed]
    lock["complete"] = False
    write_lock(bundle, lock)
    return lock


def finish(bundle: Path, key: SigningKey) -> dict[str, Any]:
    """Mark the bundle complete when no artifact of any kind failed (else incomplete), record the time ("created",
    created_now()) and sign the lock with key (the connected side's bundle key): SIGNATURE, a DSSE envelope of the
    lock's exact bytes. The lock, as written."""
    from installer import signing

    lock = read_lock(bundle, verify=True)
    lock["complete"] = not lock.get("failed")
    lock["created"] = created_now()
    write_lock(bundle, lock)
    raw = (bundle / LOCK).read_bytes()
    if raw != lock_text(lock).encode():
        raise ConfigError(f"{bundle / LOCK}: changed while it was being signed", hint="run mirror pull again")
    atomic_write(bundle / SIGNATURE, signing.sign(key, raw, PAYLOAD_TYPE).decode(), mode=0o644)
    return lock
