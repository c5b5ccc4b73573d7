"""installer/evidence: the signed statement round trip, its envelope verified by an independent implementation (the
DSSE PAE computed here, the exported public key with pyca/cryptography), every tampering refused with its exit code
(a payload byte, the signature, a subject file, a wrong key; unreadable input 2), the Sigstore bundle wrapping, the
files' subjects (redacted site, rendered values, validate summaries) and a node's facts from real nvidia-smi output.

The cluster parts (running images by digest, helm, Node objects, SSH to nodes, --live drift) run against the lab in
tests/integration/test_demo.py. One evidence key per module."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

from installer import evidence, signing
from installer.cli import main
from installer.evidence import collect, model, sign
from tests.conftest import ROOT

SITE = ROOT / "inventories" / "sample" / "site.yaml"
HOSTS = ROOT / "inventories" / "sample" / "hosts.yml"
SMI = ROOT / "tests" / "fixtures" / "nvidia-smi" / "h100-80gb-hbm3-580-v13.xml"


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return sign.load_key(str(tmp_path_factory.mktemp("keys") / "evidence-home"))


@pytest.fixture(scope="module")
def plan():
    from installer.config import load_site
    from installer.plan import Options, resolve

    return resolve(load_site(SITE), Options(inventory=str(HOSTS)))


def report(tmp: Path, statuses: dict[str, str], name: str = "validate.json") -> Path:
    doc = {"schema": "gpu-install.validate/v1", "release": "v24.9.2", "layers": ["node"], "started": "2026-01-01T00:00:00Z",
           "seconds": 1.0, "exitCode": 0, "summary": {},
           "checks": [{"layer": "node", "check": c, "node": "gpu1", "status": s, "message": "m", "fix": "", "gpu": None,
                       "seconds": 0.1} for c, s in statuses.items()]}
    path = tmp / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def made(tmp: Path, key, plan, *, sigstore: bool = False) -> tuple[Path, Path, Path]:
    """An evidence file from the sample site and a validate report (the file subjects as create collects them, two
    image subjects as the kubelet would report them), its public key exported beside it."""
    rep = report(tmp, {"node.driver": "pass", "node.ecc": "warn"})
    out = collect.Collected()
    collect.controller_files(plan, str(SITE), bundle=None, chart=None, reports=[rep], secrets=[], out=out)
    out.subjects.append(model.Subject(model.IMAGE, "registry.example.com:5000/nvidia/gpu-operator:v24.9.2", "a" * 64))
    out.subjects.append(model.Subject(model.IMAGE, "registry.example.com:5000/nvidia/k8s-device-plugin:v0.17.0",
                                      "b" * 64))
    out.predicate.update(nodes=[], createdBy=collect.who(), ticket="CHG-1234", helm={"revision": 3})
    statement = model.statement(out.subjects, out.predicate)
    path = tmp / "evidence.json"
    path.write_bytes(sign.envelope(key, model.canonical(statement), sigstore=sigstore))
    pub = evidence.public_key_path(path)
    pub.write_text(key.public_path.read_text())
    return path, pub, rep


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding, as the spec writes it."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def test_round_trip_and_an_independent_check_of_the_envelope(tmp_path, key, plan):
    path, pub, rep = made(tmp_path, key, plan)
    v = evidence.verify(path, [str(pub)], files=[rep], plan=plan, site_path=str(SITE))
    assert v.keyid == key.fingerprint and not v.bad
    by = {c["name"]: c["result"] for c in v.checks}
    assert by["validate-report:validate.json"] == by["site:site.yaml"] == by["values:values.yaml"] == "ok"
    assert by["image:registry.example.com:5000/nvidia/gpu-operator:v24.9.2"] == "not checked"

    # independently of installer.signing: PAE by the DSSE spec, ECDSA P-256 / SHA-256 with the exported PEM
    env = json.loads(path.read_text())
    assert env["payloadType"] == "application/vnd.in-toto+json" and len(env["signatures"]) == 1
    payload = base64.b64decode(env["payload"])
    public = load_pem_public_key(pub.read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    public.verify(base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], payload),
                  ec.ECDSA(hashes.SHA256()))
    spki = public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    assert env["signatures"][0]["keyid"] == hashlib.sha256(spki).hexdigest()
    with pytest.raises(InvalidSignature):
        public.verify(base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], payload + b" "),
                      ec.ECDSA(hashes.SHA256()))

    st = json.loads(payload)
    assert st["_type"] == "https://in-toto.io/Statement/v1" and st["predicateType"] == model.PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in st["subject"]}
    assert subjects["validate-report:validate.json"] == hashlib.sha256(rep.read_bytes()).hexdigest()
    assert subjects["values:values.yaml"] == hashlib.sha256(collect.rendered_values(plan)).hexdigest()
    values = yaml.safe_load(collect.rendered_values(plan))
    assert values["operator"]["repository"].startswith("registry.example.com:5000")
    assert st["predicate"]["ticket"] == "CHG-1234" and st["predicate"]["helm"]["revision"] == 3  # an int, not 3.0
    summary = st["predicate"]["validate"][0]
    assert summary["result"] == "WARNED" and summary["warnedChecks"] == ["gpu1/node.ecc"]
    assert st["predicate"]["release"]["operatorVersion"] == "v24.9.2"


def test_the_cli_verifies_and_writes_its_json(tmp_path, key, plan, capsys):
    path, pub, rep = made(tmp_path, key, plan)
    out = tmp_path / "verdict.json"
    assert main(["evidence", "verify", str(path), "--key", str(pub), "--file", str(rep), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "gpu-install.evidence-verify/v1" and doc["valid"] and doc["exitCode"] == 0
    assert doc["keyid"] == key.fingerprint and doc["subjects"] == 5
    assert "valid (signed by" in capsys.readouterr().out


def flip_payload_byte(path: Path) -> None:
    env = json.loads(path.read_text())
    payload = bytearray(base64.b64decode(env["payload"]))
    i = payload.index(b"CHG-1234")
    payload[i + 4] ^= 0x01  # CHG-1234 -> CHG-0234: still JSON, another ticket
    env["payload"] = base64.b64encode(bytes(payload)).decode()
    path.write_text(json.dumps(env))


def flip_signature_byte(path: Path) -> None:
    env = json.loads(path.read_text())
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[-1] ^= 0x01
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    path.write_text(json.dumps(env))


@pytest.mark.parametrize("tamper,says", [
    (flip_payload_byte, "does not verify"),
    (flip_signature_byte, "does not verify"),
])
def test_a_changed_payload_or_signature_is_exit_6(tmp_path, key, plan, capsys, tamper, says):
    path, pub, _ = made(tmp_path, key, plan)
    tamper(path)
    assert main(["evidence", "verify", str(path), "--key", str(pub)]) == 6
    err = capsys.readouterr().err
    assert says in err and str(path) in err


def test_a_changed_subject_file_is_exit_6_naming_it(tmp_path, key, plan, capsys):
    path, pub, rep = made(tmp_path, key, plan)
    rep.write_text(rep.read_text().replace('"warn"', '"pass"'))  # the warning edited away
    assert main(["evidence", "verify", str(path), "--key", str(pub), "--file", str(rep)]) == 6
    out, err = capsys.readouterr()
    assert "MISMATCH" in out and "validate-report:validate.json" in err
    assert hashlib.sha256(rep.read_bytes()).hexdigest() in err


def test_another_key_is_exit_6_and_both_pinned_during_a_rotation_verify(tmp_path, key, plan, capsys):
    path, pub, _ = made(tmp_path, key, plan)
    other = sign.load_key(str(tmp_path / "new-home"))
    assert main(["evidence", "verify", str(path), "--key", str(other.public_path)]) == 6
    assert "not pinned here" in capsys.readouterr().err
    assert main(["evidence", "verify", str(path), "--key", str(other.public_path), "--key", str(pub)]) == 0


def test_the_site_file_changed_after_the_evidence_is_a_mismatch(tmp_path, key, plan):
    path, pub, _ = made(tmp_path, key, plan)
    site = tmp_path / "site.yaml"
    site.write_text(SITE.read_text().replace("strategy: single", "strategy: mixed"))
    v = evidence.verify(path, [str(pub)], plan=plan, site_path=str(site))
    assert [c["name"] for c in v.bad] == ["site:site.yaml"]
    with pytest.raises(evidence.EvidenceMismatch) as err:
        evidence.fail_if_bad(v)
    assert err.value.exit_code == 6


@pytest.mark.parametrize("content,says", [
    (b"not json", "not JSON"),
    (b'{"payload": "", "payloadType": "x", "signatures": []}', "not a valid DSSE envelope"),
    (b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.1+json", "dsseEnvelope": {}}', "Sigstore bundle of"),
])
def test_unreadable_evidence_is_exit_2(tmp_path, key, plan, capsys, content, says):
    _, pub, _ = made(tmp_path, key, plan)
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert main(["evidence", "verify", str(bad), "--key", str(pub)]) == 2
    assert says in capsys.readouterr().err


def test_another_payload_type_and_a_wrong_key_file_are_exit_2(tmp_path, key, plan, capsys):
    _, pub, _ = made(tmp_path, key, plan)
    other = tmp_path / "lock.dsse"
    other.write_bytes(signing.sign(key, b"{}", "application/vnd.gpu-install.bundle-lock+json"))
    assert main(["evidence", "verify", str(other), "--key", str(pub)]) == 2
    assert "not an in-toto statement" in capsys.readouterr().err
    ed = signing.load_or_create(tmp_path / "bundle-home")  # the bundle key (Ed25519) is not an evidence key
    assert main(["evidence", "verify", str(other), "--key", str(ed.public_path)]) == 2
    assert "not an ECDSA P-256 public key (Ed25519PublicKey)" in capsys.readouterr().err


def test_sigstore_bundle_round_trip(tmp_path, key, plan):
    path, pub, _ = made(tmp_path, key, plan, sigstore=True)
    doc = json.loads(path.read_text())
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert doc["verificationMaterial"] == {"publicKey": {"hint": key.fingerprint}}
    env = doc["dsseEnvelope"]
    load_pem_public_key(pub.read_bytes()).verify(
        base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], base64.b64decode(env["payload"])),
        ec.ECDSA(hashes.SHA256()))
    assert not evidence.verify(path, [str(pub)]).bad
    flip_signature_byte_in_bundle = json.loads(path.read_text())
    flip_signature_byte_in_bundle["dsseEnvelope"]["payload"] = base64.b64encode(b"{}").decode()
    path.write_text(json.dumps(flip_signature_byte_in_bundle))
    with pytest.raises(evidence.EvidenceMismatch):
        evidence.verify(path, [str(pub)])


def test_the_site_subject_has_no_credentials(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE.read_text() + "mirror:\n  chartRepository: https://robot:s3cret@charts.example.com/nvidia\n"
                    "  upstreamPassword: hunter2\n")
    text = collect.redacted_site(site, ["GPU_REGISTRY_PASSWORD-value"]).decode()
    assert "s3cret" not in text and "hunter2" not in text and "***@charts.example.com" in text
    assert "usernameEnv: GPU_REGISTRY_USER" in text  # names of variables stay: they are not the credentials


@pytest.mark.parametrize("statuses,result", [
    ({"a": "pass", "b": "skip"}, "PASSED"),
    ({"a": "pass", "b": "warn"}, "WARNED"),
    ({"a": "fail", "b": "warn"}, "FAILED"),
    ({"a": "unreachable"}, "FAILED"),
])
def test_validate_summary_is_a_test_result(tmp_path, statuses, result):
    doc = json.loads(report(tmp_path, statuses).read_text())
    s = collect.validate_summary(doc, "v.json")
    assert s["result"] == result
    assert set(s["failedChecks"]) == {f"gpu1/{c}" for c, st in statuses.items() if st in ("fail", "unreachable")}


def test_a_nodes_facts_from_real_nvidia_smi_output_and_role_records():
    m = collect.MARK
    record = {"packages": ["nvidia-container-toolkit=1.17.4-1"], "registryPassword": "hunter2"}
    text = "\n".join([
        f"{m} os", 'ID=ubuntu', 'VERSION_ID="22.04"', 'PRETTY_NAME="Ubuntu 22.04.4 LTS"',
        f"{m} kernel", "5.15.0-105-generic",
        f"{m} nvidia-smi", SMI.read_text(), f"{m} rc 0",
        f"{m} toolkit", "NVIDIA Container Toolkit CLI version 1.17.4",
        f"{m} record nvidia_container_toolkit.json", json.dumps(record),
        f"{m} record broken.json", "{not json",
        f"{m} end", ""])
    facts = collect.node_facts(text)
    assert facts["os"] == "ubuntu22.04" and facts["kernel"] == "5.15.0-105-generic"
    assert facts["driver"] == "580.159.04" and facts["gpus"]
    assert all(g["uuid"].startswith("GPU-") and "H100" in g["model"] for g in facts["gpus"])
    assert facts["records"]["nvidia_container_toolkit.json"]["packages"] == record["packages"]
    assert "hunter2" not in json.dumps(facts) and facts["records"]["broken.json"] == "(not JSON)"
    assert facts["toolkit"] == ["NVIDIA Container Toolkit CLI version 1.17.4"]
    with pytest.raises(ValueError, match="incomplete"):
        collect.node_facts(text.split(f"{m} end")[0])


def test_image_digest_from_the_kubelets_image_ids():
    d = "0" * 63 + "1"
    assert collect.image_digest(f"docker-pullable://reg:5000/nvidia/x@sha256:{d}") == d
    assert collect.image_digest(f"reg:5000/nvidia/x@sha256:{d}") == d
    assert collect.image_digest(f"sha256:{d}") == d
    assert collect.image_digest("reg/x:latest") is None and collect.image_digest("sha256:abc") is None


def test_the_key_is_ecdsa_p256_kept_private_and_reused(tmp_path):
    home = tmp_path / "k"
    first = sign.load_key(str(home))
    assert first.created and first.public.scheme == "ecdsa-sha2-nistp256"
    assert oct(os.stat(home / signing.PRIVATE).st_mode & 0o777) == "0o600"
    again = sign.load_key(str(home))
    assert not again.created and again.fingerprint == first.fingerprint


def test_apply_evidence_is_refused_up_front_with_check_or_an_unwritable_path(tmp_path, capsys):
    base = ["apply", "-s", str(SITE), "-i", str(HOSTS), "-q"]
    assert main([*base, "--check", "--evidence", str(tmp_path / "e.json")]) == 2
    assert "not with --check" in capsys.readouterr().err
    assert main([*base, "--evidence", str(tmp_path / "missing" / "e.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_create_refuses_a_missing_bundle_before_the_cluster_is_asked(tmp_path, plan):
    from installer.errors import ConfigError

    with pytest.raises(ConfigError, match="--bundle .*: not a directory"):
        evidence.create(plan, str(SITE), tmp_path / "e.json", kubeconfig=tmp_path / "no-kubeconfig",
                        bundle=tmp_path / "no-bundle", key_home=str(tmp_path / "k"))
    assert not (tmp_path / "k").exists() and not (tmp_path / "e.json").exists()


def test_running_images_are_named_by_the_pod_spec_and_digested_by_the_kubelet():
    """Two tags of one digest (the demo's placeholders): the kubelet's .image names whichever tag the runtime
    found first; the evidence keeps the pod's own image, so a pod started with another tag is told apart."""
    from kubernetes.client import (
        V1Container,
        V1ContainerState,
        V1ContainerStateRunning,
        V1ContainerStatus,
        V1ObjectMeta,
        V1Pod,
        V1PodList,
        V1PodSpec,
        V1PodStatus,
    )

    d = "4" * 64

    def pod(name: str, image: str, reported: str, image_id: str, phase: str = "Running") -> V1Pod:
        return V1Pod(metadata=V1ObjectMeta(name=name), spec=V1PodSpec(node_name="node1", containers=[
            V1Container(name="c", image=image)]), status=V1PodStatus(phase=phase, container_statuses=[V1ContainerStatus(
                name="c", image=reported, image_id=image_id, ready=True, restart_count=0,
                state=V1ContainerState(running=V1ContainerStateRunning()))]))

    class Core:
        def list_namespaced_pod(self, namespace: str) -> V1PodList:
            return V1PodList(items=[
                pod("nfd", "reg/nfd:v1", "reg/nfd:v1", f"reg/nfd@sha256:{d}"),
                pod("drift", "reg/dcgm:v3", "reg/nfd:v1", f"reg/nfd@sha256:{d}"),
                pod("local", "reg/x:v1", "reg/x:v1", ""),
                pod("done", "reg/y:v1", "reg/y:v1", f"reg/y@sha256:{d}", phase="Succeeded")])

    images, missing = collect.running_images(Core(), "gpu-operator")
    assert [(i.image, i.digest, i.pods) for i in images] == [("reg/dcgm:v3", d, ("drift/c",)),
                                                             ("reg/nfd:v1", d, ("nfd/c",))]
    assert missing == ["local/c (reg/x:v1: imageID empty)"]
