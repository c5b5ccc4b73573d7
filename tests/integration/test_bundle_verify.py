"""`mirror verify --bundle` and `mirror push` against real registries (tests/integration/test_mirror_images.py's
fixture: a real upstream and site registry, STAND-IN images, the connected side's real bundle key pinned in the site
file): what they require of a genuinely signed lock before anything else.

- A pull where every image failed (the upstream holds none yet) signs a lock with "complete": false; verify said
  "all 0 images are in …" and exited 0. Both commands now exit 2 naming the images that failed.
- A genuinely signed bundle of the same release, months old (its "created" set back and signed again with the pinned
  key: what an old bundle kept on a share looks like), is refused past mirror.maxBundleAge with exit 2 naming its age
  and the field, and only warned about without it; nothing reaches the site registry while it is refused.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from tests.integration.test_bundle_adversarial import _catalog
from tests.integration.test_mirror_images import CANARY, CANARY_USER, _plan_images, _seed
from tests.integration.test_mirror_images import env as env  # noqa: F401 - the module's registries (a fixture)


def _site_with(env: dict, tmp_path: Path, **mirror) -> Path:
    doc = yaml.safe_load(env["site"].read_text())
    doc["mirror"].update(mirror)
    site = tmp_path / f"site-{len(list(tmp_path.glob('site-*')))}.yaml"
    site.write_text(yaml.safe_dump(doc))
    return site


def _aged(bundle: Path, out: Path, key_home: Path, days: int) -> Path:
    """A copy of bundle whose lock says it was created days ago, signed with the pinned key as finish() signs."""
    from installer import signing
    from installer.mirror import bundle as b

    shutil.copytree(bundle, out, symlinks=True)
    lock = json.loads((out / b.LOCK).read_text())
    lock["created"] = (datetime.now(UTC) - timedelta(days=days)).strftime(b.CREATED_FORMAT)
    b.write_lock(out, lock)
    raw = (out / b.LOCK).read_bytes()
    (out / b.SIGNATURE).write_bytes(signing.sign(signing.load_or_create(key_home), raw, b.PAYLOAD_TYPE))
    return out


def test_verify_and_push_refuse_a_bundle_whose_images_all_failed(env, cli, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    bundle = tmp_path / "bundle"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", bundle, "-q")
    assert rc == 4, err  # nothing upstream yet: every image fails, the chart is pulled, the lock is signed anyway
    lock = json.loads((bundle / "bundle.lock.json").read_text())
    assert lock["complete"] is False and lock["images"] == [] and lock["failed"] and lock["created"]
    assert (bundle / "bundle.lock.json.dsse").is_file()
    first = lock["failed"][0]["source"]
    rc, out, err = cli("mirror", "verify", "-s", env["site"], "--os", "ubuntu22.04", "--bundle", bundle)
    assert rc == 2, (out, err)
    assert f"the bundle is incomplete (failed: {first}" in err and "all 0 images" not in err, err
    assert "mirror pull again" in err
    rc, _, err2 = cli("mirror", "push", bundle, "-s", env["site"])
    assert rc == 2 and f"the bundle is incomplete (failed: {first}" in err2, err2
    assert _catalog(env) == []


def test_an_old_bundle_is_refused_past_max_bundle_age_and_warned_about_without(env, cli, monkeypatch,  # noqa: F811
                                                                                 tmp_path):
    monkeypatch.setenv("MIRROR_TEST_USER", CANARY_USER)
    monkeypatch.setenv("MIRROR_TEST_PASSWORD", CANARY)
    for img in _plan_images(env):
        _seed(env, img.source)
    genuine = tmp_path / "genuine"
    rc, _, err = cli("mirror", "pull", "--skip-packages", "-s", env["site"], "--os", "ubuntu22.04", "-o", genuine,
                     "-q")
    assert rc == 0, err
    old = _aged(genuine, tmp_path / "old", env["key_home"], days=120)
    created = json.loads((old / "bundle.lock.json").read_text())["created"]
    strict = _site_with(env, tmp_path, maxBundleAge=90)
    for command in (["mirror", "push", old, "-s", strict],
                    ["mirror", "verify", "-s", strict, "--os", "ubuntu22.04", "--bundle", old]):
        rc, out, err = cli(*command)
        assert rc == 2, (command, out, err)
        assert f"the bundle is 120 days old (created {created}), older than mirror.maxBundleAge (90 days)" in err, err
        assert _catalog(env) == [], "nothing may be pushed"
    # without the field: a warning naming the age and the field, and the push goes on
    rc, _, err = cli("mirror", "push", old, "-s", env["site"], "-q")
    assert rc == 0, err
    assert "warning: " in err and "the bundle is 120 days old" in err and "mirror.maxBundleAge" in err, err
    # the fresh bundle passes both under the limit, verified by digest
    rc, _, err = cli("mirror", "verify", "-s", strict, "--os", "ubuntu22.04", "--bundle", genuine)
    assert rc == 0, err
    n = len(json.loads((genuine / "bundle.lock.json").read_text())["images"])
    assert f"all {n} images are in {env['site_reg']}" in err and "warning" not in err, err
