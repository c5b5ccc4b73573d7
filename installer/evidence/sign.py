"""The evidence's envelope: the statement's canonical bytes in a DSSE envelope signed with the site's evidence key
(installer.signing: ECDSA P-256, the key home kept as the bundle key's is), optionally wrapped in a Sigstore bundle
v0.3 whose verification material is the key's hint (its fingerprint) -- offline: no transparency log entry, no
certificate, which `cosign verify-blob-attestation --key evidence.pub.pem --insecure-ignore-tlog` accepts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from securesystemslib.signer import SSlibKey

from installer import signing
from installer.errors import ConfigError
from installer.evidence.model import PAYLOAD_TYPE, SIGSTORE_BUNDLE

KEY_ENV = "GPU_INSTALL_EVIDENCE_KEY_HOME"
KEY_HOME = "evidence-signing"


def key_home(given: str | None) -> Path:
    """--key-home, else $GPU_INSTALL_EVIDENCE_KEY_HOME, else <state dir>/evidence-signing."""
    return signing.key_home(Path(given).expanduser() if given else None, env=KEY_ENV, name=KEY_HOME)


def load_key(given: str | None) -> signing.SigningKey:
    """The site's evidence key (generated on first use, ECDSA P-256)."""
    return signing.load_or_create(key_home(given), signing.ECDSA_P256, env=KEY_ENV)


def envelope(key: signing.SigningKey, payload: bytes, *, sigstore: bool = False) -> bytes:
    """The signed file's bytes: a DSSE envelope, or with sigstore that envelope inside a Sigstore bundle v0.3."""
    env = signing.sign(key, payload, PAYLOAD_TYPE)
    if not sigstore:
        return env
    bundle = {"mediaType": SIGSTORE_BUNDLE,
              "verificationMaterial": {"publicKey": {"hint": key.fingerprint}},
              "dsseEnvelope": json.loads(env)}
    return (json.dumps(bundle, indent=2) + "\n").encode()


def unwrap(data: bytes, source: Path) -> tuple[bytes, str | None]:
    """The DSSE envelope's bytes in data (the envelope itself, or a Sigstore bundle v0.3 holding it) and the bundle's
    public-key hint. Parsed as strictly as a plain envelope (signing.parse_json: at most MAX_ENVELOPE_BYTES, checked
    before parsing; a key given twice anywhere, the wrapper's or its dsseEnvelope's, is refused: readers that keep the
    first and readers that keep the last would see different envelopes). Nothing else is trusted here:
    signing.verify() checks the envelope."""
    hint = "give the evidence file `gpu-install evidence create` wrote"
    try:
        doc = signing.parse_json(data)  # size-bounded first, then no key twice in the bundle or its dsseEnvelope
    except ValueError as exc:
        raise ConfigError(f"{source}: not an evidence file: {exc}", hint=hint) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: not a JSON object", hint=hint)
    if "dsseEnvelope" not in doc and "mediaType" not in doc:
        return data, None
    if doc.get("mediaType") != SIGSTORE_BUNDLE:
        raise ConfigError(f"{source}: a Sigstore bundle of media type {doc.get('mediaType')!r}, not "
                          f"{SIGSTORE_BUNDLE!r}", hint=hint)
    inner = doc.get("dsseEnvelope")
    if not isinstance(inner, dict):
        raise ConfigError(f"{source}: the Sigstore bundle holds no dsseEnvelope", hint=hint)
    material: Any = doc.get("verificationMaterial") or {}
    key_hint = (material.get("publicKey") or {}).get("hint") if isinstance(material, dict) else None
    return json.dumps(inner).encode(), key_hint if isinstance(key_hint, str) else None


def pinned(paths: list[str]) -> list[tuple[SSlibKey, str]]:
    """The pinned public keys (--key, repeatable: the current key and, during a rotation, the one before)."""
    hint = ("give the evidence key's public half as PEM (evidence.pub.pem, `signing-key.pub.pem` of the key home), "
            "compared by its fingerprint when it was pinned")
    return [(signing.load_public_key(Path(os.path.expanduser(p)), hint, signing.ECDSA_P256), p)
            for p in dict.fromkeys(paths)]
