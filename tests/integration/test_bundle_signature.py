"""Forged bundles against `gpu-install mirror push` and `mirror verify --bundle` as the CLI runs them: a real pull
(the registries and STAND-IN images of tests/integration/test_mirror_images.py), then copies of the bundle forged the
ways a checksum cannot catch -- the lock edited and its checksum recomputed, the edited lock re-signed with another
key, the signature removed. Each push exits 2 naming the signature problem with skopeo and helm never started (spies
first on the PATH and as GPU_INSTALL_HELM log every call, then run the real tool), the site registry still empty and
no --repo-dir or signing home created; the genuine bundle, pushed last, goes through the same spies into the registry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import VENV_BIN
from tests.integration.test_mirror_images import CANARY, CANARY_USER, _plan_images, _seed
from tests.integration.test_mirror_images import env as env  # noqa: F401 - the module's registries (a fixture)

LOCK, SIG, SUM = "bundle.lock.json", "bundle.lock.json.dsse", "bundle.lock.json.sha256"


def _spies(root: Path) -> tuple[Path, dict[str, str]]:
    """A directory with skopeo and helm wrappers that append their argv to a log and exec the real tool; the log and
    the environment that puts them in use."""
    from installer.tools import ensure_helm

    spy = root / "spies"
    spy.mkdir(exist_ok=True)
    log = spy / "calls.log"
    real = {"skopeo": shutil.which("skopeo") or "/usr/bin/skopeo", "helm": str(ensure_helm())}
    for name, path in real.items():
        (spy / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec "{path}" "$@"\n')
        (spy / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{spy}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
           "GPU_INSTALL_HELM": str(spy / "helm"), "MIRROR_TEST_USER": CANARY_USER, "MIRROR_TEST_PASSWORD": CANARY}
    return log, env


def _gi(env: dict[str, str], *argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "gpu-install"), *map(str, argv)], capture_output=True, text=True, env=env,
                          timeout=300)


def _catalog(env: dict) -> list[str]:
    """The repositories the site registry holds (its /v2/_catalog, authenticated, trusting the test CA)."""
    ctx = ssl.create_default_context(cafile=str(env["certs"] / "ca.crt"))
    req = urllib.request.Request(f"https://{env['site_reg']}/v2/_catalog", headers={
        "Authorization": "Basic " + base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode()})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        return list(json.loads(resp.read())["repositories"])


def _fingerprint(pem: Path) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

    return hashlib.sha256(load_pem_public_key(pem.read_bytes()).public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def test_forged_bundles_are_refused_with_nothing_pushed(env, tmp_path):  # noqa: F811 - the imported fixture
    from installer.mirror import bundle as lockfile
    from installer.signing import load_or_create

    for img in _plan_images(env):
        _seed(env, img.source)
    doc = yaml.safe_load(env["site"].read_text())
    doc["registry"]["prefix"] = "signature"  # a prefix of its own in the module's registry: empty until the end
    doc["mirror"].pop("trustedKeys", None)  # pinned with --trusted-key below, then in the site file
    site = tmp_path / "site.yaml"
    site.write_text(json.dumps(doc))
    log, spy_env = _spies(tmp_path)
    genuine = tmp_path / "genuine"
    pull = _gi(spy_env, "mirror", "pull", "--skip-packages", "-s", site, "--os", "ubuntu22.04", "-o", genuine,
               "--key-home", tmp_path / "connected-key")
    assert pull.returncode == 0, pull.stderr
    pem = tmp_path / "connected-key" / "signing-key.pub.pem"
    assert f"key fingerprint {_fingerprint(pem)}" in pull.stderr, pull.stderr
    assert log.read_text().count("skopeo ") >= 1  # the spies are in use (pull copied through them)
    log.unlink()
    before = [r for r in _catalog(env) if r.startswith("signature/")]
    assert before == []

    lock = json.loads((genuine / LOCK).read_text())
    first = lock["images"][0]
    edited = json.dumps({**lock, "images": [{**first, "destination": f"{env['site_reg']}/payments/api:prod"},
                                            *lock["images"][1:]]}, indent=2) + "\n"
    attacker = load_or_create(tmp_path / "attacker-key")

    def forge(name: str) -> Path:
        path = tmp_path / name
        shutil.copytree(genuine, path, copy_function=os.link)  # the layout shared by hard links: nothing rewritten
        for f in (LOCK, SIG, SUM):
            (path / f).unlink()
            shutil.copy(genuine / f, path / f)
        return path

    # 1. the lock edited, its checksum recomputed (the checksum agrees; the signature does not)
    b1 = forge("edited")
    (b1 / LOCK).write_text(edited)
    (b1 / SUM).write_text(f"{hashlib.sha256(edited.encode()).hexdigest()}  {LOCK}\n")
    # 2. the edited lock re-signed with the attacker's own key (a consistent bundle: lock, checksum, signature)
    b2 = forge("re-signed")
    lockfile.write_lock(b2, json.loads(edited))
    lockfile.finish(b2, attacker)
    # 3. the signature removed
    b3 = forge("unsigned")
    (b3 / SIG).unlink()
    cases = [(b1, f"{b1 / LOCK}: not the lock {SIG} signed"),
             (b2, f"{b2 / SIG}: signed by key {attacker.fingerprint}, which is not pinned here (pinned: "
                  f"{_fingerprint(pem)}"),
             (b3, f"{b3 / SIG}: missing: the bundle is unsigned")]
    for forged, message in cases:
        repo, home = tmp_path / f"repo-{forged.name}", tmp_path / f"signing-{forged.name}"
        proc = _gi(spy_env, "mirror", "push", forged, "-s", site, "--trusted-key", pem, "--repo-dir", repo,
                   "--signing-home", home)
        assert proc.returncode == 2 and message in proc.stderr, (forged.name, proc.stderr)
        assert "hint: " in proc.stderr and "mirror.trustedKeys" in proc.stderr, proc.stderr
        assert not log.exists(), (forged.name, log.read_text())  # neither skopeo nor helm ran
        assert not repo.exists() and not home.exists()  # nothing published, no site key made
        proc = _gi(spy_env, "mirror", "verify", "-s", site, "--os", "ubuntu22.04", "--bundle", forged,
                   "--trusted-key", pem)
        assert proc.returncode == 2 and message in proc.stderr, (forged.name, proc.stderr)
        assert not log.exists(), (forged.name, log.read_text())
    assert [r for r in _catalog(env) if r.startswith(("signature/", "payments/"))] == []

    # a key pinned in the site file works as the flag does; the genuine bundle goes through the same spies
    doc["mirror"]["trustedKeys"] = [str(pem)]
    site.write_text(json.dumps(doc))
    proc = _gi(spy_env, "mirror", "push", genuine, "-s", site)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().count("skopeo copy") == len(lock["images"]), log.read_text()
    pushed = {e["destination"].split("/", 1)[1].rsplit(":", 1)[0] for e in lock["images"]}
    assert pushed <= set(_catalog(env)) and all(r.startswith("signature/") for r in pushed), _catalog(env)
    proc = _gi(spy_env, "mirror", "verify", "-s", site, "--os", "ubuntu22.04", "--bundle", genuine)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("pinned", ["none", "other"])
def test_a_site_without_the_right_key_pinned_refuses(env, tmp_path, pinned):  # noqa: F811
    """No key pinned at all, or only a key that did not sign: exit 2 with the first-time flow as hint."""
    from installer.mirror import bundle as lockfile
    from installer.signing import load_or_create

    bundle = tmp_path / "bundle"
    lockfile.write_lock(bundle, {"schema": lockfile.SCHEMA, "complete": False, "registry": env["site_reg"],
                                 "images": [], "failed": []})
    lockfile.finish(bundle, load_or_create(tmp_path / "connected-key"))
    log, spy_env = _spies(tmp_path)
    doc = yaml.safe_load(env["site"].read_text())
    doc["mirror"].pop("trustedKeys", None)
    if pinned == "other":
        doc["mirror"]["trustedKeys"] = [str(load_or_create(tmp_path / "other-key").public_path)]
    site = tmp_path / "site.yaml"
    site.write_text(json.dumps(doc))
    proc = _gi(spy_env, "mirror", "push", bundle, "-s", site)
    assert proc.returncode == 2, proc.stderr
    want = "no bundle signing key is pinned on this side" if pinned == "none" else "which is not pinned here"
    assert want in proc.stderr and "first time: on the connected side" in proc.stderr, proc.stderr
    assert not log.exists()
