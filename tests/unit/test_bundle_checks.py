"""What push and `mirror verify --bundle` require of a signed lock before anything else (installer.mirror.bundle
check_complete / check_age), and the lock checks no other test reached (installer.mirror.lock: a lock of another
release, base[] entries outside registry.host, a chart entry whose file name is not the chart's).

Bundles are real: a real OCI layout of a STAND-IN image at the exact source of an image the site's plan pulls
(tests/unit/test_bundle_adversarial.py's), its lock signed with a real Ed25519 key by finish() or, for a lock
finish() would not write (an old "created", none at all), by installer.signing.sign over the exact bytes -- what a
genuine older bundle, or the holder of the key, could hand over. A refusal is exit 2 with nothing copied: the spy
skopeo/helm on PATH logs no call.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from installer import signing
from installer.errors import EXIT_USAGE, ConfigError
from installer.mirror import bundle as b
from installer.mirror import verify
from tests.conftest import staged_charts
from tests.unit.test_bundle_adversarial import (
    DESTINATION,
    REGISTRY,
    SITE,
    _bundle,
    _edit,
    _lock,
    _refused,
    _site,
    _with_chart,
    spy,  # noqa: F401 - a fixture, used by the tests that name it
)

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def _signed(tmp_path: Path, bundle: Path, lock: dict | None = None) -> list[Path]:
    """The bundle's lock (or lock, written first) signed exactly as it is -- finish() would set "complete" and
    "created" itself -- with a key of tmp_path; the public key to pin."""
    key = signing.load_or_create(tmp_path / "key")
    if lock is not None:
        b.write_lock(bundle, lock)
    (bundle / b.SIGNATURE).write_bytes(signing.sign(key, (bundle / b.LOCK).read_bytes(), b.PAYLOAD_TYPE))
    return [key.public_path]


def _created(days_ago: float) -> str:
    return (NOW - timedelta(days=days_ago)).strftime(b.CREATED_FORMAT)


# ---------------------------------------------------------------- completeness: push and verify alike


def test_an_incomplete_bundle_is_refused_by_verify_as_by_push_naming_what_failed(tmp_path, spy):  # noqa: F811
    bundle, _ = _bundle(tmp_path)
    failed = [{"source": "nvcr.io/nvidia/gpu-operator:v24.9.2", "pulledFrom": "x", "error": "manifest unknown"},
              {"kind": "chart", "ref": "https://x/gpu-operator", "error": "404"}]
    lock = _edit(bundle, lambda lock: lock.update(complete=False, images=[], failed=failed))
    trusted = _signed(tmp_path, bundle)
    want = r"the bundle is incomplete \(failed: nvcr.io/nvidia/gpu-operator:v24.9.2, https://x/gpu-operator\)"
    for call in (lambda: b.bundle_for_push(bundle, trusted), lambda: verify.from_lock(_site(), lock, bundle)):
        with pytest.raises(ConfigError, match=want) as exc:
            call()
        assert exc.value.exit_code == EXIT_USAGE and "mirror pull again" in str(exc.value.hint)
    assert spy() == []


def test_a_killed_pull_and_a_long_failure_list_are_named_bounded(tmp_path):
    bundle, _ = _bundle(tmp_path)
    lock = _edit(bundle, lambda lock: lock.update(complete=False))
    with pytest.raises(ConfigError, match=r"incomplete \(its pull did not finish\)"):
        b.check_complete(bundle, lock)
    many = [{"source": f"nvcr.io/nvidia/x{n}:{'1' * 500}"} for n in range(50)]
    with pytest.raises(ConfigError, match=r", and 30 more\)") as exc:
        b.check_complete(bundle, {**lock, "failed": many})
    assert len(exc.value.message) < 20 * 210 + 300


def test_a_lock_without_images_never_passes_verify(tmp_path, spy):  # noqa: F811
    """"all 0 images are in …" was a pass: a lock carrying no image and building on none is no pull of a site's
    plan (every plan deploys the GPU Operator's images); an incremental bundle whose images are all in base is."""
    bundle, digest = _bundle(tmp_path)
    lock = _edit(bundle, lambda lock: lock.update(images=[]))
    trusted = _signed(tmp_path, bundle)
    assert b.bundle_for_push(bundle, trusted)["images"] == []  # push: a bundle of charts and files only is pushed
    with pytest.raises(ConfigError, match="the bundle carries no image \\(and builds on none\\)") as e:
        verify.from_lock(_site(), b.bundle_for_push(bundle, trusted), bundle)
    assert e.value.exit_code == EXIT_USAGE
    base = [{"source": "nvcr.io/nvidia/gpu-operator:v24.9.2", "destination": DESTINATION, "digest": digest}]
    lock = _edit(bundle, lambda lock: lock.update(base=base))
    assert verify.from_lock(_site(), lock, bundle) == [verify.Wanted(base[0]["source"], DESTINATION, digest)]
    with pytest.raises(ConfigError, match=f"no image to check in {REGISTRY}: a site's plan always has images") as e:
        verify.require(_site(), [], config_json=None)
    assert e.value.exit_code == EXIT_USAGE
    assert spy() == []


# ---------------------------------------------------------------- the bundle's age


def test_finish_records_when_it_signed(tmp_path):
    bundle, _ = _bundle(tmp_path)
    before = datetime.now(UTC).replace(microsecond=0)
    lock = b.finish(bundle, signing.load_or_create(tmp_path / "key"))
    created = datetime.strptime(lock["created"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= created <= datetime.now(UTC)
    assert b.signed_lock(bundle, [tmp_path / "key" / "signing-key.pub.pem"])["created"] == lock["created"]
    b.check_age(bundle, lock, 1, warn=pytest.fail)  # a fresh bundle: no warning, within any limit


@pytest.mark.parametrize("days, max_age, outcome", [
    (2, None, None), (29.9, None, None), (31, None, "warn"), (400, None, "warn"),
    (31, 60, "warn"), (59, 60, "warn"), (61, 60, "refuse"), (2, 1, "refuse"), (0.5, 1, None),
])
def test_an_old_bundle_is_warned_about_and_refused_past_max_bundle_age(tmp_path, days, max_age, outcome):
    bundle = tmp_path / "bundle"
    lock = {"created": _created(days)}
    warned: list[str] = []
    if outcome == "refuse":
        with pytest.raises(ConfigError, match=rf"the bundle is {int(days)} days old \(created {_created(days)}\), "
                                              rf"older than mirror.maxBundleAge \({max_age} days\)") as exc:
            b.check_age(bundle, lock, max_age, now=NOW, warn=warned.append)
        assert exc.value.exit_code == EXIT_USAGE and "mirror pull" in str(exc.value.hint)
        assert "raise mirror.maxBundleAge" in str(exc.value.hint)
        return
    b.check_age(bundle, lock, max_age, now=NOW, warn=warned.append)
    if outcome is None:
        assert warned == []
    else:
        assert len(warned) == 1 and f"the bundle is {int(days)} days old" in warned[0], warned
        assert "mirror.maxBundleAge" in warned[0]


def test_a_lock_without_a_creation_time_is_warned_about_and_refused_only_with_max_bundle_age(tmp_path):
    bundle = tmp_path / "bundle"
    warned: list[str] = []
    b.check_age(bundle, {}, None, now=NOW, warn=warned.append)
    assert len(warned) == 1 and "records no creation time (a bundle from an older gpu-install)" in warned[0]
    with pytest.raises(ConfigError, match=r"records no creation time .* against mirror.maxBundleAge \(30 days\)"):
        b.check_age(bundle, {}, 30, now=NOW, warn=pytest.fail)


@pytest.mark.parametrize("created", ["2026-06-01", "2026-06-01T12:00:00+00:00", "yesterday", 1748779200, ["x"],
                                     "2026-13-01T00:00:00Z", "9" * 5000])
def test_a_creation_time_not_as_pull_writes_it_is_refused(tmp_path, created):
    with pytest.raises(ConfigError, match=r"created .* is not a UTC time as mirror pull writes it") as exc:
        b.check_age(tmp_path, {"created": created}, None, now=NOW, warn=pytest.fail)
    assert len(exc.value.message) < 300


def test_a_creation_time_ahead_of_the_clock_is_named(tmp_path):
    """A lock "created" days ahead would stay young past mirror.maxBundleAge: refused when that is set."""
    ahead = {"created": _created(-3)}
    warned: list[str] = []
    b.check_age(tmp_path, ahead, None, now=NOW, warn=warned.append)
    assert len(warned) == 1 and "3 day(s) ahead of this machine's clock" in warned[0]
    with pytest.raises(ConfigError, match="ahead of this machine's clock .* cannot be checked against "
                                          "mirror.maxBundleAge"):
        b.check_age(tmp_path, ahead, 30, now=NOW, warn=pytest.fail)
    b.check_age(tmp_path, {"created": _created(-0.5)}, 30, now=NOW, warn=pytest.fail)  # within the clock skew


def test_push_refuses_a_genuinely_signed_old_bundle_before_anything_is_copied(tmp_path, spy, capsys):  # noqa: F811
    """The replay: a bundle of the same release signed by the pinned key months ago. bundle_for_push (what `mirror
    push` and `mirror verify --bundle` call first) refuses it past mirror.maxBundleAge and warns without it."""
    bundle, _ = _bundle(tmp_path)
    old = (datetime.now(UTC) - timedelta(days=200)).strftime(b.CREATED_FORMAT)
    _edit(bundle, lambda lock: lock.update(created=old))
    trusted = _signed(tmp_path, bundle)
    with pytest.raises(ConfigError, match=rf"the bundle is 200 days old \(created {old}\), older than "
                                          r"mirror.maxBundleAge \(90 days\)") as exc:
        b.bundle_for_push(bundle, trusted, 90)
    assert exc.value.exit_code == EXIT_USAGE
    assert b.bundle_for_push(bundle, trusted)["created"] == old
    assert "warning: " in capsys.readouterr().err
    assert spy() == []


def test_max_bundle_age_in_the_site_file():
    from installer.config import parse_site

    assert _site().mirror.maxBundleAge is None
    assert parse_site({**SITE, "mirror": {"maxBundleAge": 30}}).mirror.maxBundleAge == 30
    for bad in ("30d", "30", 0, -1, 3651, True, 1.5):
        with pytest.raises(ConfigError, match="mirror.maxBundleAge: must be a whole number of days from 1 to 3650"):
            parse_site({**SITE, "mirror": {"maxBundleAge": bad}})


# ---------------------------------------------------------------- lock checks no test reached


def test_a_lock_of_another_release_is_refused(tmp_path, spy):  # noqa: F811
    bundle, _ = _bundle(tmp_path)
    _edit(bundle, lambda lock: lock.update(release="v24.6.0"))
    _refused(spy, _site(), bundle, "the bundle carries release v24.6.0, the site file names operator.version v24.9.2")
    with pytest.raises(ConfigError, match="carries release v24.6.0"):
        verify.from_lock(_site(), _lock(bundle), bundle)


@pytest.mark.parametrize("destination", ["ghcr.io/victim-org/app:latest", f"{REGISTRY}.evil.io/mirror/x:1",
                                         f"{REGISTRY}/mirror/../x:1", None])
def test_base_entries_outside_the_site_registry_are_refused(tmp_path, spy, destination):  # noqa: F811
    bundle, digest = _bundle(tmp_path)
    base = [{"source": "nvcr.io/nvidia/gpu-operator:v24.9.2", "destination": destination, "digest": digest}]
    _edit(bundle, lambda lock: lock.update(base=base))
    _refused(spy, _site(), bundle, rf"base\[0\]: destination .* is not a reference in {REGISTRY}")


def test_base_entries_with_a_digest_that_is_not_sha256_are_refused(tmp_path, spy):  # noqa: F811
    bundle, _ = _bundle(tmp_path)
    base = [{"source": "nvcr.io/nvidia/gpu-operator:v24.9.2", "destination": DESTINATION, "digest": "latest"}]
    _edit(bundle, lambda lock: lock.update(base=base))
    _refused(spy, _site(), bundle, r"base\[0\] .*: digest 'latest' is not sha256:<64 hex>")


@pytest.mark.parametrize("file", ["charts/payments-v24.9.2.tgz", "charts/gpu-operator.tgz", "gpu-operator-v24.9.2.tgz",
                                  "charts/../gpu-operator-v24.9.2.tgz"])
def test_a_chart_entry_whose_file_is_not_the_charts_is_refused(tmp_path, spy, file):  # noqa: F811
    bundle, _ = _bundle(tmp_path)
    lock = _with_chart(bundle, "gpu-operator", "v24.9.2", file=file)
    with pytest.raises(ConfigError, match=r"charts\[0\] \(gpu-operator v24.9.2\): file .* expected "
                                          r"charts/gpu-operator-v24.9.2.tgz") as exc:
        staged_charts(bundle, lock, _site())
    assert exc.value.exit_code == EXIT_USAGE
    assert spy() == []


def test_the_checks_pass_the_unforged_lock(tmp_path):
    """The control for the refusals above: the same bundle with its chart, unedited, passes every check."""
    bundle, _ = _bundle(tmp_path)
    lock = _with_chart(bundle, "gpu-operator", "v24.9.2", file="charts/gpu-operator-v24.9.2.tgz")
    (bundle / "charts" / "the.tgz").rename(bundle / "charts" / "gpu-operator-v24.9.2.tgz")
    staged_charts(bundle, lock, _site())
    assert [w.destination for w in verify.from_lock(_site(), json.loads((bundle / b.LOCK).read_text()), bundle)] \
        == [DESTINATION]


# ---------------------------------------------------------------- the lock as a resumed pull or a checksum reads it


def _with_checksum(bundle: Path, raw: bytes) -> None:
    import hashlib

    (bundle / b.LOCK).write_bytes(raw)
    (bundle / b.CHECKSUM).write_text(f"{hashlib.sha256(raw).hexdigest()}  {b.LOCK}\n")


def test_read_lock_refuses_a_lock_nested_too_deeply_or_with_a_key_twice_as_exit_2(tmp_path):
    """A lock whose checksum file matches is still untrusted (whoever edits the lock rewrites its checksum): nesting
    200,000 deep is exit 2, not a RecursionError traceback; a key given twice is refused (json keeps the last)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    _with_checksum(bundle, b'{"schema": "' + b.SCHEMA.encode() + b'", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    with pytest.raises(ConfigError, match="not valid JSON .*nest") as exc:
        b.read_lock(bundle)
    assert exc.value.exit_code == EXIT_USAGE
    _with_checksum(bundle, json.dumps({"schema": b.SCHEMA}).encode()[:-1] + b', "schema": "other"}')
    with pytest.raises(ConfigError, match="twice"):
        b.read_lock(bundle)
    assert b.load_for_update(bundle) == {}  # a resumed pull starts afresh instead of failing


def test_read_lock_never_blocks_on_a_fifo_and_never_reads_past_its_bound(tmp_path):
    import os

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    os.mkfifo(bundle / b.LOCK)  # no writer: a plain read would block forever
    with pytest.raises(ConfigError, match="not a regular file"):
        b.read_lock(bundle)
    (bundle / b.LOCK).unlink()
    with open(bundle / b.LOCK, "wb") as fh:
        fh.truncate(signing.MAX_ENVELOPE_BYTES + 1)
    with pytest.raises(ConfigError, match="more than the"):
        b.read_lock(bundle, verify=False)
