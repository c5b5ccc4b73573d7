"""Faults under `mirror pull` / `mirror push`, against real registries (Debian's docker-registry) on loopback -- the
upstream and site registries of tests/integration/test_mirror_images.py, plus registries of this module's own that
are stopped, or serve a certificate out of its dates. No lab nodes. Each fault: the exit code, the message, nothing
recorded that is not there (no half-written file, a lock that says only what the bundle holds), and a re-run that
converges copying only what is left (docs/reliability.md).

Faults land on conditions, never after a sleep: a STAND-IN gate in front of the real skopeo holds the N-th copy until
the test has done its harm (stopped the registry, sent SIGINT), then lets it go on.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.registries import free_port
from tests.integration.registries import raw_digest as _raw_digest
from tests.integration.registries import serve as _serve
from tests.integration.test_mirror_images import CANARY, CANARY_USER, _plan_images, _seed
from tests.integration.test_mirror_images import env as env  # noqa: F401 - the module's registries (a fixture)

GATE = """#!/bin/sh
# STAND-IN gate in front of the real skopeo: the GATE_AT-th `skopeo copy` of the run (and every later one) says so
# in $GATE_DIR/waiting and waits for $GATE_DIR/go before it runs the real skopeo
if [ "$1" = copy ]; then
  n=$(( $(cat "$GATE_DIR/count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$GATE_DIR/count"
  if [ "$n" -ge "$GATE_AT" ]; then
    touch "$GATE_DIR/waiting"
    while [ ! -e "$GATE_DIR/go" ]; do sleep 0.05; done
  fi
fi
exec "$REAL_SKOPEO" "$@"
"""


def _gate(root: Path, at: int) -> tuple[Path, dict[str, str]]:
    """(the gate directory, the environment that puts the gate skopeo first on PATH): copy number `at` waits."""
    gate = root / f"gate-{at}-{time.monotonic_ns()}"
    gate.mkdir()
    (gate / "skopeo").write_text(GATE)
    (gate / "skopeo").chmod(0o755)
    penv = {**os.environ, "MIRROR_TEST_USER": CANARY_USER, "MIRROR_TEST_PASSWORD": CANARY,
            "PATH": f"{gate}:{os.environ.get('PATH', os.defpath)}", "GATE_DIR": str(gate), "GATE_AT": str(at),
            "REAL_SKOPEO": shutil.which("skopeo") or "/usr/bin/skopeo"}
    return gate, penv


def _wait_for(cond, what: str, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    """Poll cond every 20 ms; fail after timeout, or as soon as proc (the command under test) ended."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _gpu_install(*args: object) -> list[str]:
    return [str(Path(sys.executable).parent / "gpu-install"), *(str(a) for a in args)]


def _restart(root: Path, name: str, addr: str) -> subprocess.Popen:
    """docker-registry `name` again, from the config serve() wrote (same port, same storage); once it listens."""
    log = open(root / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(["docker-registry", "serve", str(root / f"{name}.yml")], stdout=log, stderr=log)
    host, port = addr.split(":")

    def listening() -> bool:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return True
        except OSError:
            return False

    _wait_for(listening, f"registry {name} to listen again")
    return proc


def _lock(bundle: Path) -> dict:
    return json.loads((bundle / "bundle.lock.json").read_text())


def _bundle_is_whole(bundle: Path) -> None:
    """Nothing half-written: the lock matches its checksum, every blob file is named by its own sha256 (no temporary
    file of an interrupted copy left in the store), and every image the lock records is whole in the layout."""
    import hashlib

    from installer.mirror.images import Layout

    text = (bundle / "bundle.lock.json").read_bytes()
    assert (bundle / "bundle.lock.json.sha256").read_text().split()[0] == hashlib.sha256(text).hexdigest()
    store = bundle / "images" / "blobs" / "sha256"
    for blob in store.iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, f"half-written blob {blob}"
    leftovers = [p.name for p in bundle.iterdir() if p.name.startswith(".") and p.name != ".pulling"]
    assert not leftovers, leftovers  # atomic_write's temporary files
    layout = Layout(bundle / "images")
    for e in json.loads(text)["images"]:
        assert layout.complete(e["refName"], e["digest"]), e["source"]


def _auth(env, name: str, host: str) -> Path:
    auth = env["root"] / name
    token = base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode()
    auth.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return auth


@pytest.fixture(scope="module")
def seeded(env):
    """The plan's images seeded upstream, and one complete bundle of them: (images, bundle)."""
    images = _plan_images(env)
    for img in images:
        _seed(env, img.source)
    bundle = env["root"] / "faults-bundle"
    penv = {**os.environ, "MIRROR_TEST_USER": CANARY_USER, "MIRROR_TEST_PASSWORD": CANARY}
    out = subprocess.run(_gpu_install("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04",
                                      "-o", bundle, "-q"), env=penv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return images, bundle


def test_registry_stopped_during_push(env, seeded, cli):
    """The site registry goes away while push copies its second image: exit 4 naming every image not copied (and
    nothing named that is there); once the registry is back, a re-run copies exactly those."""
    images, _ = seeded
    root = env["root"]
    pki = root / "pki"
    htpasswd = root / "htpasswd"
    proc, addr = _serve(root, "stoppable", pki / "registry.crt", pki / "registry.key", htpasswd)
    doc = yaml.safe_load(env["site"].read_text())
    doc["registry"]["host"] = addr
    site = root / "stoppable-site.yaml"
    site.write_text(yaml.safe_dump(doc))
    bundle = root / "stoppable-bundle"  # a bundle is for one registry.host: pulled for this one
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", bundle, "-q")
    assert rc == 0, err
    try:
        gate, penv = _gate(root, 2)
        push = subprocess.Popen(_gpu_install("mirror", "push", bundle, "-s", site, "-j", "1"), env=penv,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: (gate / "waiting").exists(), "the second copy of the push", proc=push)
        proc.terminate()  # the registry goes away mid-push
        proc.wait(timeout=30)
        (gate / "go").touch()
        out, err = push.communicate(timeout=300)
        assert push.returncode == 4, err
        assert "Traceback" not in err and "internal error" not in err, err
        n = len(images)
        assert f"{n - 1} of {n} images could not be pushed to {addr}" in err, err
        failed_block = err.split("could not be pushed", 1)[1]
        named = [i for i in images if i.destination.replace(env["site_reg"], addr) in failed_block]
        assert len(named) == n - 1, err
        assert "connection refused" in failed_block.lower(), err
        # once the registry refused a connection, the images after it are not tried (no retries against a dead
        # registry): named as not tried, with why
        assert failed_block.count(f"not tried: {addr} stopped answering") == n - 2, err
        assert "run push again" in err, err
        (pushed,) = [i for i in images if i not in named]
        assert CANARY not in out + err

        # what the registry holds is what push says it copied: the one image, with the bundle's digest
        proc = _restart(root, "stoppable", addr)
        auth = _auth(env, "stoppable-auth.json", addr)
        digests = {e["source"]: e["digest"] for e in _lock(bundle)["images"]}
        dest = pushed.destination.replace(env["site_reg"], addr)
        assert _raw_digest(dest, env["certs"], "--authfile", str(auth)) == digests[pushed.source]
        for img in named:
            gone = subprocess.run(["skopeo", "inspect", "--raw", "--cert-dir", str(env["certs"]), "--authfile",
                                   str(auth), f"docker://{img.destination.replace(env['site_reg'], addr)}"],
                                  capture_output=True, text=True, timeout=60)
            assert gone.returncode != 0, img.destination

        # the re-run copies only the rest, and verify finds every digest
        out = subprocess.run(_gpu_install("mirror", "push", bundle, "-s", site), env=penv | {"GATE_AT": "1000"},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert f": {n - 1} copied, 1 already there" in out.stderr, out.stderr
        out = subprocess.run(_gpu_install("mirror", "verify", "-s", site, "--bundle", bundle), env=penv,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        auth.unlink()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sigint_during_pull(env, seeded):
    """Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) while pull copies its second
    image: exit 130 'cancelled', no traceback; the lock records the one finished image and nothing half-written is
    left; the next run copies only the rest and converges on the uninterrupted bundle's digests."""
    images, whole = seeded
    root = env["root"]
    bundle = root / "sigint-bundle"
    gate, penv = _gate(root, 2)
    pull = subprocess.Popen(_gpu_install("mirror", "pull", "--skip-packages", "-s", env["site"], "--os",
                                         "ubuntu22.04", "-o", bundle, "-j", "1"),
                            env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)

    def first_recorded() -> bool:
        try:
            return len(_lock(bundle)["images"]) == 1
        except (OSError, ValueError):
            return False

    # the second copy has started AND the first image is recorded (the recording thread may lag the copies)
    _wait_for(lambda: (gate / "waiting").exists() and first_recorded(), "the second copy of the pull", proc=pull)
    os.killpg(pull.pid, signal.SIGINT)
    (gate / "go").touch()  # the gate shell ignores nothing: it is interrupted with the rest, or execs skopeo
    out, err = pull.communicate(timeout=120)
    assert pull.returncode == 130, err
    assert err.rstrip().endswith("cancelled") and "Traceback" not in err, err
    lock = _lock(bundle)
    assert lock["complete"] is False and len(lock["images"]) == 1, lock
    assert not (bundle / "bundle.lock.json.dsse").exists()  # nothing signed as a bundle
    _bundle_is_whole(bundle)

    out2 = subprocess.run(_gpu_install("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04",
                                       "-o", bundle), env=penv | {"GATE_AT": "1000"}, capture_output=True, text=True,
                          timeout=300)
    assert out2.returncode == 0, out2.stderr
    assert f"{len(images) - 1} copied, 1 already there" in out2.stderr, out2.stderr
    _bundle_is_whole(bundle)
    assert not (bundle / ".pulling").exists()
    digests = {e["source"]: e["digest"] for e in _lock(bundle)["images"]}
    assert digests == {e["source"]: e["digest"] for e in _lock(whole)["images"]}
    assert _lock(bundle)["complete"] is True


def _cert(pki: Path, name: str, not_before: dt.datetime, not_after: dt.datetime) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 signed by the module CA, valid only between the given dates."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    crt, kp = pki / f"{name}.crt", pki / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    return crt, kp


def test_expired_certificate_and_clock_skew(env, seeded, cli, monkeypatch):
    """An upstream whose certificate expired, and one whose certificate is not valid yet (this machine's clock is
    behind, or the registry's ahead): pull names the registry host, the certificate's dates and this machine's
    time, and says which fix fits (exit 4); nothing is recorded as pulled."""
    from cryptography import x509

    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images, bundle = seeded
    root = env["root"]
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    expired = _cert(root / "pki", "expired", now - dt.timedelta(days=400), now - dt.timedelta(days=35))
    future = _cert(root / "pki", "future", now + dt.timedelta(days=2), now + dt.timedelta(days=400))
    procs = []
    try:
        for name, (crt, key) in (("expired", expired), ("future", future)):
            # the upstream's storage, served with that certificate
            cfg = yaml.safe_load((root / "upstream.yml").read_text())
            port = free_port()
            cfg["http"] |= {"addr": f"127.0.0.1:{port}", "tls": {"certificate": str(crt), "key": str(key)}}
            (root / f"{name}.yml").write_text(yaml.safe_dump(cfg))
            procs.append(_restart(root, name, f"127.0.0.1:{port}"))
            doc = yaml.safe_load(env["site"].read_text())
            doc["mirror"]["upstream"] = {k: v.replace(env["upstream"], f"127.0.0.1:{port}")
                                         for k, v in doc["mirror"]["upstream"].items()}
            site = root / f"{name}-site.yaml"
            site.write_text(yaml.safe_dump(doc))
            out = root / f"{name}-bundle"
            rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", out, "-q")
            assert rc == 4, err
            assert "Traceback" not in err and "internal error" not in err, err
            n = len(images)
            assert f"{n} of {n} images could not be pulled" in err, err
            crt_obj = x509.load_pem_x509_certificate(crt.read_bytes())
            start = crt_obj.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
            end = crt_obj.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
            assert f"127.0.0.1:{port}" in err, err
            if name == "expired":
                assert f"the certificate of 127.0.0.1:{port} expired on {end}" in err, err
                assert "renew" in err, err
            else:
                assert f"the certificate of 127.0.0.1:{port} is valid only from {start}" in err, err
                assert "clock" in err, err
            assert _lock(out)["images"] == [] and _lock(out)["complete"] is False
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def test_full_disk_under_pull(env, seeded, cli, monkeypatch):
    """The bundle's file system (a 1 MiB tmpfs) fills up on an image whose layer is 2 MiB: exit 8 naming the bundle
    path, the bytes free and the bytes the images not pulled yet need (their manifests' blob sizes); the images
    before it are kept whole, nothing half-written is left; once the tmpfs is grown, the pull resumes with only that
    image and the bundle is complete."""
    import hashlib

    from installer.mirror.images import pull_from

    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images, _ = seeded
    root = env["root"]
    # the plan's images under another upstream prefix; the last one with a 2 MiB layer (random: does not compress)
    doc = yaml.safe_load(env["site"].read_text())
    doc["mirror"]["upstream"] = {k: v + "-big" for k, v in doc["mirror"]["upstream"].items()}
    site = root / "big-site.yaml"
    site.write_text(yaml.safe_dump(doc))
    big = images[-1]
    for img in images:
        layout = root / "layouts" / ("big-" + hashlib.sha256(img.source.encode()).hexdigest()[:12])
        layer = os.urandom(2 << 20) if img is big else b"small STAND-IN layer\n" * 32
        env["write_layout"](layout, "t", ["/bin/sh", "-c", f"echo {img.source}"], busybox=layer)
        out = subprocess.run(["skopeo", "copy", "--quiet", "--dest-cert-dir", str(env["certs"]), f"oci:{layout}:t",
                              f"docker://{pull_from(img.source, doc['mirror']['upstream'])}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        if img is big:  # what the big image needs in a bundle: its manifest, config and layer, as written
            index = json.loads((layout / "index.json").read_text())["manifests"][0]
            manifest = json.loads((layout / "blobs" / "sha256" / index["digest"].split(":")[1]).read_bytes())
            need = index["size"] + manifest["config"]["size"] + sum(d["size"] for d in manifest["layers"])
    small = root / "small-disk"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True, timeout=30)
    try:
        bundle = small / "bundle"
        rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", bundle, "-j",
                         "1")
        assert rc == 8, err
        assert "Traceback" not in err and "internal error" not in err, err
        free = shutil.disk_usage(small).free
        assert f"error: {bundle}: no space left on device ({free} bytes free there; the images not pulled yet need " \
               f"{need} bytes more" in err, err
        assert "run pull again" in err, err
        lock = _lock(bundle)
        assert lock["complete"] is False and sorted(e["source"] for e in lock["images"]) == sorted(
            i.source for i in images if i is not big), lock
        _bundle_is_whole(bundle)
        assert not (bundle / ".pulling").exists() and not (bundle / "bundle.lock.json.dsse").exists()

        subprocess.run(["mount", "-o", "remount,size=8m", str(small)], check=True, timeout=30)
        rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", bundle)
        assert rc == 0, err
        assert f"1 copied, {len(images) - 1} already there" in err, err
        _bundle_is_whole(bundle)
        assert _lock(bundle)["complete"] is True
    finally:
        subprocess.run(["umount", str(small)], check=True, timeout=30)
