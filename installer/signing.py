"""Signing what gpu-install hands across a trust boundary, and verifying it on the other side: Ed25519 or ECDSA P-256
keys and DSSE envelopes (securesystemslib's CryptoSigner, SSlibKey and dsse.Envelope, pyca/cryptography underneath).
The bundle lock is signed with an Ed25519 key (ED25519), the install evidence with an ECDSA P-256 key (ECDSA_P256:
ecdsa-sha2-nistp256, the scheme cosign verifies, the signature DER-encoded); both keys are kept the same way.

A key home holds one key pair, generated on first use and kept: the private key as PKCS#8 PEM (PRIVATE, mode 0600,
created with O_CREAT|O_EXCL and linked into place whole) and its public half as SubjectPublicKeyInfo PEM (PUBLIC), the
file the other side pins. The home is the current user's own (private_home: created 0700 when missing; an existing one
that is a symlink, belongs to someone else or is open to group or others is refused, never repaired), and so is the
private key file: a key someone else could have put there is never used. The site's GnuPG home is held to the same
rules (gnupg_home). A key's fingerprint, its keyid in every envelope, is the sha256 of its DER
SubjectPublicKeyInfo -- what `openssl pkey -pubin -in signing-key.pub.pem -outform DER | sha256sum` prints on either
side, with or without gpu-install, so it can be compared out of band.

An envelope is untrusted input until verify() has checked it: read with a size bound (a regular file only), parsed
strictly (exactly the DSSE fields, their types, base64, no duplicate keys) and verified against pinned public keys
only; verify returns the signed payload, which is what the caller must use (not a file read beside it).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import pwd
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, EllipticCurvePrivateKey, EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import CryptoSigner, Key, Signature, SSlibKey

from installer.errors import ConfigError
from installer.util import atomic_write

PRIVATE = "signing-key.pem"
PUBLIC = "signing-key.pub.pem"
BUNDLE_KEY_ENV = "GPU_INSTALL_BUNDLE_KEY_HOME"
ED25519 = "ed25519"  # the bundle key
ECDSA_P256 = "ecdsa-sha2-nistp256"  # the evidence key: ECDSA on P-256 with SHA-256 (cosign's default)
ALGORITHMS = {ED25519: "Ed25519", ECDSA_P256: "ECDSA P-256"}

# A lock of 2,000 images and 5,000 packages is 3.2 MiB (4.3 MiB signed); a release's own is ~100 KiB. The caps are
# checked before anything is decoded or parsed: refusing a file over them reads none of it (no memory), and the worst
# file within them (8 MiB of empty JSON objects) peaks at ~200 MiB while parsed, where 62 MiB under the old 64 MiB
# cap took 1.5 GiB.
MAX_ENVELOPE_BYTES = 8 << 20  # an envelope (a signed lock or statement), the lock beside it, evidence wrapping one
MAX_PAYLOAD_BYTES = 6 << 20  # what an envelope may sign: base64 makes it 8 MiB, the envelope's cap
MAX_KEY_BYTES = 16 << 10  # an Ed25519 PEM is ~120 bytes, a P-256 one ~180
MAX_SIGNATURES = 16
MAX_SIG_BYTES = 1024  # an Ed25519 signature is 64 bytes, a DER ECDSA P-256 one at most 72
MAX_FIELD_CHARS = 256  # payloadType, keyid

_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}|[A-Za-z0-9_-]*={0,2}")  # standard or URL-safe (DSSE allows both)


@dataclass(frozen=True)
class SigningKey:
    """A key home's key pair: the signer, its public key (keyid = fingerprint), where its public PEM is, and whether
    load_or_create generated it just now."""

    signer: CryptoSigner
    public: SSlibKey
    home: Path
    public_path: Path
    created: bool

    @property
    def fingerprint(self) -> str:
        return self.public.keyid


def key_home(given: Path | None = None, *, env: str = BUNDLE_KEY_ENV, name: str = "bundle-signing") -> Path:
    """Where a key lives: the flag's directory, else the environment variable's, else <state dir>/<name>."""
    if given:
        return given
    from installer.ansible import state_dir

    return Path(os.environ.get(env) or state_dir() / name)


PublicKey = Ed25519PublicKey | EllipticCurvePublicKey


def _spki(public: PublicKey) -> bytes:
    return public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def _algorithm(key: object) -> str | None:
    """ED25519 or ECDSA_P256 for a pyca key of one of those kinds (private or public), else None."""
    if isinstance(key, Ed25519PrivateKey | Ed25519PublicKey):
        return ED25519
    if isinstance(key, EllipticCurvePrivateKey | EllipticCurvePublicKey) and isinstance(key.curve, SECP256R1):
        return ECDSA_P256
    return None


def _kind(key: object) -> str:
    if isinstance(key, EllipticCurvePrivateKey | EllipticCurvePublicKey):
        return f"ECDSA {key.curve.name}"
    return type(key).__name__


def _sslib_key(public: PublicKey) -> SSlibKey:
    scheme = _algorithm(public)
    assert scheme is not None
    return SSlibKey.from_crypto(public, keyid=hashlib.sha256(_spki(public)).hexdigest(), scheme=scheme)


def fingerprint(key: Key) -> str:
    """The key's fingerprint as users compare it: its keyid (sha256 of the DER SubjectPublicKeyInfo, hex)."""
    return key.keyid


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _own(path: Path, st: os.stat_result, what: str, hint: str, *, directory: bool, open_bits: int = 0o077) -> None:
    """path (st: its lstat) is what it should be (a directory, else a regular file; never a symlink), belongs to the
    current user and has none of open_bits set. ConfigError naming the path, the owner and mode found and the fix."""
    mode = stat.S_IMODE(st.st_mode)
    found = f"owner {_user(st.st_uid)}, mode {mode:04o}"
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path}: {what} is a symbolic link (to {os.readlink(path)}), which is never followed",
                          hint=hint)
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        raise ConfigError(f"{path}: {what} is not a {'directory' if directory else 'regular file'}", hint=hint)
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{path}: {what} belongs to another user ({found}), not to you ({_user(os.geteuid())}): "
                          "a key kept there could be theirs", hint=hint)
    if mode & open_bits:
        fix = f"chmod {'700' if directory else '600'} {path}" if open_bits == 0o077 else f"chmod go-w {path}"
        risk = "could have put a key there" if mode & 0o022 else "can read what is in it"
        raise ConfigError(f"{path}: {what} is open to group or others ({found}): someone else {risk}",
                          hint=f"{fix} if it is yours and no one else could have written to it; otherwise {hint}")


def private_home(home: Path, what: str, hint: str) -> Path:
    """home as a directory of the current user's alone: created (mode 0700, parents as needed) when it does not exist;
    an existing one must be a directory itself (a symlink is refused, never followed), belong to the current user and
    have no permission bits for group or others. An existing home is never changed (no chmod: a home others could
    write may hold a key they put there). ConfigError naming the path, what was found and the fix otherwise. hint: the
    way to give another directory."""
    try:
        st = os.lstat(home)
    except FileNotFoundError:
        try:
            home.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(home, 0o700)
        except FileExistsError:
            pass  # made at the same moment by a concurrent first use: checked below as any existing home
        except OSError as exc:
            raise ConfigError(f"{home}: cannot create {what} ({exc.strerror})", hint=hint) from None
        st = os.lstat(home)
    except OSError as exc:
        raise ConfigError(f"{home}: cannot use it as {what} ({exc.strerror})", hint=hint) from None
    _own(home, st, what, hint, directory=True)
    return home


GNUPG_KEYRINGS = ("pubring.kbx", "pubring.gpg", "trustdb.gpg")  # public: gpg writes them 0644 under umask 022
GNUPG_SECRETS = ("private-keys-v1.d", "secring.gpg")


def gnupg_home(home: Path, hint: str) -> Path:
    """A GnuPG home as private_home, and the key material gpg keeps in it the current user's too, none of it a
    symlink: the keyrings writable by no one else, the secret keys (private-keys-v1.d and each file in it) open to no
    one else. gpg only warns about unsafe permissions and goes on; this refuses (ConfigError naming the file)."""
    private_home(home, "the GnuPG home", hint)
    for name in (*GNUPG_KEYRINGS, *GNUPG_SECRETS):
        path = home / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        directory = name == "private-keys-v1.d"
        _own(path, st, f"GnuPG's {name}", hint, directory=directory,
             open_bits=0o077 if name in GNUPG_SECRETS else 0o022)
        if directory:
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                _own(Path(entry.path), entry.stat(follow_symlinks=False), f"the GnuPG secret key {entry.name}", hint,
                     directory=False)
    return home


def read_bounded(path: Path, limit: int, what: str, hint: str, *, private: bool = False) -> bytes:
    """A regular file's bytes (never a FIFO or device: opened non-blocking, checked by fstat before reading), at most
    limit bytes; with private, also no symlink, the current user's own and no access for group or others. ConfigError
    naming the file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if private else 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} is missing", hint=hint) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror})", hint=hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: {what} is not a regular file", hint=hint)
        if private and st.st_uid != os.geteuid():
            raise ConfigError(f"{path}: {what} belongs to another user ({_user(st.st_uid)}), not to you "
                              f"({_user(os.geteuid())}): it could be their key, never one to sign with",
                              hint="remove it (a new key is generated on first use, to be pinned again) or give a key "
                                   "home of your own; pin only a key whose fingerprint you compared out of band")
        if private and st.st_mode & 0o077:
            raise ConfigError(f"{path}: {what} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})",
                              hint=f"chmod 600 {path}; if others may have read it, make a new key and pin that one")
        if st.st_size > limit:
            raise ConfigError(f"{path}: {what} is {st.st_size} bytes, more than the {limit} allowed", hint=hint)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ConfigError(f"{path}: {what} is more than the {limit} bytes allowed", hint=hint)
    return data


def load_or_create(home: Path, algorithm: str = ED25519, *, env: str = BUNDLE_KEY_ENV) -> SigningKey:
    """The key pair in home, generated the first time (algorithm: ED25519 or ECDSA_P256): the private key written
    once, mode 0600, never replaced; the public PEM (re)written beside it from the private key. ConfigError naming the
    file when the home or key cannot be used: a home or key file that is a symlink, belongs to another user or is open
    to others (private_home, read_bounded), or a key of another algorithm than the home's purpose. env: the variable
    that names the home, for the hint."""
    hint = f"give a directory of your own with --key-home (or {env}); the key is generated there once"
    private_home(home, "the signing key's directory", hint)
    path = home / PRIVATE
    created = False
    if not path.exists() and not path.is_symlink():
        signer = CryptoSigner.generate_ecdsa() if algorithm == ECDSA_P256 else CryptoSigner.generate_ed25519()
        tmp = home / f".{PRIVATE}.{secrets.token_hex(8)}.tmp"  # one per writer: concurrent first pulls never share it
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(signer.private_bytes)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)  # whole or not at all; an existing key (a concurrent first pull) is kept
                created = True
            except FileExistsError:
                pass
        except OSError as exc:
            raise ConfigError(f"{path}: cannot write the signing key ({exc.strerror})", hint=hint) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    data = read_bounded(path, MAX_KEY_BYTES, "the signing key", hint, private=True)
    try:
        private = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"{path}: not an unencrypted PEM (PKCS#8) private key", hint=hint) from None
    if _algorithm(private) != algorithm or not isinstance(private, Ed25519PrivateKey | EllipticCurvePrivateKey):
        raise ConfigError(f"{path}: not an {ALGORITHMS[algorithm]} key ({_kind(private)})", hint=hint)
    public = _sslib_key(private.public_key())
    key = SigningKey(CryptoSigner(private, public), public, home, home / PUBLIC, created)
    pem = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    try:
        if not key.public_path.is_file() or key.public_path.read_text() != pem:
            atomic_write(key.public_path, pem, mode=0o644)
    except OSError as exc:
        raise ConfigError(f"{key.public_path}: cannot write the public key ({exc.strerror})", hint=hint) from None
    return key


def load_public_key(path: Path, hint: str, algorithm: str = ED25519) -> SSlibKey:
    """A pinned public key: one PEM (SubjectPublicKeyInfo) key of algorithm (ED25519, ECDSA_P256) in a small regular
    file."""
    data = read_bounded(path, MAX_KEY_BYTES, "the public key", hint)
    try:
        public = load_pem_public_key(data)
    except (ValueError, TypeError):
        raise ConfigError(f"{path}: not a PEM public key (-----BEGIN PUBLIC KEY-----)", hint=hint) from None
    if _algorithm(public) != algorithm or not isinstance(public, Ed25519PublicKey | EllipticCurvePublicKey):
        raise ConfigError(f"{path}: not an {ALGORITHMS[algorithm]} public key ({_kind(public)})", hint=hint)
    return _sslib_key(public)


def sign(key: SigningKey, payload: bytes, payload_type: str) -> bytes:
    """A DSSE envelope (JSON) of payload signed by key; ConfigError when payload is more than an envelope may carry
    (MAX_PAYLOAD_BYTES: the other side would refuse it)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ConfigError(f"the {payload_type} to sign is {len(payload)} bytes, more than the {MAX_PAYLOAD_BYTES} a "
                          "signature envelope carries (the other side refuses larger ones)",
                          hint="sign less at once (a bundle of fewer images or packages)")
    envelope = Envelope(payload, payload_type, {})
    envelope.sign(key.signer)
    return (json.dumps(envelope.to_dict(), indent=2) + "\n").encode()


def _b64(text: Any, field: str, limit: int) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{field} is not a string")
    if len(text) > (limit + 2) // 3 * 4:
        raise ValueError(f"{field} is too long")
    if not _B64.fullmatch(text):
        raise ValueError(f"{field} is not base64")
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except binascii.Error:
        raise ValueError(f"{field} is not base64") from None


def parse_json(data: bytes, limit: int = MAX_ENVELOPE_BYTES) -> Any:
    """JSON from untrusted bytes: at most limit of them (checked before anything is decoded), then as
    safefile.json_value reads it (UTF-8, no key given twice in any object, depth-bounded). ValueError saying what is
    wrong."""
    from installer.safefile import json_value

    if len(data) > limit:
        raise ValueError(f"more than {limit} bytes")
    return json_value(data)


def parse_envelope(data: bytes) -> Envelope:
    """A DSSE envelope from untrusted bytes (at most MAX_ENVELOPE_BYTES, refused before parsing); ValueError saying
    what is wrong."""
    doc = parse_json(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if set(doc) != {"payload", "payloadType", "signatures"}:
        raise ValueError("a DSSE envelope has exactly payload, payloadType and signatures; this one has "
                         + (", ".join(sorted(doc)) or "nothing"))
    payload = _b64(doc["payload"], "payload", MAX_PAYLOAD_BYTES)
    payload_type = doc["payloadType"]
    if not isinstance(payload_type, str) or not 0 < len(payload_type) <= MAX_FIELD_CHARS:
        raise ValueError("payloadType is not a short string")
    sigs = doc["signatures"]
    if not isinstance(sigs, list) or not 0 < len(sigs) <= MAX_SIGNATURES:
        raise ValueError(f"signatures is not a list of 1 to {MAX_SIGNATURES} signatures")
    signatures: dict[str, Signature] = {}
    for i, s in enumerate(sigs):
        if not isinstance(s, dict) or not set(s) <= {"keyid", "sig"} or "sig" not in s:
            raise ValueError(f"signatures[{i}] is not an object of keyid and sig")
        keyid = s.get("keyid", "")
        if not isinstance(keyid, str) or len(keyid) > MAX_FIELD_CHARS or not keyid.isprintable():
            raise ValueError(f"signatures[{i}].keyid is not a short string")
        if keyid in signatures:
            raise ValueError(f"two signatures of keyid {keyid!r}")
        signatures[keyid] = Signature(keyid, _b64(s["sig"], f"signatures[{i}].sig", MAX_SIG_BYTES).hex())
    return Envelope(payload, payload_type, signatures)


def verify(data: bytes, trusted: Sequence[tuple[SSlibKey, str]], payload_type: str, *, source: Path,
           hint: str) -> tuple[bytes, SSlibKey]:
    """The payload of the envelope data (read from source) and the pinned key that signed it: the envelope must be of
    payload_type and carry a signature that one of the trusted keys (each with where it was pinned) verifies.
    ConfigError naming source, the key ids it claims to be signed with and the pinned ones, otherwise."""
    if not trusted:
        raise ConfigError(f"{source}: no public key is pinned to verify it with", hint=hint)
    try:
        envelope = parse_envelope(data)
    except ValueError as exc:
        raise ConfigError(f"{source}: not a valid signature envelope: {exc}", hint=hint) from None
    if envelope.payload_type != payload_type:
        raise ConfigError(f"{source}: signs a {envelope.payload_type!r}, not a {payload_type!r}", hint=hint)
    pinned = ", ".join(f"{k.keyid} ({where})" for k, where in trusted)
    claimed = ", ".join(envelope.signatures) or "none"
    keys: list[Key] = [k for k, _ in trusted]
    try:
        accepted = envelope.verify(keys, 1)
    except (UnverifiedSignatureError, ValueError):
        if any(k.keyid in envelope.signatures for k in keys):
            raise ConfigError(f"{source}: the signature of key {claimed} does not verify: the signed content was "
                              f"changed after signing, or the signature is damaged (pinned: {pinned})",
                              hint=hint) from None
        raise ConfigError(f"{source}: signed by key {claimed}, which is not pinned here (pinned: {pinned})",
                          hint=hint) from None
    key = next(k for k, _ in trusted if k.keyid in accepted)
    return envelope.payload, key
