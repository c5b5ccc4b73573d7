"""The pure parts of installer.upgrade.rollback: which Helm revision a rollback goes back to (and what is refused),
which nodes' host drivers go back, the preview's text and the values diff (credentials hidden). The helm rollback of
a real-chart upgrade runs on the lab in tests/integration/test_operator_rollback.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.errors import EXIT_PREFLIGHT, EXIT_USAGE, ConfigError, PreflightError
from installer.helm import HistoryEntry
from installer.upgrade import rollback as rb
from installer.upgrade import state as st

HISTORY = [HistoryEntry(1, "superseded", "gpu-operator-v22.9.2", "Install complete"),
           HistoryEntry(2, "superseded", "gpu-operator-v23.3.2", "Upgrade complete"),
           HistoryEntry(3, "deployed", "gpu-operator-v23.9.2", "Upgrade complete")]


def record(previous: int | None, applied: int | None, batches=(), nodes=None) -> st.State:
    return st.State(planHash="sha256:x", site="site.yaml", inventory="inv", targetVersion="v23.9.2",
                    targetValuesHash="sha256:y", driverMode="host", releaseName="gpu-operator",
                    releaseNamespace="gpu-operator",
                    previous=None if previous is None else st.Revision(previous, "v23.3.2"),
                    applied=None if applied is None else st.Revision(applied, "v23.9.2"),
                    nodes=nodes or {}, batches=list(batches))


def test_the_revision_before_the_current_one_by_default():
    target, why = rb.choose_target(HISTORY, 3, None, None)
    assert target.revision == 2 and why == "the previous revision"


def test_to_revision_given():
    assert rb.choose_target(HISTORY, 3, 1, None)[0].chart == "gpu-operator-v22.9.2"
    with pytest.raises(ConfigError, match="--to-revision 7: the release has no such revision \\(helm keeps: 1, 2, "
                                          "3\\)") as bad:
        rb.choose_target(HISTORY, 3, 7, None)
    assert bad.value.exit_code == EXIT_USAGE
    with pytest.raises(ConfigError, match="is the current revision"):
        rb.choose_target(HISTORY, 3, 3, None)


def test_the_recorded_runs_starting_revision():
    # the run went 1 -> 3 (helm history has a revision 2 of something else in between: a failed try)
    target, why = rb.choose_target(HISTORY, 3, None, record(previous=1, applied=3))
    assert target.revision == 1 and why == "the revision before the recorded upgrade run"
    # helm finished but the run was killed before recording its revision: the one after its start is its own
    assert rb.choose_target(HISTORY[:2], 2, None, record(previous=1, applied=None))[0].revision == 1
    # something else upgraded since the run: the revision before the current one, not the run's start
    assert rb.choose_target(HISTORY, 3, None, record(previous=1, applied=2))[0].revision == 2


def test_a_rollback_already_done_by_helm_is_not_done_twice():
    history = [*HISTORY, HistoryEntry(4, "deployed", "gpu-operator-v22.9.2", "Rollback to 1")]
    target, why = rb.choose_target(history, 4, None, record(previous=1, applied=3))
    assert target.revision == 4 and "helm rollback done already" in why


def test_nothing_before_the_first_revision():
    with pytest.raises(PreflightError, match="nothing to roll back to") as none:
        rb.choose_target(HISTORY[:1], 1, None, None)
    assert none.value.exit_code == EXIT_PREFLIGHT


def test_nodes_whose_host_driver_goes_back():
    rec = record(1, 3, batches=[st.BatchRecord(1, ["n1"], True, "done"), st.BatchRecord(2, ["n2", "n3"], False,
                                                                                          "failed"),
                                st.BatchRecord(3, ["n4"], False, "pending")],
                 nodes={"n1": st.NodeRecord("535.161.08", False), "n2": st.NodeRecord("535.161.08", True),
                        "n3": st.NodeRecord(None, False), "n4": st.NodeRecord("535.161.08", False)})
    labels = {"n1": {"nvidia.com/cuda.driver-version.full": "550.54.15"},
              "n2": {"nvidia.com/cuda.driver-version.full": "535.161.08"}, "n3": {}, "n4": None}
    nodes = {n.name: n for n in rb.node_plan(rec, labels)}
    assert set(nodes) == {"n1", "n2", "n3"}  # n4's batch never ran
    assert (nodes["n1"].action, nodes["n1"].now, nodes["n1"].to) == ("driver-back", "550.54.15", "535.161.08")
    assert nodes["n2"].action == "none (already at 535.161.08)"
    assert nodes["n3"].action.startswith("left alone (no driver version recorded")
    assert rb.node_plan(None, {}) == []


def test_values_diff_hides_credentials():
    diff = rb._flat_diff({"driver": {"version": "550.54.15", "licensingConfig": {"password": "old"}},
                          "toolkit": {"enabled": True}},
                         {"driver": {"version": "535.161.08", "licensingConfig": {"password": "new"}}})
    assert "~ driver.version: 550.54.15 -> 535.161.08" in diff
    assert "~ driver.licensingConfig.password: *** -> ***" in diff
    assert "- toolkit.enabled: true -> (unset)" in diff and not [d for d in diff if "old" in d or "new" in d]


def test_preview_text():
    rec = record(1, 3, batches=[st.BatchRecord(1, ["n1"], True, "done")],
                 nodes={"n1": st.NodeRecord("535.161.08", False)})
    pv = rb.Preview("gpu-operator", "gpu-operator", HISTORY[2], HISTORY[0], "the previous revision",
                    ["~ driver.version: 550.54.15 -> 535.161.08"], "host", Path("/s.json"), rec,
                    nodes=[rb.NodeBack("n1", 1, "550.54.15", "535.161.08", "driver-back")],
                    crd_caveat=("CRDs: never downgraded",))
    text = "\n".join(pv.lines())
    assert "revision 3 (gpu-operator-v23.9.2, deployed) -> helm rollback to revision 1 (gpu-operator-v22.9.2)" in text
    assert "cannot undo: CRDs: never downgraded" in text and "batch 1: n1 550.54.15 -> 535.161.08" in text
    assert not pv.helm_done
