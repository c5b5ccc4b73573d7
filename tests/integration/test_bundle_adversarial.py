"""Forged bundles against a real site registry: a real `mirror pull` (STAND-IN images from a real upstream registry,
tests/integration/test_mirror_images.py's fixture), then copies of that bundle whose lock an attacker changed and
signed again with the pinned key (the connected side's key, stolen or turned: the signature verifies, so only push's
own checks stand between the lock and the registry). Each forged push is exit 2 naming the entry, and the site
registry's catalog stays EMPTY; the unforged bundle, pushed last, fills it (the control).
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import urllib.request
from pathlib import Path

from tests.integration.test_mirror_images import CANARY, CANARY_USER, _plan_images, _seed, env  # noqa: F401

SOURCE = "nvcr.io/nvidia/gpu-operator:v24.9.2"


def _catalog(registry: dict) -> list[str]:
    """The repositories the site registry holds (GET /v2/_catalog with the site credentials and CA)."""
    ctx = ssl.create_default_context(cafile=str(registry["certs"] / "ca.crt"))
    req = urllib.request.Request(f"https://{registry['site_reg']}/v2/_catalog")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode())
    with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:  # noqa: S310 - the test's own registry
        return list(json.loads(resp.read())["repositories"] or [])


def _forge(bundle: Path, out: Path, key_home: Path, change) -> Path:
    """A copy of bundle whose lock change() edits, checksummed and signed again with the pinned key."""
    from installer import signing
    from installer.mirror import bundle as b

    shutil.copytree(bundle, out, symlinks=True)
    lock = json.loads((out / b.LOCK).read_text())
    change(lock, out)
    b.write_lock(out, lock)
    b.finish(out, signing.load_or_create(key_home))
    return out


def test_forged_bundles_copy_nothing_into_a_real_registry(env, cli, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    images = _plan_images(env)
    assert SOURCE in {i.source for i in images}
    for img in images:
        _seed(env, img.source)
    bundle, key_home = tmp_path / "bundle", env["key_home"]  # the connected side's key, which the site file pins
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", bundle, "-q")
    assert rc == 0, err
    assert _catalog(env) == []
    site_reg = env["site_reg"]
    destination = f"{site_reg}/mirror/nvidia/gpu-operator:v24.9.2"

    def image(lock: dict) -> dict:
        return next(e for e in lock["images"] if e["source"] == SOURCE)

    def outside(lock: dict, out: Path) -> None:
        shutil.copytree(out / "images", tmp_path / "outside-layout")
        lock["layout"] = str(tmp_path / "outside-layout")

    def linked(lock: dict, out: Path) -> None:
        shutil.move(out / "images", tmp_path / "linked-layout")
        (out / "images").symlink_to(tmp_path / "linked-layout")

    forgeries = {
        "another repository": (lambda lock, out: image(lock).update(destination=f"{site_reg}/payments/api:prod"),
                               f"{site_reg}/payments/api:prod"),
        "another registry": (lambda lock, out: image(lock).update(destination="ghcr.io/victim-org/app:latest"),
                             "ghcr.io/victim-org/app:latest"),
        "a source in the site registry": (
            lambda lock, out: image(lock).update(source=f"{site_reg}/payments/api:prod",
                                                 refName=f"{site_reg}/payments/api:prod",
                                                 destination=f"{site_reg}/mirror/payments/api:prod"),
            "is not an image this site's plan pulls"),
        "a chart name with ../": (lambda lock, out: lock["charts"][0].update(name="../../payments"),
                                  "'../../payments' is not a chart name"),
        "a layout outside the bundle": (outside, "is not a path inside the bundle"),
        "a layout linked out of the bundle": (linked, "leads outside the bundle"),
    }
    for n, (what, (change, said)) in enumerate(forgeries.items()):
        forged = _forge(bundle, tmp_path / f"forged-{n}", key_home, change)
        rc, _, err = cli("mirror", "push", forged, "-s", env["site"])
        assert rc == 2 and said in err, (what, err)
        if what in ("another repository", "another registry"):
            assert f"expected {destination}" in err, (what, err)
        assert _catalog(env) == [], f"{what}: something was copied"
        assert CANARY not in err

    # the control: the bundle as pulled is pushed, digests and all
    rc, _, err = cli("mirror", "push", bundle, "-s", env["site"], "-q")
    assert rc == 0, err
    assert "mirror/nvidia/gpu-operator" in _catalog(env)
    assert not any("payments" in r or "victim" in r for r in _catalog(env))
