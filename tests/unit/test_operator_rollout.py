"""The pure parts of installer.upgrade.operator_rollout: whose skip label it is, when a node counts as upgraded (a
flap upgrade-failed -> upgrade-done is a failure), the driver DaemonSet's newest revision, the failure detail (events
newest last, credentials hidden) and BatchFailed's exit code. The cluster side runs against the lab's API server in
tests/integration/test_operator_rollout.py."""

from __future__ import annotations

from installer.errors import EXIT_HOST_FAILURES
from installer.upgrade import operator_rollout as r
from installer.upgrade.cluster import SKIP_LABEL, STATE_LABEL


def test_whose_skip_label():
    ours = {r.HOLD_ANNOTATION: "true"}
    assert r.held_by_us({SKIP_LABEL: "true"}, ours) and not r.admin_skip({SKIP_LABEL: "true"}, ours)
    assert r.admin_skip({SKIP_LABEL: "true"}, {}) and not r.held_by_us({SKIP_LABEL: "true"}, {})
    assert r.admin_skip({SKIP_LABEL: "true"}, {r.HOLD_ANNOTATION: "false"})
    assert not r.admin_skip({SKIP_LABEL: "false"}, {}) and not r.held_by_us({}, ours)


def test_a_node_is_done_only_after_the_controller_took_it_through():
    w = r.NodeWatch("n1")
    w.see("upgrade-required")
    for state in r.STATES[1:-1]:
        assert w.see(state) and not w.done
    assert not w.see("uncordon-required")  # no change
    w.see(r.DONE)
    assert w.done and not w.failed


def test_a_flap_from_failed_to_done_counts_as_failed():
    w = r.NodeWatch("n1")
    for state in ("upgrade-required", "pod-restart-required", r.FAILED, "uncordon-required", r.DONE):
        w.see(state)
    assert w.state == r.DONE and w.failed and not w.done


def test_done_at_the_start_counts_only_when_the_driver_pod_is_in_sync():
    stale = r.NodeWatch("n1")
    stale.see(r.DONE)
    assert not stale.done  # the controller may not have noticed the new DaemonSet revision yet
    synced = r.NodeWatch("n2", in_sync_at_start=True)
    synced.see(r.DONE)
    assert synced.done
    unset = r.NodeWatch("n3")
    unset.see(None)
    assert unset.moved and not unset.done


def _rev(name: str, revision: object, digest: str, uid: str) -> dict:
    return {"metadata": {"name": name, "labels": {r.REVISION_HASH: digest},
                         "ownerReferences": [{"kind": "DaemonSet", "uid": uid}]}, "revision": revision}


def test_newest_revision_hash_of_the_daemonset():
    revs = [_rev("a", 1, "aaa", "ds1"), _rev("c", 3, "ccc", "ds1"), _rev("b", 2, "bbb", "ds1"),
            _rev("x", 9, "xxx", "other"), _rev("bad", "10", "zzz", "ds1"), {"metadata": "junk"}]
    assert r.newest_revision_hash(revs, "ds1") == "ccc"
    assert r.newest_revision_hash(revs, "none") is None
    assert r.newest_revision_hash([], "ds1") is None


def test_events_newest_last_bounded_and_scrubbed():
    events = [{"lastTimestamp": f"2026-01-01T00:00:{i:02d}Z", "type": "Normal", "reason": "GPUDriverUpgrade",
               "message": f"step {i}"} for i in range(15)]
    events.append({"lastTimestamp": "2026-01-01T00:00:59Z", "type": "Warning", "reason": "GPUDriverUpgrade",
                   "message": "pull failed: https://admin:s3cret@registry.example/v2/ password=hunter2\x1b[31m",
                   "count": 3})
    lines = r.event_lines(reversed(events))
    assert len(lines) == r.EVENTS_SHOWN
    assert lines[0].endswith("step 6") and "Warning GPUDriverUpgrade" in lines[-1] and lines[-1].endswith("(x3)")
    assert "s3cret" not in lines[-1] and "hunter2" not in lines[-1] and "\x1b" not in lines[-1]
    assert "https://***@registry.example" in lines[-1] and "password=***" in lines[-1]


def test_scrub_hides_credentials_and_cuts_long_lines():
    assert r.scrub('token: "abc def" rest') == "token: *** rest"
    assert r.scrub("Authorization: Bearer abcdefghijklmnop") == "Authorization: ***"
    assert r.scrub("curl -H 'x' --header Bearer abcdefghijklmnop") == "curl -H 'x' --header Bearer ***"
    assert r.scrub("REGISTRY_PASSWORD=xyz and more") == "REGISTRY_PASSWORD=*** and more"
    assert r.scrub("Could not unload NVIDIA driver kernel modules") == "Could not unload NVIDIA driver kernel modules"
    assert len(r.scrub("x" * 5000)) == r.LINE_MAX + 1


def test_detail_names_the_state_events_pod_and_log():
    text = r.detail_text("n1", r.FAILED, ["t Warning GPUDriverUpgrade: boom"], "gpu-operator/nvidia-driver-abc",
                         ["t Warning BackOff: back-off restarting"], ["line 1", "api_key=zzz"])
    assert f"{STATE_LABEL}: upgrade-failed" in text and "boom" in text and "back-off restarting" in text
    assert f"log of gpu-operator/nvidia-driver-abc (last {r.LOG_LINES} lines):" in text and "line 1" in text
    assert "zzz" not in text and "api_key=***" in text
    unavailable = r.detail_text("n1", None, [], "ns/p", [], "HTTP 500: dial no-egress.sock")
    assert "(not set)" in unavailable and "log of ns/p: not available (HTTP 500: dial no-egress.sock)" in unavailable
    assert "    (none)" in unavailable
    assert "driver pod: none found on the node" in r.detail_text("n1", r.FAILED, [], None, [], [])


def test_batch_failed_exit_code_and_message():
    exc = r.BatchFailed("n1", "  detail line")
    assert exc.exit_code == EXIT_HOST_FAILURES == 4 and exc.node == "n1" and exc.detail == "  detail line"
    assert "upgrade-failed" in exc.message and "detail line" in exc.message and "--resume" in (exc.hint or "")
    late = r.BatchFailed("n2", "  still drain-required", timed_out=True)
    assert late.timed_out and "did not finish the driver upgrade in time" in late.message
