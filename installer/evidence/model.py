"""The evidence's shape: an in-toto Statement v1 (in-toto-attestation's Statement and ResourceDescriptor: the
statement type, subjects with digests and the predicate type are checked by the library, on the way out and again on
the way in) whose predicate is gpu-install's PREDICATE_TYPE (docs/evidence.md field by field).

The payload is the statement as canonical JSON (keys sorted, no spaces, UTF-8): the signed bytes. Numbers stay
numbers (a protobuf Struct would turn the helm revision into 3.0), so the payload is written from the dict the
library has checked, not from the protobuf.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://gpu-install.dev/evidence/v1"
SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
MAX_SUBJECTS = 4096
_SHA256 = re.compile(r"[0-9a-f]{64}")

# subject kinds: the name's prefix says what the subject is (docs/evidence.md#subjects)
LOCK, CHART, VALUES, SITE, VALIDATE, IMAGE = "bundle-lock", "chart", "values", "site", "validate-report", "image"


@dataclass(frozen=True)
class Subject:
    """One subject: kind:name and the sha256 of its bytes (an image: of its manifest, the kubelet's imageID)."""

    kind: str
    name: str
    sha256: str

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.label, "digest": {"sha256": self.sha256}}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(doc: Any) -> bytes:
    """The bytes that are signed: JSON with sorted keys and no insignificant whitespace."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _check(doc: Mapping[str, Any]) -> None:
    """The statement through in-toto-attestation (ValueError when it is not a valid Statement v1)."""
    from google.protobuf import json_format
    from in_toto_attestation.v1.statement import Statement
    from in_toto_attestation.v1.statement_pb2 import Statement as StatementPb

    pb = StatementPb()
    try:
        json_format.ParseDict(doc, pb)
    except json_format.ParseError as exc:
        raise ValueError(f"not an in-toto Statement ({exc})") from None
    try:
        Statement.copy_from_pb(pb).validate()
    except ValueError as exc:
        raise ValueError(f"not a valid in-toto Statement v1: {exc}") from None


def statement(subjects: Sequence[Subject], predicate: Mapping[str, Any]) -> dict[str, Any]:
    """The Statement as a dict, checked by in-toto-attestation."""
    doc = {"_type": STATEMENT_TYPE, "subject": [s.as_dict() for s in subjects], "predicateType": PREDICATE_TYPE,
           "predicate": dict(predicate)}
    _check(doc)
    return doc


def parse(payload: bytes) -> tuple[list[Subject], dict[str, Any]]:
    """A signed payload back into subjects and predicate; ValueError saying what is wrong (after the signature was
    verified, so this is the signer's mistake or another kind of statement)."""
    from installer.safefile import json_value

    try:
        doc = json_value(payload)  # bounded depth, a key given twice refused
    except ValueError as exc:
        raise ValueError(f"the signed payload is not a JSON statement: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("the signed payload is not a JSON object")
    _check(doc)
    if doc.get("predicateType") != PREDICATE_TYPE:
        raise ValueError(f"the statement's predicateType is {doc.get('predicateType')!r}, not {PREDICATE_TYPE!r}")
    predicate = doc.get("predicate")
    if not isinstance(predicate, dict):
        raise ValueError("the statement has no predicate object")
    subjects: list[Subject] = []
    raw = doc.get("subject") or []
    if len(raw) > MAX_SUBJECTS:
        raise ValueError(f"more than {MAX_SUBJECTS} subjects")
    for i, s in enumerate(raw):
        name, digest = s.get("name"), (s.get("digest") or {}).get("sha256")
        if not isinstance(name, str) or ":" not in name or not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ValueError(f"subject[{i}] is not a kind:name with a sha256 digest")
        kind, _, rest = name.partition(":")
        subjects.append(Subject(kind, rest, digest))
    return subjects, predicate
