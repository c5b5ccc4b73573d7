"""What an envelope reader accepts before it checks a signature (installer/signing.py parse_json, parse_envelope,
read_bounded; installer/evidence/sign.py unwrap): the size cap, checked before anything is decoded or parsed, and the
Sigstore bundle wrapping evidence parsed as strictly as a plain DSSE envelope -- no key given twice, in the wrapper or
in its dsseEnvelope (a reader keeping the first and one keeping the last would verify different envelopes)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from installer import signing
from installer.cli import main
from installer.errors import ConfigError
from installer.evidence import sign as evidence_sign
from installer.evidence.model import PAYLOAD_TYPE, SIGSTORE_BUNDLE
from installer.mirror import bundle as b

STATEMENT = b'{"_type":"https://in-toto.io/Statement/v1","subject":[]}'


@pytest.fixture
def key(tmp_path) -> signing.SigningKey:
    return signing.load_or_create(tmp_path / "evidence-key", signing.ECDSA_P256)


def _pinned(key: signing.SigningKey) -> list:
    return [(signing.load_public_key(key.public_path, "h", signing.ECDSA_P256), "pinned.pem")]


def _verified(key: signing.SigningKey, data: bytes) -> bytes:
    """What `evidence verify` trusts of data: the payload of the envelope unwrap finds, verified by the pinned key."""
    inner, _ = evidence_sign.unwrap(data, Path("evidence.json"))
    return signing.verify(inner, _pinned(key), PAYLOAD_TYPE, source=Path("evidence.json"), hint="h")[0]


def _envelope_text(key: signing.SigningKey, payload: bytes) -> str:
    return json.dumps(json.loads(signing.sign(key, payload, PAYLOAD_TYPE)))


# ------------------------------------------------------------------ the Sigstore bundle wrapper


def test_the_genuine_sigstore_bundle_verifies(key):
    data = evidence_sign.envelope(key, STATEMENT, sigstore=True)
    assert json.loads(data)["mediaType"] == SIGSTORE_BUNDLE
    assert _verified(key, data) == STATEMENT


def _wrapper(*members: str) -> bytes:
    return ("{" + ", ".join(members) + "}").encode()


def test_a_dsse_envelope_given_twice_in_the_sigstore_bundle_is_refused(key, tmp_path, capsys):
    """A forged envelope first, the genuine one last: json.loads keeps the last and would verify the genuine one,
    while a reader keeping the first (many do) takes the forged one as what was verified."""
    genuine = _envelope_text(key, STATEMENT)
    forged = genuine.replace(base64.b64encode(STATEMENT).decode(), base64.b64encode(b'{"forged":1}').decode())
    data = _wrapper(f'"mediaType": "{SIGSTORE_BUNDLE}"', f'"dsseEnvelope": {forged}', f'"dsseEnvelope": {genuine}')
    with pytest.raises(ConfigError, match=r"evidence.json: not an evidence file: key 'dsseEnvelope' is given "
                                          "twice"):
        _verified(key, data)
    path = tmp_path / "evidence.json"
    path.write_bytes(data)
    assert main(["evidence", "verify", str(path), "--key", str(key.public_path)]) == 2
    assert "key 'dsseEnvelope' is given twice" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["payload", "payloadType", "signatures"])
def test_a_key_given_twice_inside_the_sigstore_bundles_dsse_envelope_is_refused(key, field):
    genuine = json.loads(_envelope_text(key, STATEMENT))
    forged = {"payload": base64.b64encode(b'{"forged":1}').decode(), "payloadType": "application/x-forged",
              "signatures": [{"keyid": "forged", "sig": base64.b64encode(b"\0" * 64).decode()}]}
    members = [f'"{k}": {json.dumps(forged[k])}' for k in [field]] + \
              [f'"{k}": {json.dumps(v)}' for k, v in genuine.items()]  # the forged value first, the genuine last
    inner = "{" + ", ".join(members) + "}"
    data = _wrapper(f'"mediaType": "{SIGSTORE_BUNDLE}"', f'"dsseEnvelope": {inner}')
    with pytest.raises(ConfigError, match=rf"not an evidence file: key '{field}' is given twice"):
        _verified(key, data)


def test_a_media_type_or_verification_material_given_twice_is_refused(key):
    genuine = _envelope_text(key, STATEMENT)
    twice = _wrapper('"mediaType": "application/x-other"', f'"mediaType": "{SIGSTORE_BUNDLE}"',
                     f'"dsseEnvelope": {genuine}')
    with pytest.raises(ConfigError, match="key 'mediaType' is given twice"):
        _verified(key, twice)
    hint = _wrapper(f'"mediaType": "{SIGSTORE_BUNDLE}"', '"verificationMaterial": {"publicKey": {"hint": "a", '
                    '"hint": "b"}}', f'"dsseEnvelope": {genuine}')
    with pytest.raises(ConfigError, match="key 'hint' is given twice"):
        _verified(key, hint)


# ------------------------------------------------------------------ the size cap


def test_the_cap_is_a_few_mib_and_a_big_lock_fits_under_it(key):
    """8 MiB signed, 6 MiB of payload: a lock of 2,000 images and 5,000 packages (3.2 MiB) signs and verifies."""
    assert signing.MAX_ENVELOPE_BYTES <= 8 << 20 and signing.MAX_PAYLOAD_BYTES * 4 // 3 <= signing.MAX_ENVELOPE_BYTES

    def h(s: str) -> str:
        return hashlib.sha256(s.encode()).hexdigest()

    lock = {"schema": b.SCHEMA, "complete": True, "release": "v24.9.2", "registry": "registry.site.example:5000",
            "images": [{"source": f"nvcr.io/nvidia/cloud-native/component-{i}:v24.9.2-ubuntu22.04",
                        "destination": f"registry.site.example:5000/nvidia/cloud-native/component-{i}:v24.9.2",
                        "digest": "sha256:" + h(str(i)), "refName": f"nvcr.io_nvidia_component-{i}_v24.9.2",
                        "size": 123456789} for i in range(2000)],
            "packages": [{"os": "ubuntu22.04", "manager": "apt", "name": f"libnvidia-compute-{i}",
                          "version": "550.127.05-0ubuntu1", "arch": "amd64", "size": 98765432, "sha256": h(f"p{i}"),
                          "file": f"packages/ubuntu22.04/libnvidia-compute-{i}_550.127.05-0ubuntu1_amd64.deb",
                          "source": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
                                    f"libnvidia-compute-{i}_550.127.05-0ubuntu1_amd64.deb"} for i in range(5000)]}
    payload = b.lock_text(lock).encode()
    assert 3 << 20 < len(payload) < signing.MAX_PAYLOAD_BYTES
    data = signing.sign(key, payload, PAYLOAD_TYPE)
    assert len(data) < signing.MAX_ENVELOPE_BYTES
    assert signing.verify(data, _pinned(key), PAYLOAD_TYPE, source=Path("e"), hint="h")[0] == payload


def test_a_payload_over_the_cap_is_not_signed(key):
    with pytest.raises(ConfigError, match=rf"to sign is {signing.MAX_PAYLOAD_BYTES + 1} bytes, more than the "
                                          rf"{signing.MAX_PAYLOAD_BYTES}"):
        signing.sign(key, b" " * (signing.MAX_PAYLOAD_BYTES + 1), PAYLOAD_TYPE)


def _padded(data: bytes, size: int) -> bytes:
    """data (a JSON document) with trailing whitespace to size bytes: still the same document to a JSON reader."""
    return data.rstrip() + b" " * (size - len(data.rstrip()))


def test_a_genuine_envelope_over_the_cap_is_refused_before_parsing(key):
    """The signature would verify: only the cap refuses it, before any decoding or parsing."""
    plain = _padded(signing.sign(key, STATEMENT, PAYLOAD_TYPE), signing.MAX_ENVELOPE_BYTES + 1)
    with pytest.raises(ValueError, match=rf"^more than {signing.MAX_ENVELOPE_BYTES} bytes$"):
        signing.parse_envelope(plain)
    with pytest.raises(ConfigError, match=rf"env: not a valid signature envelope: more than "
                                          rf"{signing.MAX_ENVELOPE_BYTES} bytes"):
        signing.verify(plain, _pinned(key), PAYLOAD_TYPE, source=Path("env"), hint="h")
    wrapped = _padded(evidence_sign.envelope(key, STATEMENT, sigstore=True), signing.MAX_ENVELOPE_BYTES + 1)
    with pytest.raises(ConfigError, match=rf"not an evidence file: more than {signing.MAX_ENVELOPE_BYTES} bytes"):
        _verified(key, wrapped)
    at_cap = _padded(evidence_sign.envelope(key, STATEMENT, sigstore=True), signing.MAX_ENVELOPE_BYTES)
    assert _verified(key, at_cap) == STATEMENT  # the cap itself is allowed


def test_an_envelope_file_over_the_cap_is_refused_without_reading_it(key, tmp_path, capsys):
    """The file's size is checked before a byte is read: refusing one over the cap costs no memory (measured in a
    fresh interpreter: its peak resident set grows by far less than the file's size), and `evidence verify` says so
    with exit 2."""
    path = tmp_path / "evidence.json"
    path.write_bytes(_padded(evidence_sign.envelope(key, STATEMENT, sigstore=True), signing.MAX_ENVELOPE_BYTES + 1))
    probe = ("import resource, sys\nfrom pathlib import Path\nfrom installer import signing\n"
             "from installer.errors import ConfigError\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "try:\n    signing.read_bounded(Path(sys.argv[1]), signing.MAX_ENVELOPE_BYTES, 'the evidence', 'h')\n"
             "except ConfigError as exc:\n    print(exc.args[0])\n"
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout.splitlines()
    assert out[0] == (f"{path}: the evidence is {signing.MAX_ENVELOPE_BYTES + 1} bytes, more than the "
                      f"{signing.MAX_ENVELOPE_BYTES} allowed")
    grew_kib = int(out[1])
    assert grew_kib < 2048, f"refusing the file grew the peak resident set by {grew_kib} KiB: it was read"
    assert main(["evidence", "verify", str(path), "--key", str(key.public_path)]) == 2
    assert f"more than the {signing.MAX_ENVELOPE_BYTES} allowed" in capsys.readouterr().err
