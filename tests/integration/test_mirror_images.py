"""`gpu-install mirror pull` / `push` for images against two real registries (Debian's docker-registry) on loopback:
an "upstream" (TLS from a throwaway test CA, no auth) seeded with tiny STAND-IN images at the exact upstream paths of a
small site's Plan.images -- read through `mirror.upstream` remaps, as from an intermediate mirror -- and a "site"
registry (TLS, htpasswd auth with a canary password). No lab nodes.

The images are one busybox-less layer each (bytes that only stand in for a root file system), all sharing that layer;
one is stored upstream with a Docker v2s2 manifest, the others as OCI.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import _skip_or_fail
from tests.integration.registries import raw_digest as _raw_digest
from tests.integration.registries import serve as _serve
from tests.integration.registries import serve_https, standin_chart_repo

CANARY_USER = "mirror-canary-user"
CANARY = "Canary-Pw-7f3e9c1d"  # the site registry's password: must never show up in output, lock or bundle
LAYER = b"gpu-install STAND-IN layer content\n" * 64
MISSING = "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v24.9.2"  # seeded late: the resume case
V2S2 = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    for tool in ("skopeo", "docker-registry"):
        if shutil.which(tool) is None:
            _skip_or_fail(f"{tool} missing (scripts/apt-packages.txt)")
    import bcrypt

    from gpu_install_lab.images import write_layout
    from gpu_install_lab.pki import ensure_ca, issue_server_cert

    root = tmp_path_factory.mktemp("mirror")
    pki = root / "pki"
    ca, _ = ensure_ca(pki, cn="gpu-install mirror test CA")
    cert, key = issue_server_cert(pki, "registry", ["127.0.0.1"], ["localhost"])
    certs = root / "certs"
    certs.mkdir()
    shutil.copy(ca, certs / "ca.crt")
    htpasswd = root / "htpasswd"
    htpasswd.write_text(f"{CANARY_USER}:{bcrypt.hashpw(CANARY.encode(), bcrypt.gensalt(4)).decode()}\n")
    up_proc, upstream = _serve(root, "upstream", cert, key)
    site_proc, site_reg = _serve(root, "site", cert, key, htpasswd)
    # the chart travels in the same bundle: a STAND-IN gpu-operator chart in an HTTPS chart repository of its own
    # (tests/integration/test_mirror_charts.py carries the real chart)
    httpd, www = serve_https(root / "www", cert, key)
    standin_chart_repo(root / "www" / "charts", f"{www}/charts", "v24.9.2")
    try:
        site = {
            "operator": {"version": "v24.9.2"},
            "registry": {"host": site_reg, "prefix": "mirror", "ca": str(ca),
                         "pullSecret": {"name": "site-registry", "usernameEnv": "MIRROR_TEST_USER",
                                        "passwordEnv": "MIRROR_TEST_PASSWORD"}},
            "driver": {"mode": "preinstalled"}, "toolkit": {"mode": "host"},
            "components": {"dcgmExporter": {"enabled": False}, "migManager": {"enabled": False}},
            "mirror": {"upstream": {"nvcr.io": f"{upstream}/nv", "registry.k8s.io": f"{upstream}/k8s"},
                       "upstreamCa": str(ca), "chartRepository": f"{www}/charts"},
        }
        site_file = root / "site.yaml"
        site_file.write_text(yaml.safe_dump(site))
        yield {"root": root, "site": site_file, "certs": certs, "upstream": upstream, "site_reg": site_reg,
               "layouts": root / "layouts", "write_layout": write_layout}
    finally:
        httpd.shutdown()
        for proc in (up_proc, site_proc):
            proc.terminate()
            proc.wait(timeout=10)


def _seed(env, source: str) -> str:
    """Push a STAND-IN image to the upstream at source's path (remapped as the site file says); its digest."""
    from installer.mirror.images import pull_from

    remap = yaml.safe_load(env["site"].read_text())["mirror"]["upstream"]
    layout = env["layouts"] / hashlib.sha256(source.encode()).hexdigest()[:12]
    env["write_layout"](layout, "t", ["/bin/sh", "-c", f"echo {source}"], busybox=LAYER)
    dest = pull_from(source, remap)
    fmt = ["--format", "v2s2"] if source == V2S2 else []
    out = subprocess.run(["skopeo", "copy", "--quiet", *fmt, "--dest-cert-dir", str(env["certs"]),
                          f"oci:{layout}:t", f"docker://{dest}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return _raw_digest(dest, env["certs"])


def _plan_images(env) -> list:
    from installer.config import load_site
    from installer.plan import Options, resolve

    return list(resolve(load_site(env["site"]), Options(os_tags=("ubuntu22.04",))).images)


def test_pull_push_round_trip(env, cli, monkeypatch):
    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    sources = [i.source for i in images]
    assert MISSING in sources and V2S2 in sources and any(s.startswith("registry.k8s.io/") for s in sources)
    assert 4 <= len(images) <= 6, sources  # a small site: pull every image of its plan
    upstream = {s: _seed(env, s) for s in sources if s != MISSING}
    bundle = env["root"] / "bundle"
    outputs: list[str] = []

    # 1. an image missing upstream: named, non-zero, the bundle marked incomplete, push refuses it
    rc, out, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", bundle)
    outputs += [out, err]
    assert rc == 4, err
    assert MISSING in err.split("could not be pulled", 1)[1] and "manifest unknown" in err, err
    lock = json.loads((bundle / "bundle.lock.json").read_text())
    assert lock["complete"] is False and [f.get("source") for f in lock["failed"]] == [MISSING]
    # toolkit.mode host plans the toolkit packages; --skip-packages leaves them out, says so, and the lock lists them
    assert "OS packages left out (--skip-packages): the nodes install ubuntu22.04: " in err, err
    assert lock["packages"] == [] and [(s["os"], s["skipped"]) for s in lock["packageSets"]] == [("ubuntu22.04", True)]
    rc, out, err = cli("mirror", "push", bundle, "-s", env["site"])
    outputs += [out, err]
    assert rc == 2 and "incomplete" in err and MISSING in err, err

    # 2. resume: only the missing image is copied
    upstream[MISSING] = _seed(env, MISSING)
    rc, out, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", bundle)
    outputs += [out, err]
    assert rc == 0, err
    assert f"1 copied, {len(sources) - 1} already there" in err, err
    lock = json.loads((bundle / "bundle.lock.json").read_text())
    assert lock["schema"] == "gpu-install.bundle-lock/v1" and lock["complete"] is True and lock["failed"] == []
    assert lock["release"] == "v24.9.2" and lock["catalog"]["release"] == "v24.9.2" and lock["catalog"]["sha256"]
    assert lock["platform"] == "linux/amd64"
    checksum = (bundle / "bundle.lock.json.sha256").read_text().split()[0]
    assert checksum == hashlib.sha256((bundle / "bundle.lock.json").read_bytes()).hexdigest()
    by_source = {e["source"]: e for e in lock["images"]}
    assert sorted(by_source) == sorted(sources)
    for img in images:
        e = by_source[img.source]
        assert e["digest"] == upstream[img.source], img.source  # digests preserved, the manifest as published
        assert e["destination"] == img.destination and e["component"] == img.component and e["size"] > len(LAYER) // 8
        assert e["pulledFrom"].startswith(env["upstream"] + "/")  # read from the remapped upstream …
        assert img.source.startswith(("nvcr.io/", "registry.k8s.io/"))  # … recorded under its canonical name

    # the OCI layout: one index entry per image, every blob once (the layer all images share: one file)
    index = json.loads((bundle / "images" / "index.json").read_text())
    assert sorted(m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]) == sorted(sources)
    blobs = {p.name for p in (bundle / "images" / "blobs" / "sha256").iterdir()}
    layers = []
    referenced = set()
    for m in index["manifests"]:
        doc = json.loads((bundle / "images" / "blobs" / "sha256" / m["digest"].split(":")[1]).read_bytes())
        referenced |= {m["digest"], doc["config"]["digest"], *(d["digest"] for d in doc["layers"])}
        layers += [d["digest"] for d in doc["layers"]]
    assert len(set(layers)) == 1 and len(layers) == len(sources)  # one layer shared by every image …
    assert blobs == {d.split(":")[1] for d in referenced}  # … stored once, nothing else in the layout

    assert not (bundle / ".pulling").exists()  # the private layouts of the concurrent copies are gone
    assert "B in " in err and "copied" in err  # the summary says how many bytes were copied

    # 3. a re-run copies nothing
    rc, out, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", bundle)
    outputs += [out, err]
    assert rc == 0 and f"0 copied, {len(sources)} already there" in err, err

    # 4. push: each image at its destination with the lock's digest (authenticated, site CA), then nothing to do;
    # credentials reach skopeo only through a temporary authfile (never an argument), removed afterwards
    from installer.mirror import images as engine

    argvs: list[list[str]] = []
    real_run = subprocess.run

    def recording_run(argv, *args, **kwargs):
        argvs.append([str(a) for a in argv])
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(engine.subprocess, "run", recording_run)
    leftovers = set(Path(tempfile.gettempdir()).glob("gpu-install-auth-*"))
    rc, out, err = cli("mirror", "push", bundle, "-s", env["site"])
    outputs += [out, err]
    assert rc == 0, err
    monkeypatch.setattr(engine.subprocess, "run", real_run)
    skopeo_argvs = [a for a in argvs if a[0].endswith("/skopeo")]
    assert skopeo_argvs and all("--dest-authfile" in a or "--authfile" in a for a in skopeo_argvs)
    assert any(a[0].endswith("/helm") and a[1] == "push" for a in argvs), argvs  # the chart, through helm
    assert not any(CANARY in " ".join(a) or CANARY_USER in " ".join(a) for a in argvs)
    assert set(Path(tempfile.gettempdir()).glob("gpu-install-auth-*")) == leftovers
    assert f"{len(sources)} copied, 0 already there" in err, err
    auth = env["root"] / "verify-auth.json"
    token = base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode()
    auth.write_text(json.dumps({"auths": {env["site_reg"]: {"auth": token}}}))
    for img in images:
        assert img.destination.startswith(env["site_reg"] + "/mirror/")
        assert _raw_digest(img.destination, env["certs"], "--authfile", str(auth)) == upstream[img.source]
    auth.unlink()
    rc, out, err = cli("mirror", "push", bundle, "-s", env["site"])
    outputs += [out, err]
    assert rc == 0 and f"0 copied, {len(sources)} already there" in err, err

    # verify: by the bundle's digests, and by the plan's tags; a site whose prefix holds nothing: exit 3, each named
    rc, out, err = cli("mirror", "verify", "-s", env["site"], "--bundle", bundle)
    outputs += [out, err]
    assert rc == 0 and f"all {len(sources)} images are in {env['site_reg']} (by the bundle's digests; 1 chart(s) by sha256)" in err, err
    rc, out, err = cli("mirror", "verify", "-s", env["site"], "--os", "ubuntu22.04")
    outputs += [out, err]
    assert rc == 0 and "(tags resolve)" in err, err
    other = env["root"] / "other-prefix.yaml"
    doc = yaml.safe_load(env["site"].read_text())
    doc["registry"]["prefix"] = "elsewhere"
    other.write_text(yaml.safe_dump(doc))
    rc, out, err = cli("mirror", "verify", "-s", other, "--os", "ubuntu22.04")
    outputs += [out, err]
    assert rc == 3 and f"{len(sources)} of {len(sources)} images are not in" in err and "mirror push" in err, err
    for img in images:
        assert f"{img.destination.replace('/mirror/', '/elsewhere/')} (from {img.source}): missing: the registry has no such tag" in err, err

    # 5. refused credentials: every image named with skopeo's message (exit 4), no password in it
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", "wrong-" + CANARY)
    rc, out, err = cli("mirror", "push", bundle, "-s", env["site"])
    outputs += [out, err]
    assert rc == 4 and f"{len(sources)} of {len(sources)} images could not be pushed" in err, err
    assert all(i.destination in err for i in images) and "unauthorized" in err.lower(), err
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)

    # 6. a tampered lock is refused before anything is pushed
    text = (bundle / "bundle.lock.json").read_text()
    (bundle / "bundle.lock.json").write_text(text.replace('"component": "validator"', '"component": "validatoR"'))
    rc, out, err = cli("mirror", "push", bundle, "-s", env["site"])
    outputs += [out, err]
    assert rc == 2 and "checksum mismatch" in err, err
    (bundle / "bundle.lock.json").write_text(text)

    # no credential anywhere: command output, lock, bundle files
    for text in outputs:
        assert CANARY not in text
    for path in bundle.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path


def _seed_index(env, source: str) -> dict[str, str]:
    """A two-platform STAND-IN (OCI index: linux/amd64 + linux/arm64) at source's upstream path; the digests of the
    index and of each instance."""
    from installer.mirror.images import pull_from

    remap = yaml.safe_load(env["site"].read_text())["mirror"]["upstream"]
    base = env["layouts"] / ("multi-" + hashlib.sha256(source.encode()).hexdigest()[:12])
    combined = base / "index"
    (combined / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    entries, digests = [], {}
    for arch in ("amd64", "arm64"):
        one = base / arch
        env["write_layout"](one, "t", ["/bin/sh", "-c", f"echo {arch}"], busybox=LAYER + arch.encode())
        desc = json.loads((one / "index.json").read_text())["manifests"][0]
        for blob in (one / "blobs" / "sha256").iterdir():
            shutil.copy(blob, combined / "blobs" / "sha256" / blob.name)
        entries.append({"mediaType": desc["mediaType"], "digest": desc["digest"], "size": desc["size"],
                        "platform": {"architecture": arch, "os": "linux"}})
        digests[f"linux/{arch}"] = desc["digest"]
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": entries}).encode()
    digest = hashlib.sha256(index).hexdigest()
    (combined / "blobs" / "sha256" / digest).write_bytes(index)
    (combined / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (combined / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": "sha256:" + digest, "size": len(index),
         "annotations": {"org.opencontainers.image.ref.name": "t"}}]}))
    out = subprocess.run(["skopeo", "copy", "--quiet", "--all", "--preserve-digests", "--dest-cert-dir",
                          str(env["certs"]), f"oci:{combined}:t", f"docker://{pull_from(source, remap)}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    digests["all"] = "sha256:" + digest
    assert _raw_digest(pull_from(source, remap), env["certs"]) == digests["all"]
    return digests


def test_platform_policy_for_a_multi_platform_image(env, cli, monkeypatch):
    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    multi = next(i for i in images if i.component == "operator")
    for img in images:
        if img is not multi:
            _seed(env, img.source)
    digests = _seed_index(env, multi.source)
    auth = env["root"] / "verify-auth2.json"
    token = base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode()
    auth.write_text(json.dumps({"auths": {env["site_reg"]: {"auth": token}}}))

    def lock_of(bundle: Path) -> dict:
        return json.loads((bundle / "bundle.lock.json").read_text())

    def digest_in(bundle: Path) -> str:
        return next(e["digest"] for e in lock_of(bundle)["images"] if e["source"] == multi.source)

    # default: the linux/amd64 instance, its own digest, pushed as such
    one = env["root"] / "bundle-amd64"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", one, "-q")
    assert rc == 0, err
    assert lock_of(one)["platform"] == "linux/amd64" and digest_in(one) == digests["linux/amd64"]
    # another platform into the same bundle: the lock's platform differs, so everything is copied again
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", one, "--platform", "linux/arm64")
    assert rc == 0 and f"{len(images)} copied, 0 already there" in err, err
    assert lock_of(one)["platform"] == "linux/arm64" and digest_in(one) == digests["linux/arm64"]

    # --all-platforms: the index as published, every instance in the layout; pushed whole with the same digest
    every = env["root"] / "bundle-all"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", every, "--all-platforms", "-q")
    assert rc == 0, err
    assert lock_of(every)["platform"] == "all" and digest_in(every) == digests["all"]
    blobs = {p.name for p in (every / "images" / "blobs" / "sha256").iterdir()}
    assert {digests["linux/amd64"].split(":")[1], digests["linux/arm64"].split(":")[1]} <= blobs
    rc, _, err = cli("mirror", "push", every, "-s", env["site"], "-q")
    assert rc == 0, err
    assert _raw_digest(multi.destination, env["certs"], "--authfile", str(auth)) == digests["all"]
    rc, _, err = cli("mirror", "push", one, "-s", env["site"])
    assert rc == 0, err
    assert _raw_digest(multi.destination, env["certs"], "--authfile", str(auth)) == digests["linux/arm64"]
    # verify by digest: the arm64 bundle is there; the all-platforms bundle's index is not (another digest)
    rc, _, err = cli("mirror", "verify", "-s", env["site"], "--bundle", one, "-q")
    assert rc == 0 and err == "", err
    rc, _, err = cli("mirror", "verify", "-s", env["site"], "--bundle", every)
    assert rc == 3 and f"1 of {len(images)} images are not in" in err, err
    assert f"{multi.destination} (from {multi.source}): the registry has {digests['linux/arm64']}, the bundle " \
           f"{digests['all']}" in err, err


def test_an_image_pinned_by_digest_to_a_list_needs_all_platforms(env, cli, monkeypatch):
    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    multi = next(i for i in images if i.component == "operator")
    for img in images:
        if img is not multi:
            _seed(env, img.source)
    digests = _seed_index(env, multi.source)
    doc = yaml.safe_load(env["site"].read_text())
    doc["components"]["operator"] = {"version": digests["all"]}
    pinned_site = env["root"] / "pinned-site.yaml"
    pinned_site.write_text(yaml.safe_dump(doc))
    source = multi.source.rsplit(":", 1)[0] + "@" + digests["all"]
    bundle = env["root"] / "bundle-pinned"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", pinned_site, "--os", "ubuntu22.04", "-o", bundle, "-q")
    assert rc == 4 and f"{source}: pinned by digest to {digests['all']}" in err and "--all-platforms" in err, err
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", pinned_site, "--os", "ubuntu22.04", "-o", bundle, "--all-platforms", "-q")
    assert rc == 0, err
    rc, _, err = cli("mirror", "push", bundle, "-s", pinned_site, "-q")
    assert rc == 0, err
    entry = next(e for e in json.loads((bundle / "bundle.lock.json").read_text())["images"] if e["source"] == source)
    assert entry["digest"] == digests["all"] and entry["destination"].endswith("@" + digests["all"])


def test_sync_registry_to_registry(env, cli, monkeypatch):
    """sync: upstream (remapped, upstream CA) straight into the site registry (auth, site CA), digests as published;
    a re-sync copies nothing; what it pushed verifies."""
    from installer.mirror.images import pull_from

    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    for img in images:
        _seed(env, img.source)
    remap = yaml.safe_load(env["site"].read_text())["mirror"]["upstream"]
    upstream = {i.source: _raw_digest(pull_from(i.source, remap), env["certs"]) for i in images}
    doc = yaml.safe_load(env["site"].read_text())
    doc["registry"]["prefix"] = "synced"
    site = env["root"] / "synced-site.yaml"
    site.write_text(yaml.safe_dump(doc))
    rc, out, err = cli("mirror", "sync", "-s", site, "--os", "ubuntu22.04", "--all-platforms", "-j", "3")
    assert rc == 0 and f"{len(images)} copied, 0 already there" in err, err
    auth = env["root"] / "verify-auth3.json"
    token = base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode()
    auth.write_text(json.dumps({"auths": {env["site_reg"]: {"auth": token}}}))
    for img in images:
        dest = img.destination.replace("/mirror/", "/synced/")
        assert _raw_digest(dest, env["certs"], "--authfile", str(auth)) == upstream[img.source], dest
    auth.unlink()
    rc, out2, err2 = cli("mirror", "sync", "-s", site, "--os", "ubuntu22.04", "--all-platforms")
    assert rc == 0 and f"0 copied, {len(images)} already there" in err2, err2
    rc, out3, err3 = cli("mirror", "verify", "-s", site, "--os", "ubuntu22.04")
    assert rc == 0, err3
    for text in (out, err, out2, err2, out3, err3):
        assert CANARY not in text


GATE = """#!/bin/sh
# STAND-IN gate in front of the real skopeo (test_kill_9_...): the GATE_AT-th `skopeo copy` of the run waits until
# the test kills the whole process group, so the kill lands mid-run whatever the machine's speed
if [ "$1" = copy ]; then
  n=$(( $(cat "$GATE_DIR/count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$GATE_DIR/count"
  if [ "$n" -ge "$GATE_AT" ]; then touch "$GATE_DIR/waiting"; while :; do sleep 1; done; fi
fi
exec "$REAL_SKOPEO" "$@"
"""


def _gated(env: dict, gate: Path, at: int) -> dict:
    """env with the gate skopeo first on PATH, its counter reset: copy number `at` (and later) blocks."""
    import os

    gate.mkdir(exist_ok=True)
    for f in ("count", "waiting"):
        (gate / f).unlink(missing_ok=True)
    (gate / "skopeo").write_text(GATE)
    (gate / "skopeo").chmod(0o755)
    return {**env, "PATH": f"{gate}:{env.get('PATH', os.defpath)}", "GATE_DIR": str(gate), "GATE_AT": str(at),
            "REAL_SKOPEO": shutil.which("skopeo") or "/usr/bin/skopeo"}


def _kill_when(argv: list[str], env: dict, ready, timeout: float = 60) -> subprocess.CompletedProcess | None:
    """Run argv in a session of its own; SIGKILL the whole process group (gpu-install and its skopeo children) as soon
    as ready(stderr so far) holds (polled every 10 ms). None when it was killed, the finished process when it ended
    first."""
    import os
    import signal
    import time

    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        err.seek(0)
        if ready(err.read().decode(errors="replace")):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        time.sleep(0.01)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    err.seek(0)
    return subprocess.CompletedProcess(argv, proc.returncode, "", err.read().decode(errors="replace"))


def test_kill_9_mid_pull_and_mid_push_then_resume(env, cli, monkeypatch):
    """A pull and a push killed with SIGKILL once an image is done: the next run copies only what is left, and the
    result is the bundle (digests) an uninterrupted pull makes; then a flipped byte in a layer is refused before
    anything is pushed."""
    import os
    import sys

    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    for img in images:
        _seed(env, img.source)
    exe = str(Path(sys.executable).parent / "gpu-install")
    penv = {**os.environ, "MIRROR_TEST_USER": CANARY_USER, "MIRROR_TEST_PASSWORD": CANARY}
    whole, killed = env["root"] / "bundle-whole", env["root"] / "bundle-killed"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", whole, "-q")
    assert rc == 0, err

    def lock_images(bundle: Path) -> list[dict]:
        try:
            return json.loads((bundle / "bundle.lock.json").read_text())["images"]
        except (OSError, ValueError, KeyError):
            return []

    pull = [exe, "mirror", "pull", "--skip-packages", "-s", str(env["site"]), "--os", "ubuntu22.04", "-o", str(killed), "-j", "1"]
    gate = env["root"] / "gate"
    ended = _kill_when(pull, _gated(penv, gate, 2),
                       lambda _: (gate / "waiting").exists() and len(lock_images(killed)) >= 1)
    assert ended is None, f"pull finished before it could be killed: {ended}"
    done = len(lock_images(killed))  # what the lock holds after the kill: the truth
    assert done == 1 and json.loads((killed / "bundle.lock.json").read_text())["complete"] is False
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", killed)
    assert rc == 0 and f"{len(images) - done} copied, {done} already there" in err, err
    digests = {e["source"]: e["digest"] for e in lock_images(killed)}
    assert digests == {e["source"]: e["digest"] for e in lock_images(whole)}
    assert not (killed / ".pulling").exists()
    index = json.loads((killed / "images" / "index.json").read_text())["manifests"]
    assert sorted(m["digest"] for m in index) == sorted(digests.values())
    referenced: set[str] = set()
    for d in digests.values():
        doc = json.loads((killed / "images" / "blobs" / "sha256" / d.split(":")[1]).read_bytes())
        referenced |= {d, doc["config"]["digest"], *(x["digest"] for x in doc["layers"])}
    assert {p.name for p in (killed / "images" / "blobs" / "sha256").iterdir()} == {d.split(":")[1] for d in referenced}

    # push, killed once one image is done; the rerun pushes the rest only, and verify finds every digest there
    doc = yaml.safe_load(env["site"].read_text())
    doc["registry"]["prefix"] = "killed"
    site = env["root"] / "killed-site.yaml"
    site.write_text(yaml.safe_dump(doc))
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", killed, "-q")
    assert rc == 0, err  # the destinations follow the prefix: the same blobs, a new lock
    push = [exe, "mirror", "push", str(killed), "-s", str(site), "-j", "1"]
    ended = _kill_when(push, _gated(penv, gate, 2), lambda text: (gate / "waiting").exists() and ": done," in text)
    assert ended is None, f"push finished before it could be killed: {ended}"
    rc, _, err = cli("mirror", "push", killed, "-s", site)
    assert rc == 0, err
    copied = int(err.rsplit(" copied, ", 1)[0].rsplit(": ", 1)[1])
    assert copied == len(images) - 1 and "1 already there" in err, err
    rc, _, err = cli("mirror", "verify", "-s", site, "--bundle", killed)
    assert rc == 0, err

    # a flipped byte in a layer: refused (exit 2, naming the image) before anything is pushed
    doc["registry"]["prefix"] = "tampered"
    site.write_text(yaml.safe_dump(doc))
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", killed, "-q")
    assert rc == 0, err
    first = lock_images(killed)[0]
    manifest = json.loads((killed / "images" / "blobs" / "sha256" / first["digest"].split(":")[1]).read_bytes())
    layer = killed / "images" / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0x01
    layer.unlink()  # a hard link may share the bytes with another bundle: replace the file, not its content
    layer.write_bytes(bytes(data))
    rc, _, err = cli("mirror", "push", killed, "-s", site)
    assert rc == 2 and "does not match its digest" in err and "image " in err, err
    rc, _, err = cli("mirror", "verify", "-s", site, "--bundle", killed)
    assert rc == 3 and f"{len(images)} of {len(images)} images are not in" in err, err


def test_incremental_bundle_since_an_older_lock(env, cli, monkeypatch):
    """--since: only the image whose upstream digest changed is carried; push builds on the registry holding the
    rest, and refuses (exit 3, naming them) where it does not."""
    from installer.mirror.images import pull_from

    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    for img in images:
        _seed(env, img.source)
    doc = yaml.safe_load(env["site"].read_text())
    doc["registry"]["prefix"] = "inc"
    site = env["root"] / "inc-site.yaml"
    site.write_text(yaml.safe_dump(doc))
    old, new = env["root"] / "bundle-old", env["root"] / "bundle-new"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", old, "-q")
    assert rc == 0, err
    rc, _, err = cli("mirror", "push", old, "-s", site, "-q")
    assert rc == 0, err
    changed = next(i for i in images if i.component == "validator")
    remap = doc["mirror"]["upstream"]
    layout = env["layouts"] / "changed-validator"
    env["write_layout"](layout, "t", ["/bin/sh", "-c", "echo the next release"], busybox=LAYER + b"next")
    try:
        out = subprocess.run(["skopeo", "copy", "--quiet", "--dest-cert-dir", str(env["certs"]), f"oci:{layout}:t",
                              f"docker://{pull_from(changed.source, remap)}"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", new, "--since",
                         old / "bundle.lock.json")
        assert rc == 0 and f"1 copied, {len(images) - 1} already there" in err, err
        lock = json.loads((new / "bundle.lock.json").read_text())
        assert lock["complete"] is True
        assert lock["incremental"]["since"] == hashlib.sha256((old / "bundle.lock.json").read_bytes()).hexdigest()
        assert [e["source"] for e in lock["images"]] == [changed.source]
        assert sorted(e["source"] for e in lock["base"]) == sorted(i.source for i in images if i is not changed)
        size = {b: sum(p.stat().st_size for p in (b / "images").rglob("*") if p.is_file()) for b in (old, new)}
        assert size[new] < size[old], size

        # another destination prefix: the old lock has none of its destinations, so every image is carried
        fresh = env["root"] / "inc-fresh-site.yaml"
        fresh.write_text(site.read_text().replace("prefix: inc", "prefix: inc-fresh"))
        rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", fresh, "--os", "ubuntu22.04", "-o", env["root"] / "bundle-nb",
                         "--since", old / "bundle.lock.json")
        assert rc == 0 and f"{len(images)} copied, 0 already there" in err, err
        rc, _, err = cli("mirror", "push", new, "-s", site, "-q")
        assert rc == 0, err
        rc, _, err = cli("mirror", "verify", "-s", site, "--os", "ubuntu22.04")
        assert rc == 0, err
        rc, _, err = cli("mirror", "verify", "-s", site, "--bundle", new)
        assert rc == 0, err
        moved = env["root"] / "bundle-moved"
        shutil.copytree(new, moved)
        lock["base"] = [{**e, "destination": e["destination"].replace("/inc/", "/inc-gone/")} for e in lock["base"]]
        from installer.mirror.bundle import write_lock

        write_lock(moved, lock)  # the base elsewhere: a registry without it refuses before anything is pushed
        rc, _, err = cli("mirror", "push", moved, "-s", site)
        assert rc == 3 and "incremental bundle" in err and f"lacks {len(images) - 1} of the {len(images) - 1}" in err
        assert all(f"{e['destination']} (from {e['source']}): missing" in err for e in lock["base"]), err
    finally:
        _seed(env, changed.source)
