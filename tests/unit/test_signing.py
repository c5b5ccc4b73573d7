"""installer/signing.py (Ed25519 keys, DSSE envelopes) and the signed bundle lock it gives `mirror push` / `mirror
verify --bundle` (installer/mirror/bundle.py signed_lock). Expected values come from pyca/cryptography directly (the
fingerprint: sha256 of the DER SubjectPublicKeyInfo; an attacker's envelope: signed with a key of its own), never from
the code under test. The CLI's refusal of forged bundles: tests/integration/test_bundle_signature.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_public_key,
)

from installer import signing
from installer.errors import ConfigError
from installer.mirror import bundle as b

TYPE = "application/vnd.gpu-install.test+json"


def _pin(key: signing.SigningKey, where: str = "pinned.pem") -> list:
    return [(signing.load_public_key(key.public_path, "h"), where)]


def _verify(data: bytes, trusted: list, payload_type: str = TYPE) -> bytes:
    return signing.verify(data, trusted, payload_type, source=Path("env.dsse"), hint="the hint")[0]


def _attacker_envelope(payload: bytes, payload_type: str = TYPE, keyid: str | None = None) -> tuple[bytes, str]:
    """A DSSE envelope made without installer.signing (PAE by the DSSE spec, pyca's Ed25519): signed by a key of the
    attacker's own, claiming keyid (default: that key's fingerprint). The envelope and the attacker key's
    fingerprint."""
    priv = ed25519.Ed25519PrivateKey.generate()
    fpr = hashlib.sha256(priv.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)).hexdigest()
    pae = b"DSSEv1 %d %b %d %b" % (len(payload_type), payload_type.encode(), len(payload), payload)
    env = {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
           "signatures": [{"keyid": keyid or fpr, "sig": base64.b64encode(priv.sign(pae)).decode()}]}
    return json.dumps(env).encode(), fpr


# ------------------------------------------------------------------ keys


def test_the_key_is_generated_once_private_and_reused(tmp_path):
    old = os.umask(0)  # the modes come from the code, not from a strict umask
    try:
        key = signing.load_or_create(tmp_path / "home")
    finally:
        os.umask(old)
    private = tmp_path / "home" / signing.PRIVATE
    assert key.created
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "home").stat().st_mode) == 0o700
    assert b"BEGIN PRIVATE KEY" in private.read_bytes()  # PKCS#8, unencrypted
    pem = key.public_path.read_bytes()
    assert key.public_path == tmp_path / "home" / signing.PUBLIC and pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    spki = load_pem_public_key(pem).public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    assert key.fingerprint == hashlib.sha256(spki).hexdigest()  # what openssl pkey -outform DER | sha256sum prints
    assert signing.fingerprint(signing.load_public_key(key.public_path, "h")) == key.fingerprint

    before = private.read_bytes(), private.stat().st_mtime_ns
    key.public_path.unlink()  # the public half is written again from the private key
    again = signing.load_or_create(tmp_path / "home")
    assert not again.created and again.fingerprint == key.fingerprint
    assert (private.read_bytes(), private.stat().st_mtime_ns) == before
    assert key.public_path.read_bytes() == pem
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == sorted([signing.PRIVATE, signing.PUBLIC])


def test_an_existing_home_is_used_only_when_it_is_private_and_never_made_so(tmp_path):
    """A home others can open is refused as it is, never chmod-ed: once others could write it, a key in it may be
    one they put there (more cases, other users' homes and symlinks: tests/unit/test_key_homes.py)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    assert signing.load_or_create(home).created  # an empty private directory of the user's own is used as it is
    os.chmod(home, 0o755)
    with pytest.raises(ConfigError, match=rf"{home}: the signing key's directory is open to group or others \(owner "
                                          r"uid 0 \(root\), mode 0755\): someone else can read what is in it") as e:
        signing.load_or_create(home)
    assert e.value.hint.startswith(f"chmod 700 {home} if it is yours")
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    shared = tmp_path / "shared"  # e.g. --key-home /tmp by mistake: refused, its mode left alone, no key made
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "someone-else.txt").write_text("x")
    with pytest.raises(ConfigError, match=rf"{shared}: .* mode 1777\): someone else could have put a key there"):
        signing.load_or_create(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777 and not (shared / signing.PRIVATE).exists()


def test_concurrent_first_use_makes_one_key(tmp_path):
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(signing.load_or_create(tmp_path / "h").fingerprint))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 8 and len(set(got)) == 1
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == sorted([signing.PRIVATE, signing.PUBLIC])


def test_an_unusable_private_key_is_refused_naming_the_file(tmp_path):
    home = tmp_path / "home"
    signing.load_or_create(home)
    private = home / signing.PRIVATE
    os.chmod(private, 0o644)
    with pytest.raises(ConfigError, match=rf"{private}: the signing key is readable by others \(mode 0644\)") as e:
        signing.load_or_create(home)
    assert "chmod 600" in str(e.value.hint)
    os.chmod(private, 0o600)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private.write_bytes(rsa_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with pytest.raises(ConfigError, match=rf"{private}: not an Ed25519 key"):
        signing.load_or_create(home)
    private.write_bytes(b"not a key")
    with pytest.raises(ConfigError, match=rf"{private}: not an unencrypted PEM"):
        signing.load_or_create(home)
    private.unlink()
    target = tmp_path / "elsewhere.pem"
    target.write_bytes(b"x")
    os.chmod(target, 0o600)
    private.symlink_to(target)  # never followed: the key home is the user's own
    with pytest.raises(ConfigError, match=rf"{private}: cannot read the signing key"):
        signing.load_or_create(home)


def test_a_pinned_key_must_be_one_ed25519_public_key_pem(tmp_path):
    pem = tmp_path / "k.pem"
    pem.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(ConfigError, match=rf"{pem}: not an Ed25519 public key"):
        signing.load_public_key(pem, "h")
    pem.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    with pytest.raises(ConfigError, match=rf"{pem}: not a PEM public key"):
        signing.load_public_key(pem, "h")
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'none.pem'}: the public key is missing"):
        signing.load_public_key(tmp_path / "none.pem", "h")
    with pytest.raises(ConfigError, match="is not a regular file"):
        signing.load_public_key(tmp_path, "h")


# ------------------------------------------------------------------ envelopes


def test_round_trip_returns_the_signed_payload_and_the_key(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    payload = b'{"schema": "x"}\n' + bytes(range(256))  # any bytes, kept exactly
    data = signing.sign(key, payload, TYPE)
    env = json.loads(data)
    assert set(env) == {"payload", "payloadType", "signatures"} and env["payloadType"] == TYPE
    assert base64.b64decode(env["payload"]) == payload
    assert [s["keyid"] for s in env["signatures"]] == [key.fingerprint]
    got, by = signing.verify(data, _pin(key), TYPE, source=Path("e"), hint="h")
    assert got == payload and by.keyid == key.fingerprint
    # an envelope made by the DSSE spec alone verifies too (the same PAE): the format is DSSE, not a private one
    pub = load_pem_public_key(key.public_path.read_bytes())
    pae = b"DSSEv1 %d %b %d %b" % (len(TYPE), TYPE.encode(), len(payload), payload)
    pub.verify(base64.b64decode(env["signatures"][0]["sig"]), pae)  # raises InvalidSignature otherwise


def test_a_changed_payload_does_not_verify(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    env = json.loads(signing.sign(key, b'{"registry": "r.lab:5000"}', TYPE))
    env["payload"] = base64.b64encode(b'{"registry": "evil.lab"}').decode()
    with pytest.raises(ConfigError, match=rf"env.dsse: the signature of key {key.fingerprint} does not verify") as e:
        _verify(json.dumps(env).encode(), _pin(key))
    assert e.value.hint == "the hint"


def test_a_key_not_pinned_is_refused_naming_both_keys(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    other = signing.load_or_create(tmp_path / "other")
    with pytest.raises(ConfigError, match=rf"signed by key {other.fingerprint}, which is not pinned here \(pinned: "
                                          rf"{key.fingerprint} \(pinned.pem\)\)"):
        _verify(signing.sign(other, b"x", TYPE), _pin(key))
    # two keys pinned (a rotation): either signs
    assert _verify(signing.sign(other, b"x", TYPE), _pin(key) + _pin(other, "new.pem")) == b"x"


def test_a_payload_re_signed_by_an_attacker_is_refused(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    forged, attacker = _attacker_envelope(b'{"registry": "evil.lab"}')
    with pytest.raises(ConfigError, match=rf"signed by key {attacker}, which is not pinned"):
        _verify(forged, _pin(key))
    # claiming the pinned key's id does not help: the pinned key checks the signature
    forged, _ = _attacker_envelope(b'{"registry": "evil.lab"}', keyid=key.fingerprint)
    with pytest.raises(ConfigError, match=rf"the signature of key {key.fingerprint} does not verify"):
        _verify(forged, _pin(key))
    # nor does adding the attacker's signature next to a genuine one of another payload
    genuine = json.loads(signing.sign(key, b"genuine", TYPE))
    forged_doc = json.loads(_attacker_envelope(b"forged")[0])
    forged_doc["signatures"].append(genuine["signatures"][0])
    with pytest.raises(ConfigError, match="does not verify"):
        _verify(json.dumps(forged_doc).encode(), _pin(key))


def test_the_payload_type_is_part_of_what_is_checked(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    data = signing.sign(key, b"x", "application/vnd.in-toto+json")
    with pytest.raises(ConfigError, match=r"signs a 'application/vnd.in-toto\+json', not a"):
        _verify(data, _pin(key))
    env = json.loads(data)
    env["payloadType"] = TYPE  # relabelled: the PAE covers the type, so the signature no longer verifies
    with pytest.raises(ConfigError, match="does not verify"):
        _verify(json.dumps(env).encode(), _pin(key))


def test_nothing_pinned_is_refused(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    with pytest.raises(ConfigError, match="env.dsse: no public key is pinned"):
        _verify(signing.sign(key, b"x", TYPE), [])


SIG = base64.b64encode(b"\0" * 64).decode()


@pytest.mark.parametrize("doc,problem", [
    (b"", "not JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[]", "not a JSON object"),
    (b'{"payload": "eA==", "payloadType": "t"}', "exactly payload, payloadType and signatures"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [], "extra": 1}).encode(), "exactly payload"),
    (json.dumps({"payload": 1, "payloadType": "t", "signatures": [{"sig": SIG}]}).encode(), "payload is not a string"),
    (json.dumps({"payload": "e*A=", "payloadType": "t", "signatures": [{"sig": SIG}]}).encode(), "payload is not base64"),
    (json.dumps({"payload": "eA=", "payloadType": "t", "signatures": [{"sig": SIG}]}).encode(), "payload is not base64"),
    (json.dumps({"payload": "eA==", "payloadType": 7, "signatures": [{"sig": SIG}]}).encode(), "payloadType is not"),
    (json.dumps({"payload": "eA==", "payloadType": "t" * 300, "signatures": [{"sig": SIG}]}).encode(),
     "payloadType is not a short string"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": []}).encode(), "not a list of 1 to 16"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": {"sig": SIG}}).encode(), "not a list of 1"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"sig": SIG, "keyid": str(i)} for i in range(17)]})
     .encode(), "not a list of 1 to 16"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": ["x"]}).encode(), r"signatures\[0\] is not an object"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"keyid": "k"}]}).encode(), r"signatures\[0\] is not"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"sig": SIG, "cert": "x"}]}).encode(),
     r"signatures\[0\] is not an object of keyid and sig"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"sig": SIG, "keyid": 5}]}).encode(),
     r"signatures\[0\].keyid is not a short string"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"sig": SIG, "keyid": "a\nb"}]}).encode(),
     r"signatures\[0\].keyid is not a short string"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"sig": SIG, "keyid": "k"}] * 2}).encode(),
     "two signatures of keyid 'k'"),
    (json.dumps({"payload": "eA==", "payloadType": "t", "signatures": [{"sig": "A" * 2000}]}).encode(),
     r"signatures\[0\].sig is too long"),
    (b'{"payload": "eA==", "payload": "eQ==", "payloadType": "t", "signatures": []}', "'payload' is given twice"),
    (b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested more than|payload is not a string"),
])
def test_a_malformed_envelope_is_refused_saying_what_is_wrong(tmp_path, doc, problem):
    key = signing.load_or_create(tmp_path / "h")
    with pytest.raises(ConfigError, match=r"env.dsse: not a valid signature envelope: .*(" + problem + ")"):
        _verify(doc, _pin(key))


def test_url_safe_base64_is_read_as_dsse_allows(tmp_path):
    key = signing.load_or_create(tmp_path / "h")
    payload = b"\xfb\xff\xfe" * 10  # encodes with + and / in standard base64
    env = json.loads(signing.sign(key, payload, TYPE))
    env["payload"] = base64.urlsafe_b64encode(payload).decode()
    assert "-" in env["payload"] or "_" in env["payload"]
    assert _verify(json.dumps(env).encode(), _pin(key)) == payload


def test_an_oversized_or_special_envelope_file_is_refused_without_reading_it(tmp_path):
    big = tmp_path / "big.dsse"
    with open(big, "wb") as fh:
        fh.truncate(signing.MAX_ENVELOPE_BYTES + 1)  # sparse: nothing is written, and nothing must be read
    with pytest.raises(ConfigError, match=rf"{big}: the envelope is {signing.MAX_ENVELOPE_BYTES + 1} bytes, more than"):
        signing.read_bounded(big, signing.MAX_ENVELOPE_BYTES, "the envelope", "h")
    with pytest.raises(ValueError, match="more than"):
        signing.parse_envelope(b" " * (signing.MAX_ENVELOPE_BYTES + 1))
    fifo = tmp_path / "fifo.dsse"
    os.mkfifo(fifo)  # no writer: a blocking read would hang
    with pytest.raises(ConfigError, match=rf"{fifo}: the envelope is not a regular file"):
        signing.read_bounded(fifo, signing.MAX_ENVELOPE_BYTES, "the envelope", "h")


# ------------------------------------------------------------------ the signed bundle lock


def _bundle(tmp_path: Path) -> tuple[Path, signing.SigningKey, list[Path]]:
    """A complete bundle lock signed as `mirror pull` signs it (finish), the key, and its public key pinned."""
    bundle = tmp_path / "bundle"
    b.write_lock(bundle, {"schema": b.SCHEMA, "complete": False, "release": "v24.9.2", "registry": "r.lab:5000",
                          "platform": "linux/amd64", "layout": "images", "failed": [],
                          "images": [{"source": "nvcr.io/nvidia/gpu-operator:v24.9.2",
                                      "destination": "r.lab:5000/nvidia/gpu-operator:v24.9.2",
                                      "digest": "sha256:" + "1" * 64, "refName": "x", "size": 1}]})
    key = signing.load_or_create(tmp_path / "key")
    b.finish(bundle, key)
    return bundle, key, [key.public_path]


def test_finish_signs_the_exact_lock_and_push_reads_the_signed_one(tmp_path):
    bundle, key, trusted = _bundle(tmp_path)
    env = json.loads((bundle / b.SIGNATURE).read_bytes())
    assert base64.b64decode(env["payload"]) == (bundle / b.LOCK).read_bytes()
    assert env["payloadType"] == "application/vnd.gpu-install.bundle-lock+json"
    assert env["signatures"][0]["keyid"] == key.fingerprint
    assert b.bundle_for_push(bundle, trusted)["complete"] is True
    assert b.bundle_for_push(bundle)["registry"] == "r.lab:5000"  # later steps of the same push: the verified lock


def test_a_lock_written_again_loses_its_signature_until_finish(tmp_path):
    """A resumed pull rewrites the lock: the old signature goes, finish signs the new lock."""
    bundle, key, trusted = _bundle(tmp_path)
    b.put_section(bundle, "chart", "charts", [{"name": "gpu-operator"}], [])
    assert not (bundle / b.SIGNATURE).exists()
    with pytest.raises(ConfigError, match="the bundle is unsigned"):
        b.signed_lock(bundle, trusted)
    b.finish(bundle, key)
    assert b.signed_lock(bundle, trusted)["charts"] == [{"name": "gpu-operator"}]


def test_forged_bundles_are_refused(tmp_path):
    bundle, key, trusted = _bundle(tmp_path)
    text = (bundle / b.LOCK).read_text()
    pinned = rf"pinned: {key.fingerprint} \({trusted[0]}\)"

    # the lock edited, its checksum recomputed: the checksum is happy, the signature is not
    edited = text.replace("r.lab:5000/nvidia", "r.lab:5000/payments")
    (bundle / b.LOCK).write_text(edited)
    (bundle / b.CHECKSUM).write_text(f"{hashlib.sha256(edited.encode()).hexdigest()}  {b.LOCK}\n")
    assert b.read_lock(bundle)["images"][0]["destination"].startswith("r.lab:5000/payments/")
    with pytest.raises(ConfigError, match=rf"{bundle / b.LOCK}: not the lock {b.SIGNATURE} signed .*changed after "
                                          "signing") as e:
        b.bundle_for_push(bundle, trusted)
    assert "mirror.trustedKeys" in str(e.value.hint)

    # the edited lock re-signed with the attacker's own key
    forged, attacker = _attacker_envelope(edited.encode(), b.PAYLOAD_TYPE)
    (bundle / b.SIGNATURE).write_bytes(forged)
    with pytest.raises(ConfigError, match=rf"{bundle / b.SIGNATURE}: signed by key {attacker}, which is not pinned "
                                          rf"here \({pinned}\)"):
        b.bundle_for_push(bundle, trusted)

    # the signature removed
    (bundle / b.SIGNATURE).unlink()
    with pytest.raises(ConfigError, match=rf"{bundle / b.SIGNATURE}: missing: the bundle is unsigned"):
        b.bundle_for_push(bundle, trusted)

    # the genuine signature of the genuine lock, and nothing pinned on this side
    b.write_lock(bundle, json.loads(text))
    b.finish(bundle, key)
    with pytest.raises(ConfigError, match="no bundle signing key is pinned on this side") as e:
        b.bundle_for_push(bundle, [])
    assert "first time: on the connected side" in str(e.value.hint)
    assert b.bundle_for_push(bundle, trusted)["images"][0]["destination"] == "r.lab:5000/nvidia/gpu-operator:v24.9.2"


def test_a_bundle_never_verified_is_refused_by_the_later_steps(tmp_path):
    bundle, _, _ = _bundle(tmp_path)
    with pytest.raises(ConfigError, match="the bundle's signature was not verified"):
        b.bundle_for_push(bundle)
