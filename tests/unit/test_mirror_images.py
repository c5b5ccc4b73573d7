"""The pure parts of `mirror pull`/`push` (installer/mirror/images.py): upstream remap, the lock and its checksum, the
layout checks, the temporary authfile. The transfers themselves: tests/integration/test_mirror_images.py."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from installer.errors import ConfigError
from installer.mirror import bundle as b
from installer.mirror import common
from installer.mirror import images as m


@pytest.mark.parametrize("source,upstream,expected", [
    ("nvcr.io/nvidia/gpu-operator:v24.9.2", {"nvcr.io": "mirror.internal:5000"},
     "mirror.internal:5000/nvidia/gpu-operator:v24.9.2"),
    ("nvcr.io/nvidia/gpu-operator:v24.9.2", {"nvcr.io": "mirror.internal/nv"}, "mirror.internal/nv/nvidia/gpu-operator:v24.9.2"),
    ("registry.k8s.io/nfd/node-feature-discovery:v0.16.6", {"nvcr.io": "m.lab"},
     "registry.k8s.io/nfd/node-feature-discovery:v0.16.6"),
    ("nvcr.io/nvidia/x@sha256:" + "a" * 64, {"nvcr.io": "m.lab"}, "m.lab/nvidia/x@sha256:" + "a" * 64),
    ("busybox:1", {"docker.io": "m.lab"}, "m.lab/library/busybox:1"),
    ("nvidia/cuda:12", {"docker.io": "m.lab"}, "m.lab/nvidia/cuda:12"),
    ("localhost:5000/a:1", {"localhost:5000": "m.lab"}, "m.lab/a:1"),
])
def test_pull_from_remaps_the_registry_only(source, upstream, expected):
    assert m.pull_from(source, upstream) == expected


def test_ref_name_is_the_source_with_a_digest_as_tag_separator():
    assert m.ref_name("nvcr.io/nvidia/x:1") == "nvcr.io/nvidia/x:1"
    assert m.ref_name("nvcr.io/nvidia/x@sha256:" + "b" * 64) == "nvcr.io/nvidia/x:sha256:" + "b" * 64


def test_the_authfile_is_private_and_removed():
    with m.authfile(b'{"auths": {"r.lab": {"auth": "eDp5"}}}') as path:
        assert path is not None
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert json.loads(Path(path).read_text())["auths"]["r.lab"]["auth"] == "eDp5"
    assert not os.path.exists(path)
    with m.authfile(None) as none:
        assert none is None


def test_credentials_are_redacted_from_skopeo_messages():
    config = json.dumps({"auths": {"r.lab": {"username": "u", "password": "s3cret-pw", "auth": "dTpzM2NyZXQtcHc="}}})
    secrets = m.secrets_of(config.encode())
    assert "s3cret-pw" in secrets and "u" not in secrets  # the user name is no secret (and would redact too much)
    stderr = 'time="x" level=fatal msg="auth s3cret-pw dTpzM2NyZXQtcHc= refused: \\"unauthorized\\""\n'
    assert common.skopeo_message(stderr, secrets) == 'auth *** *** refused: "unauthorized"'


def _layout(tmp_path: Path) -> tuple[Path, str]:
    """A bundle with one tiny image in its layout; the image's manifest digest."""
    from gpu_install_lab.images import write_layout

    bundle = tmp_path / "bundle"
    write_layout(bundle / "images", "nvcr.io/nvidia/gpu-operator:v24.9.2", ["/bin/sh"], busybox=b"stand-in" * 10)
    digest = json.loads((bundle / "images" / "index.json").read_text())["manifests"][0]["digest"]
    lock = {"schema": b.SCHEMA, "complete": True, "release": "v24.9.2", "registry": "r.lab:5000",
            "platform": "linux/amd64", "layout": "images", "failed": [],
            "images": [{"source": "nvcr.io/nvidia/gpu-operator:v24.9.2",
                        "destination": "r.lab:5000/nvidia/gpu-operator:v24.9.2", "digest": digest,
                        "refName": "nvcr.io/nvidia/gpu-operator:v24.9.2", "component": "operator", "size": 1}]}
    b.write_lock(bundle, lock)
    return bundle, digest


def _sign(tmp_path: Path, bundle: Path, lock: dict | None = None) -> list[Path]:
    """Write lock (when given) as pull does and sign it with a key of tmp_path (finish, which also marks it complete
    when nothing failed); the public key, to pin."""
    from installer import signing

    key = signing.load_or_create(tmp_path / "key")
    if lock is not None:
        b.write_lock(bundle, lock)
    b.finish(bundle, key)
    return [key.public_path]


def test_the_lock_checksum_is_sha256sum_format_and_checked(tmp_path):
    """The checksum catches damage for pull and `sha256sum -c`; push trusts the signature, not the checksum."""
    bundle, _ = _layout(tmp_path)
    line = (bundle / b.CHECKSUM).read_text()
    assert line == f"{hashlib.sha256((bundle / b.LOCK).read_bytes()).hexdigest()}  {b.LOCK}\n"
    trusted = _sign(tmp_path, bundle)
    assert b.bundle_for_push(bundle, trusted)["complete"] is True
    text = (bundle / b.LOCK).read_text()
    edited = text.replace("r.lab:5000/nvidia", "evil.lab/nvidia")
    (bundle / b.LOCK).write_text(edited)
    with pytest.raises(ConfigError, match="checksum mismatch"):
        b.read_lock(bundle)
    (bundle / b.CHECKSUM).write_text(f"{hashlib.sha256(edited.encode()).hexdigest()}  {b.LOCK}\n")
    assert b.read_lock(bundle)["images"][0]["destination"].startswith("evil.lab/nvidia/")  # no defence
    with pytest.raises(ConfigError, match="changed after signing"):
        b.bundle_for_push(bundle, trusted)
    (bundle / b.LOCK).write_text(text)
    (bundle / b.CHECKSUM).unlink()
    assert b.bundle_for_push(bundle, trusted)["images"][0]["destination"].startswith("r.lab:5000/nvidia/")


def test_an_incomplete_bundle_is_refused_naming_what_failed(tmp_path):
    bundle, _ = _layout(tmp_path)
    lock = b.read_lock(bundle)
    trusted = _sign(tmp_path, bundle, {**lock, "failed": [{"source": "nvcr.io/nvidia/y:2", "error": "x"}]})
    with pytest.raises(ConfigError, match=r"incomplete \(failed: nvcr.io/nvidia/y:2\)"):
        b.bundle_for_push(bundle, trusted)
    from installer import signing

    b.write_lock(bundle, {**lock, "schema": "something/v9"})  # signed as it is (finish would refuse to read it)
    (bundle / b.SIGNATURE).write_bytes(signing.sign(signing.load_or_create(tmp_path / "key"),
                                                    (bundle / b.LOCK).read_bytes(), b.PAYLOAD_TYPE))
    with pytest.raises(ConfigError, match="not a gpu-install.bundle-lock/v1 lock"):
        b.bundle_for_push(bundle, trusted)


def test_layout_checks_find_a_missing_or_changed_blob(tmp_path):
    bundle, digest = _layout(tmp_path)
    layout = m.Layout(bundle / "images")
    assert layout.complete("nvcr.io/nvidia/gpu-operator:v24.9.2", digest) and layout.verify(digest) is None
    assert not layout.complete("nvcr.io/nvidia/x:2", digest)
    doc = json.loads(layout.blob(digest).read_bytes())
    blob = layout.blob(doc["layers"][0]["digest"])
    blob.write_bytes(blob.read_bytes() + b"!")
    assert "does not match its digest" in (layout.verify(digest) or "")
    blob.unlink()
    assert not layout.complete("nvcr.io/nvidia/gpu-operator:v24.9.2", digest)
    assert "missing" in (layout.verify(digest) or "")


def test_push_refuses_a_damaged_bundle_or_another_registry_before_contacting_anything(tmp_path, monkeypatch):
    from installer.config import parse_site

    monkeypatch.setattr(common, "skopeo", lambda: pytest.fail("skopeo must not run"))
    bundle, digest = _layout(tmp_path)
    b.signed_lock(bundle, _sign(tmp_path, bundle))  # as `mirror push` does first
    other = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "other.lab"}})
    with pytest.raises(ConfigError, match="pulled for registry r.lab:5000, the site file names other.lab"):
        m.push(other, bundle, config_json=None)
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.lab:5000"}})
    layout = m.Layout(bundle / "images")
    config = json.loads(layout.blob(digest).read_bytes())["config"]["digest"]
    layout.blob(config).write_bytes(b"{}")
    with pytest.raises(ConfigError,
                       match="image nvcr.io/nvidia/gpu-operator:v24.9.2: blob .* does not match its digest"):
        m.push(site, bundle, config_json=None)


def test_pull_refuses_a_bundle_path_with_a_colon(tmp_path):
    with pytest.raises(ConfigError, match="has a ':'"):
        m.pull(object(), [], tmp_path / "a:b")


def test_the_mirror_plan_says_what_the_bundle_carries(site_data):
    from installer.config import parse_site
    from tests.conftest import plan_of

    plan = plan_of(parse_site(site_data), os_tags=("ubuntu22.04",))
    assert "mirror pull/push carry the images, the chart" in plan.artifacts().notes
    site_data["driver"] = {"mode": "host"}
    plan = plan_of(parse_site(site_data), os_tags=("ubuntu22.04",))
    assert "mirror pull/push carry the images, the chart; the OS packages with their closure, resolved at pull " \
           "against mirror.packageRepositories, and published signed by push --repo-dir" in plan.artifacts().notes


def test_jobs_below_one_is_refused_before_anything_is_copied(tmp_path):
    with pytest.raises(ConfigError, match="--jobs 0"):
        m.push(object(), tmp_path, config_json=None, jobs=0)
    assert list(tmp_path.iterdir()) == []


def test_platform_digest_picks_the_instance_sync_copies():
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": "sha256:" + "b" * 64, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}]})
    raw = index.encode()
    assert m.platform_digest(raw, "linux/amd64") == ("sha256:" + "a" * 64, "")
    assert m.platform_digest(raw, "linux/arm64/v8") == ("sha256:" + "b" * 64, "")
    assert m.platform_digest(raw, m.ALL_PLATFORMS) == ("sha256:" + hashlib.sha256(raw).hexdigest(), "")
    missing, why = m.platform_digest(raw, "linux/s390x")
    assert missing is None and "no linux/s390x image" in why
    single = b'{"schemaVersion": 2, "config": {}, "layers": []}'
    assert m.platform_digest(single, "linux/arm64") == ("sha256:" + hashlib.sha256(single).hexdigest(), "")


def test_take_turns_never_runs_two_copies_of_one_layer_and_fills_free_slots_meanwhile():
    """a and b share a layer, c has its own: with 3 slots a and c start at once, b waits for a to end (its slot
    stays free meanwhile instead of blocking on a), and every result comes back under its key. a ends only after c
    started, so the order shows c ran alongside a."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    log: list[str] = []
    c_started = threading.Event()

    def run(key: str) -> str:
        log.append(f"{key}+")
        if key == "c":
            c_started.set()
        if key == "a":
            assert c_started.wait(5), "c did not start while a ran"
        log.append(f"{key}-")
        return key.upper()

    tasks = [("a", frozenset({"base", "x"})), ("b", frozenset({"base", "y"})), ("c", frozenset({"z"}))]
    with ThreadPoolExecutor(max_workers=3) as pool:
        out = m.take_turns(pool, 3, tasks, run)
    assert out == {"a": "A", "b": "B", "c": "C"}
    assert log.index("b+") > log.index("a-")  # b waited for the copy bringing the shared layer
    assert log.index("c+") < log.index("a-")  # c did not wait
    # one slot: strictly one after another, in order
    log.clear()
    c_started.set()
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert m.take_turns(pool, 1, tasks, run) == {"a": "A", "b": "B", "c": "C"}
    assert log == ["a+", "a-", "b+", "b-", "c+", "c-"]
    assert m.layer_digests(b'{"layers": [{"digest": "sha256:1"}], "config": {"digest": "sha256:2"}}') == {"sha256:1"}


def test_take_turns_lets_copies_whose_shared_layers_are_already_brought_run_side_by_side():
    """a brings base; b, c and d share base with a (and b, c also share y): each waits for a, and once a has ended
    base holds nobody back, so b and d then run side by side (both must be running before either ends). c, which
    shares y with b -- not yet brought while b runs -- waits for b."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    log: list[str] = []
    b_and_d = threading.Barrier(2, timeout=5)

    def run(key: str) -> str:
        log.append(f"{key}+")
        if key in ("b", "d"):
            b_and_d.wait()  # raises BrokenBarrierError when the other one is held back
        log.append(f"{key}-")
        return key

    tasks = [("a", frozenset({"base"})), ("b", frozenset({"base", "y"})), ("c", frozenset({"base", "y"})),
             ("d", frozenset({"base", "z"}))]
    with ThreadPoolExecutor(max_workers=3) as pool:
        assert m.take_turns(pool, 3, tasks, run) == {k: k for k in "abcd"}
    assert log.index("b+") > log.index("a-") and log.index("d+") > log.index("a-")
    assert log.index("c+") > log.index("b-")


def test_a_pull_killed_between_the_lock_and_its_checksum_resumes_from_the_lock(tmp_path):
    """load_for_update: the checksum file of the previous lock (the kill came between the two writes) does not throw
    the finished entries away -- pull re-checks each against the layout before reusing it; push still refuses."""
    lock = {"schema": b.SCHEMA, "complete": False, "release": "v24.9.2", "registry": "r.lab:5000",
            "platform": "linux/amd64", "layout": "images", "failed": [], "images": [{"source": "x", "digest": "d"}]}
    b.write_lock(tmp_path, lock)
    (tmp_path / b.CHECKSUM).write_text("0" * 64 + f"  {b.LOCK}\n")
    assert b.load_for_update(tmp_path)["images"] == [{"source": "x", "digest": "d"}]
    from installer import signing

    with pytest.raises(ConfigError, match="the bundle is unsigned"):
        b.bundle_for_push(tmp_path, [signing.load_or_create(tmp_path / "key").public_path])
    (tmp_path / b.LOCK).write_text("{not json")
    assert b.load_for_update(tmp_path) == {}
