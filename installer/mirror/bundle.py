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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
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
    try:
        raw = lock_path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{lock_path}: cannot read the bundle lock ({exc.strerror})", hint=hint) from None
    if verify:
        try:
            want = sum_path.read_text().split()[0].lower()
        except (OSError, IndexError):
            raise ConfigError(f"{sum_path}: the lock's checksum file is missing or empty", hint=hint) from None
        got = hashlib.sha256(raw).hexdigest()
        if got != want:
            raise ConfigError(f"{lock_path}: checksum mismatch (sha256 {got}, {CHECKSUM} says {want}): the lock was "
                              "changed after pull", hint=hint)
    try:
        lock = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{lock_path}: not valid JSON", hint=hint) from None
    if not isinstance(lock, dict) or lock.get("schema") != SCHEMA:
        raise ConfigError(f"{lock_path}: not a {SCHEMA} lock", hint=hint)
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
    try:
        lock = json.loads(raw)
    except (ValueError, RecursionError):
        raise ConfigError(f"{lock_path}: not valid JSON", hint=hint) from None
    if not isinstance(lock, dict) or lock.get("schema") != SCHEMA:
        raise ConfigError(f"{lock_path}: not a {SCHEMA} lock", hint=hint)
    return lock


def bundle_for_push(bundle: Path, trusted: Sequence[Path] | None = None) -> dict[str, Any]:
    """The signed lock (signed_lock) of a complete bundle (exit 2 naming the problem otherwise). Without trusted, the
    lock this process verified for the bundle before (the command verifies once, with the pinned keys, before reading
    any credential; the steps after it take the lock from here), and a bundle not verified so far is refused."""
    if trusted is not None:
        lock = signed_lock(bundle, trusted)
    elif bundle.resolve() in _VERIFIED:
        lock = _parse(bundle / LOCK, _VERIFIED[bundle.resolve()], "")
    else:
        raise ConfigError(f"{bundle}: the bundle's signature was not verified", hint=FIRST_TIME)
    if lock.get("complete") is not True:
        failed = [str(f.get("source") or f.get("ref")) for f in lock.get("failed") or [] if isinstance(f, dict)]
        raise ConfigError(f"{bundle}: the bundle is incomplete" + (f" (failed: {', '.join(failed)})" if failed else ""),
                          hint="run gpu-install mirror pull again on the connected side until it exits 0")
    images = lock.get("images")
    if not isinstance(images, list):
        raise ConfigError(f"{bundle / LOCK}: no image list")
    return lock


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
    """Mark the bundle complete when no artifact of any kind failed (else incomplete) and sign the lock with key (the
    connected side's bundle key): SIGNATURE, a DSSE envelope of the lock's exact bytes. The lock, as written."""
    from installer import signing

    lock = read_lock(bundle, verify=True)
    lock["complete"] = not lock.get("failed")
    write_lock(bundle, lock)
    raw = (bundle / LOCK).read_bytes()
    if raw != lock_text(lock).encode():
        raise ConfigError(f"{bundle / LOCK}: changed while it was being signed", hint="run mirror pull again")
    atomic_write(bundle / SIGNATURE, signing.sign(key, raw, PAYLOAD_TYPE).decode(), mode=0o644)
    return lock
