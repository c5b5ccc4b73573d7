"""installer/upgrade/apply.py, state.py, host_rollout.py: `gpu-install upgrade apply`.

The plan is the real one (installer.upgrade.plan.build over the catalog, as tests/unit/test_upgrade_plan.py builds
it) and its document the real gpu-install.upgrade-plan/v1 fields; the cluster as read is a ClusterState the test
changes between runs (what installer.upgrade.cluster.read would return). What acts on the cluster and the nodes is
recorded by fakes at the seams apply calls: helm (apply._helm), the host batch's steps (HostBatch.cordon, drain,
driver_role, validate, boot_id, wait_rebooted: the order and the state file between them are the code under test;
the real drain, role, reboot and validate run in tests/integration/test_upgrade_apply.py) and the
installer.upgrade.operator_rollout contract (hold_all, release_batch, lift_all, BatchFailed).
"""

from __future__ import annotations

import json
import stat
import sys
import types
from pathlib import Path

import jsonschema
import pytest

from installer import jsonout
from installer.errors import ConfigError, HostFailures, PreflightError, ValidationFindings
from installer.upgrade import apply as ua
from installer.upgrade import host_rollout
from installer.upgrade import plan as up
from installer.upgrade import state as st
from installer.upgrade.cluster import ClusterState, NodeState
from installer.upgrade.model import CurrentRelease
from tests.unit.test_upgrade_plan import NODES, no_chart, target  # noqa: F401 - no_chart: an autouse fixture

HOST = {"mode": "host", "rebootPolicy": "if-needed"}


def gpu_pod(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml", "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cuda",
                                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


class Cluster:
    """The cluster as cluster.read returns it, changed by the fakes as the real steps would change it."""

    def __init__(self, deployed: str = "v23.9.2", *, revision: int = 4, cordoned: tuple[str, ...] = (),
                 driver_labels: dict[str, str] | None = None, driver: dict | None = None):
        # deployed in operator mode unless driver says otherwise (the host-mode targets move the driver to the host)
        self.values = target(deployed, **({"driver": driver} if driver else {})).values
        self.chart, self.revision, self.status = deployed, revision, "deployed"
        self.cordoned = set(cordoned)
        self.labels = {n: {"nvidia.com/cuda.driver-version.full": v} for n, v in (driver_labels or {}).items()}

    def state(self) -> ClusterState:
        rel = CurrentRelease("gpu-operator", "gpu-operator", self.revision, self.chart, self.values,
                             {"clusterpolicies.nvidia.com": {"metadata": {"resourceVersion": "900"}}})
        nodes = tuple(NodeState(n, n, True, True, n in self.cordoned, self.labels.get(n, {}),
                                (gpu_pod(f"job-{n}", n),)) for n in NODES)
        return ClusterState("v1.29.4", rel, self.status, nodes, ())


def plan_doc(p, path: str = "plan.json") -> dict:
    doc = {**jsonout.envelope(jsonout.UPGRADE_PLAN, "upgrade plan"), **up.to_doc_fields(p, path),
           "exitCode": p.exit_code}
    jsonout.check(doc)
    return doc


class Rig:
    """A cluster, a plan file made from it, a state file, and the fakes' log of what was done."""

    def __init__(self, tmp_path: Path, monkeypatch, *, driver: dict | None = None, max_parallel: int = 2,
                 cordoned: tuple[str, ...] = (), driver_labels: dict[str, str] | None = None):
        self.tmp, self.mp = tmp_path, monkeypatch
        self.cluster = Cluster(cordoned=cordoned, driver_labels=driver_labels)
        self.plan = target("v23.9.2", driver=driver or HOST)
        self.max_parallel = max_parallel
        self.log: list[tuple] = []
        self.fail: dict[tuple[str, str], Exception | BaseException] = {}
        self.boot: dict[str, str] = {n: "boot-1" for n in NODES}
        self.state_file = tmp_path / "state" / "upgrade.json"
        self.plan_file = tmp_path / "plan.json"
        monkeypatch.setattr("installer.upgrade.cluster.read", lambda plan, kc, client=None: (self.cluster.state(),
                                                                                             None))
        monkeypatch.setattr("installer.kube.resolve_kubeconfig", lambda k: Path("kubeconfig"))
        monkeypatch.setattr(ua, "_helm", self._helm)
        hb = host_rollout.HostBatch
        monkeypatch.setattr(hb, "cordon", lambda s, n, on: self._act("cordon" if on else "uncordon", n))
        monkeypatch.setattr(hb, "drain", lambda s, n, everything: self._act("drain", n, everything))
        monkeypatch.setattr(hb, "driver_role", lambda s, nodes: self._role(nodes))
        monkeypatch.setattr(hb, "validate", lambda s, nodes: self._act("validate", ",".join(nodes)))
        monkeypatch.setattr(hb, "boot_id", lambda s, n: self.boot[n])
        monkeypatch.setattr(hb, "wait_rebooted", lambda s, n, before: self._act("ready", n, before))

    def write_plan(self) -> dict:
        p = up.build(self.plan, self.cluster.state(), None, site="site.yaml", inventory="hosts.yml",
                     max_parallel=self.max_parallel, max_unavailable="100%")
        doc = plan_doc(p, str(self.plan_file))
        self.plan_file.write_text(json.dumps(doc))
        return doc

    def _helm(self, plan, opts, rec, kubeconfig, say):
        self.log.append(("helm", rec.targetVersion))
        self.cluster.revision += 1
        self.cluster.values = plan.values
        rec.applied = st.Revision(self.cluster.revision, rec.targetVersion)

    def _act(self, what: str, node: str, *extra) -> None:
        self.log.append((what, node, *extra))
        exc = self.fail.pop((what, node), None)
        if exc is not None:
            raise exc
        if what == "cordon":
            self.cluster.cordoned.add(node)
        if what == "uncordon":
            self.cluster.cordoned.discard(node)

    def _role(self, nodes) -> None:
        self._act("driver", ",".join(nodes))
        for n in nodes:
            self.boot[n] = "boot-2"  # the role rebooted it

    def run(self, *, resume: bool = False, **kw) -> ua.Outcome:
        opts = ua.Options(str(self.plan_file), resume=resume, state_file=str(self.state_file), mirror_check=False,
                          **kw)
        self.lines: list[str] = []
        return ua.run(self.plan, opts, site="site.yaml", inventory="hosts.yml", say=self.lines.append)

    def steps(self, what: str) -> list:
        return [e[1] for e in self.log if e[0] == what]

    def saved(self) -> st.State:
        rec = st.load(self.state_file)
        assert rec is not None
        return rec


# ---------------------------------------------------------------- the state file


def sample_state() -> st.State:
    return st.State(planHash="sha256:ab", site="site.yaml", inventory="hosts.yml", targetVersion="v23.9.2",
                    targetValuesHash=st.values_hash({"a": 1}), driverMode="host", releaseName="gpu-operator",
                    releaseNamespace="gpu-operator", previous=st.Revision(4, "v22.9.2"),
                    nodes={"gpu-a": st.NodeRecord("535.161.08", False), "gpu-b": st.NodeRecord(None, True, "b1")},
                    batches=[st.BatchRecord(1, ["gpu-a"], True, "done"), st.BatchRecord(2, ["gpu-b"], False)])


def test_the_state_file_round_trips_atomically_and_private(tmp_path):
    rec = sample_state()
    rec.inProgress = st.InProgress(2, "gpu-b", "drain")
    path = tmp_path / "deep" / "gpu-operator.gpu-operator.json"
    rec.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left beside it
    back = st.load(path)
    assert back == rec
    doc = json.loads(path.read_text())
    assert doc["schema"] == st.SCHEMA and doc["release"]["previous"] == {"revision": 4, "chart": "v22.9.2"}
    assert doc["nodes"]["gpu-a"] == {"previousDriverVersion": "535.161.08", "cordonedBefore": False,
                                     "bootIdBefore": None}
    assert [b.index for b in back.pending()] == [2] and back.done_nodes() == ["gpu-a"]


@pytest.mark.parametrize(("edit", "named"), [
    (lambda d: d["batches"][0].update(status="half"), "batches[0].status: 'half'"),
    (lambda d: d["release"]["previous"].update(revision=True), "release.previous.revision: True is not a number"),
    (lambda d: d["nodes"]["gpu-a"].update(cordonedBefore="no"), "nodes.gpu-a.cordonedBefore: str where bool"),
    (lambda d: d.pop("planHash"), "planHash: missing"),
    (lambda d: d.update(schema="gpu-install.upgrade-state/v9"), "schema 'gpu-install.upgrade-state/v9'"),
    (lambda d: d.update(phase="maybe"), "phase: 'maybe' is not one of"),
])
def test_a_state_file_that_does_not_fit_is_refused_naming_the_field(tmp_path, edit, named):
    path = tmp_path / "s.json"
    sample_state().save(path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        st.load(path)
    assert str(path) in err.value.message and named in err.value.message and err.value.exit_code == 2


def test_a_state_file_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"schema": ')
    with pytest.raises(ConfigError, match="not JSON"):
        st.load(path)
    assert st.load(tmp_path / "none.json") is None


# ---------------------------------------------------------------- the plan file


def test_a_plan_file_off_its_schema_is_exit_2(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema": "gpu-install.apply/v1"}))
    with pytest.raises(ConfigError, match="schema 'gpu-install.apply/v1', not gpu-install.upgrade-plan/v1"):
        ua.load_plan_doc(str(path))
    doc = plan_doc(up.build(target("v23.9.2", driver=HOST), Cluster().state(), None, site="s", inventory="i"))
    doc["batches"] = [{"index": 1, "nodes": "gpu-a", "canary": True}]
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"batches\[0\]: not \{index, nodes, canary\}"):
        ua.load_plan_doc(str(path))


def test_a_plan_with_blockers_is_refused_with_exit_3_before_the_cluster_is_read(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch, cordoned=("gpu-b",))  # a pre-cordoned node is a blocker of the plan
    doc = rig.write_plan()
    assert [b["where"] for b in doc["blockers"]] == ["gpu-b"]
    monkeypatch.setattr("installer.upgrade.cluster.read", lambda *a, **k: pytest.fail("read the cluster"))
    with pytest.raises(PreflightError, match="has 1 blocker") as err:
        rig.run()
    assert "gpu-b: the node was cordoned before the upgrade" in err.value.message and err.value.exit_code == 3
    assert rig.log == [] and not rig.state_file.exists()


# ---------------------------------------------------------------- stale plans


def test_a_stale_plan_is_refused_naming_what_changed_and_nothing_is_done(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    rig.cluster.cordoned.add("gpu-c")  # an admin cordons a node after the plan
    rig.cluster.revision = 5  # and someone ran helm
    with pytest.raises(PreflightError) as err:
        rig.run()
    msg = err.value.message
    assert msg.startswith("plan is stale: --plan ") and err.value.exit_code == 3
    assert "release revision: 4 -> 5" in msg and "node gpu-c cordoned: false -> true" in msg
    assert "run `gpu-install upgrade plan -o FILE` again" in (err.value.hint or "")
    assert rig.log == [] and not rig.state_file.exists()


def test_a_change_only_the_hash_covers_is_still_stale(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    monkeypatch.setattr(Cluster, "state", _state_with_skip)
    with pytest.raises(PreflightError, match="what only the hash shows"):
        rig.run()


def _state_with_skip(cluster: Cluster) -> ClusterState:
    rel = CurrentRelease("gpu-operator", "gpu-operator", cluster.revision, cluster.chart, cluster.values,
                         {"clusterpolicies.nvidia.com": {"metadata": {"resourceVersion": "901"}}})  # CRD rewritten
    nodes = tuple(NodeState(n, n, True, True, False, {}, (gpu_pod(f"job-{n}", n),)) for n in NODES)
    return ClusterState("v1.29.4", rel, cluster.status, nodes, ())


def test_a_plan_with_nothing_to_do_is_exit_0_and_writes_no_state(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.plan = target("v23.9.2")  # the release as deployed, operator mode
    rig.write_plan()
    out = rig.run()
    assert out.nothing_to_do and out.exit_code == 0 and rig.log == [] and not rig.state_file.exists()
    assert any(line.startswith("nothing to do") for line in rig.lines)


# ---------------------------------------------------------------- host mode: batches, failure, resume


def test_a_host_driver_version_change_reloads_the_nodes_whose_driver_gfd_reports_older():
    """Host to host: the release's driver side does not change (driver.enabled false both times); the nodes' own
    driver, as GPU Feature Discovery labels it, against the site's driver.version decides."""
    old = {"nvidia.com/cuda.driver.major": "535", "nvidia.com/cuda.driver.minor": "216", "nvidia.com/cuda.driver.rev":
           "03"}
    labels = {"gpu-a": old, "gpu-b": {"nvidia.com/cuda.driver-version.full": "535.216.03"},
              "gpu-c": {"nvidia.com/cuda.driver-version.full": "550.54.15"}}
    cluster = Cluster(driver={"mode": "host", "version": "535.216.03"})
    cluster.labels = labels
    p = up.build(target("v23.9.2", driver={**HOST, "version": "550.54.15"}), cluster.state(), None, site="s",
                 inventory="i", max_unavailable="100%")
    assert [(n.name, n.action) for n in p.nodes] == [("gpu-a", "host-reboot"), ("gpu-b", "host-reboot"),
                                                     ("gpu-c", "none")]
    assert [b.nodes for b in p.batches] == [("gpu-a",), ("gpu-b",)] and p.blockers == ()
    # a branch matches its releases; a node GFD has not labelled is not guessed at
    cluster.labels = {"gpu-a": old}
    p = up.build(target("v23.9.2", driver={"mode": "host", "version": "535"}), cluster.state(), None, site="s",
                 inventory="i")
    assert [n.action for n in p.nodes] == ["none"] * 3 and p.batches == ()
    # rebootPolicy never: the driver is reloaded after a drain of the GPU pods only
    p = up.build(target("v23.9.2", driver={"mode": "host", "version": "550.54.15", "rebootPolicy": "never"}),
                 Cluster(driver={"mode": "host"}, driver_labels={"gpu-b": "535.216.03"}).state(), None, site="s",
                 inventory="i")
    assert [n.action for n in p.nodes] == ["none", "driver-reload", "none"]
    assert p.nodes[1].evicts == ("ml/job-gpu-b",)


def test_host_mode_runs_helm_then_the_canary_then_the_batches_each_validated(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch, driver_labels={"gpu-a": "535.161.08"})
    doc = rig.write_plan()
    assert [b["nodes"] for b in doc["batches"]] == [["gpu-a"], ["gpu-b", "gpu-c"]]
    out = rig.run()
    order = [e[0] for e in rig.log]
    assert order[0] == "helm"
    # the canary is done (validated, uncordoned) before the next batch is cordoned
    assert rig.log[1:7] == [("cordon", "gpu-a"), ("drain", "gpu-a", True), ("driver", "gpu-a"),
                            ("ready", "gpu-a", "boot-1"), ("validate", "gpu-a"), ("uncordon", "gpu-a")]
    assert rig.log[7:] == [("cordon", "gpu-b"), ("cordon", "gpu-c"), ("drain", "gpu-b", True),
                           ("drain", "gpu-c", True), ("driver", "gpu-b,gpu-c"), ("ready", "gpu-b", "boot-1"),
                           ("ready", "gpu-c", "boot-1"), ("validate", "gpu-b,gpu-c"), ("uncordon", "gpu-b"),
                           ("uncordon", "gpu-c")]
    rec = rig.saved()
    assert rec.phase == "done" and [b.status for b in rec.batches] == ["done", "done"] and rec.inProgress is None
    assert rec.previous == st.Revision(4, "v23.9.2") and rec.applied == st.Revision(5, "v23.9.2")
    assert rec.nodes["gpu-a"].previousDriverVersion == "535.161.08" and rec.nodes["gpu-b"].previousDriverVersion is None
    assert set(out.seconds) == {1, 2} and rig.cluster.cordoned == set()
    # the same plan again: the cluster moved on (helm revision 5), so the plan is stale
    with pytest.raises(PreflightError, match="release revision: 4 -> 5"):
        rig.run()


def test_driver_reload_without_a_reboot_policy_drains_gpu_pods_only_and_waits_for_no_reboot(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch, driver={"mode": "host", "rebootPolicy": "never"}, max_parallel=3)
    rig.write_plan()
    rig.run()
    assert ("drain", "gpu-a", False) in rig.log and rig.steps("ready") == []


def test_a_failing_canary_stops_the_run_its_node_cordoned_the_others_untouched(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    rig.fail[("validate", "gpu-a")] = ValidationFindings("validate gpu-a: 1 check(s) failed: gpu-a node.driver: …")
    with pytest.raises(ValidationFindings) as err:
        rig.run()
    assert err.value.exit_code == 6
    assert rig.steps("uncordon") == [] and rig.cluster.cordoned == {"gpu-a"}
    assert not any(e[1] in ("gpu-b", "gpu-c", "gpu-b,gpu-c") for e in rig.log)  # the rest untouched
    rec = rig.saved()
    assert rec.phase == "failed" and [b.status for b in rec.batches] == ["failed", "pending"]
    assert rec.failure == st.Failure(1, ["gpu-a"], 6, "validate gpu-a: 1 check(s) failed: gpu-a node.driver: …")
    # a new run of the same plan is refused: the unfinished one is recorded
    with pytest.raises(PreflightError, match="an unfinished upgrade is recorded") as err2:
        rig.run()
    assert "--resume" in (err2.value.hint or "")
    # fixed, resumed: the canary again (helm not again), then the rest
    rig.log.clear()
    out = rig.run(resume=True)
    assert out.resumed and rig.steps("helm") == [] and rig.steps("validate") == ["gpu-a", "gpu-b,gpu-c"]
    assert rig.saved().phase == "done" and rig.saved().failure is None


def test_a_drain_timeout_stops_the_batch_with_exit_4(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    rig.fail[("drain", "gpu-a")] = HostFailures("gpu-a: 1 pod(s) not evicted within 300s: ml/job-gpu-a (Cannot "
                                                 "evict pod as it would violate the pod's disruption budget.)")
    with pytest.raises(HostFailures) as err:
        rig.run()
    assert err.value.exit_code == 4 and "ml/job-gpu-a" in err.value.message
    assert rig.steps("driver") == [] and rig.saved().failure.nodes == ["gpu-a"]


def test_resume_after_a_kill_in_batch_2_does_not_repeat_batch_1(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()

    class Killed(BaseException):
        """What kill -9 leaves: no handler runs, the state file as last written."""

    rig.fail[("ready", "gpu-b")] = Killed()
    with pytest.raises(Killed):
        rig.run()
    rec = rig.saved()
    assert [b.status for b in rec.batches] == ["done", "in-progress"]
    assert rec.inProgress == st.InProgress(2, "gpu-b", "reboot") and rec.phase == "released"
    assert rec.nodes["gpu-b"].bootIdBefore == "boot-1"  # recorded before the role rebooted it
    rig.log.clear()
    rig.boot["gpu-b"] = rig.boot["gpu-c"] = "boot-2"  # the reboot happened; the role will not reboot again
    monkeypatch.setattr(host_rollout.HostBatch, "driver_role", lambda s, nodes: rig._act("driver", ",".join(nodes)))
    out = rig.run(resume=True)
    assert out.resumed and rig.steps("helm") == []
    assert not any(e[1] == "gpu-a" for e in rig.log)  # batch 1 is not run again
    # the reboot is judged against the boot ID recorded before the kill, not read again
    assert ("ready", "gpu-b", "boot-1") in rig.log and ("ready", "gpu-c", "boot-1") in rig.log
    assert rig.saved().phase == "done"
    assert any(line.startswith("resuming plan") for line in rig.lines)


def test_resume_refuses_a_release_the_run_did_not_make(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    rig.fail[("validate", "gpu-a")] = ValidationFindings("failed")
    with pytest.raises(ValidationFindings):
        rig.run()
    rig.cluster.revision = 9  # someone else upgraded the release meanwhile
    with pytest.raises(PreflightError, match="plan is stale for --resume: the Helm release is at revision 9, not "
                                             "the run's 5"):
        rig.run(resume=True)
    rig.cluster.revision = 5
    rig.plan = target("v23.9.2", driver={**HOST, "version": "550.54.15"})  # the site file changed
    with pytest.raises(PreflightError, match="rendered values differ"):
        rig.run(resume=True)


def test_resume_adopts_a_helm_upgrade_that_finished_before_the_kill(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()

    class Killed(BaseException):
        pass

    def helm_then_killed(plan, opts, rec, kubeconfig, say):
        rig.cluster.revision += 1
        rig.cluster.chart = "v23.9.2"
        rig.cluster.values = plan.values
        raise Killed()

    monkeypatch.setattr(ua, "_helm", helm_then_killed)
    with pytest.raises(Killed):
        rig.run()
    assert rig.saved().applied is None and rig.saved().phase == "upgrading"
    monkeypatch.setattr(ua, "_helm", lambda *a: pytest.fail("helm ran twice"))
    rig.run(resume=True)
    assert rig.saved().applied == st.Revision(5, "v23.9.2") and rig.saved().phase == "done"


def test_resume_without_a_record_or_of_another_plan_is_refused(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    with pytest.raises(ConfigError, match="--resume: no upgrade recorded in"):
        rig.run(resume=True)
    rec = sample_state()
    rec.phase = "failed"
    rec.save(rig.state_file)
    with pytest.raises(PreflightError, match="records plan sha256:ab, not --plan"):
        rig.run(resume=True)


def test_a_pre_cordoned_node_stays_cordoned(monkeypatch):
    """A node cordoned before the upgrade (state: cordonedBefore) is cordoned through the batch and not uncordoned
    at its end; the node beside it is."""
    log: list[tuple] = []
    batch = host_rollout.HostBatch.__new__(host_rollout.HostBatch)
    batch.say = lambda line: log.append(("say", line))
    batch.step = lambda node, what: None
    batch.cordon = lambda n, on: log.append(("cordon" if on else "uncordon", n))
    batch.drain = lambda n, everything: log.append(("drain", n))
    batch.driver_role = lambda nodes: log.append(("driver", tuple(nodes)))
    batch.validate = lambda nodes: log.append(("validate", tuple(nodes)))
    batch.boot_id = lambda n: "b"
    batch.wait_rebooted = lambda n, before: log.append(("ready", n))
    batch.run(["gpu-a", "gpu-b"], reboot=False, cordoned_before=lambda n: n == "gpu-b", boot_ids={})
    assert [e for e in log if e[0] in ("cordon", "uncordon")] == [("cordon", "gpu-a"), ("cordon", "gpu-b"),
                                                                  ("uncordon", "gpu-a")]
    assert ("say", "gpu-b: stays cordoned (it was before the upgrade)") in log


# ---------------------------------------------------------------- operator mode (the operator_rollout contract)


class FakeOperatorRollout(types.ModuleType):
    """installer.upgrade.operator_rollout's contract: hold_all, release_batch, lift_all, BatchFailed."""

    class BatchFailed(HostFailures):  # as the module's: exit 4, the node's detail in the message
        def __init__(self, node: str, detail: str):
            self.node, self.detail = node, detail
            super().__init__(f"{node}: the operator's driver upgrade failed\n{detail}")

    def __init__(self, log: list, fail: dict):
        super().__init__("installer.upgrade.operator_rollout")
        self.log, self.fail = log, fail

    def hold_all(self, client, nodes):
        self.log.append(("hold_all", tuple(nodes)))

    def release_batch(self, client, nodes, *, timeout, progress):
        self.log.append(("release_batch", tuple(nodes)))
        for n in nodes:
            progress(n, "upgrade-done")
            if n in self.fail:
                raise self.BatchFailed(n, self.fail[n])

    def lift_all(self, client, nodes):
        self.log.append(("lift_all", tuple(nodes)))


def test_operator_mode_holds_every_node_before_helm_then_releases_batch_by_batch(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch, driver={"mode": "operator"})
    rig.cluster = Cluster("v23.6.2", revision=3)  # the operator's driver version changes with the release
    rig.write_plan()
    fake = FakeOperatorRollout(rig.log, {})
    monkeypatch.setitem(sys.modules, "installer.upgrade.operator_rollout", fake)
    rig.run()
    assert [e[0] for e in rig.log] == ["hold_all", "helm", "release_batch", "release_batch", "lift_all"]
    assert rig.log[0] == ("hold_all", NODES) and rig.log[2] == ("release_batch", ("gpu-a",))
    assert rig.saved().nodes["gpu-a"].previousDriverVersion == "535.104.05"  # v23.6.2's driver, deployed
    assert "gpu-a: upgrade-done" in rig.lines


def test_operator_mode_upgrade_failed_stops_with_exit_4_naming_the_node(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch, driver={"mode": "operator"})
    rig.cluster = Cluster("v23.6.2", revision=3)
    rig.write_plan()
    monkeypatch.setitem(sys.modules, "installer.upgrade.operator_rollout",
                        FakeOperatorRollout(rig.log, {"gpu-a": "upgrade-failed: Could not unload NVIDIA driver"}))
    with pytest.raises(HostFailures) as err:
        rig.run()
    assert err.value.exit_code == 4
    assert "gpu-a: the operator's driver upgrade failed\nupgrade-failed: Could not unload NVIDIA driver" in \
        err.value.message
    assert [e[0] for e in rig.log] == ["hold_all", "helm", "release_batch"]  # no lift, batch 2 never released
    assert rig.saved().phase == "failed" and [b.status for b in rig.saved().batches] == ["failed", "pending"]


# ---------------------------------------------------------------- the JSON document


def test_the_json_document_fits_its_schema(tmp_path, monkeypatch):
    from installer.cli.upgrade import _apply_doc

    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()
    out = rig.run()
    rec = jsonout.Recorder(jsonout.UPGRADE_APPLY, "upgrade apply")
    rec.doc.update(planFile=str(rig.plan_file), planHash=out.plan_hash, statePath=None, resumed=False,
                   nothingToDo=False, targetVersion=None, release=None, phase=None, batches=[], failure=None)
    _apply_doc(rec, out, out.state, out.state_path)
    jsonout.check(rec.doc)
    jsonschema.Draft202012Validator(jsonout.json_schema(jsonout.UPGRADE_APPLY)).validate(rec.doc)
    assert rec.doc["release"]["applied"] == {"revision": 5, "chart": "v23.9.2"}
    assert [b["status"] for b in rec.doc["batches"]] == ["done", "done"]


def test_the_cli_needs_yes(tmp_path, capsys):
    from installer.cli import main

    site = tmp_path / "site.yaml"
    site.write_text("operator: {version: v23.9.2}\nregistry: {host: registry.lab:5000}\n")
    out = tmp_path / "apply.json"
    rc = main(["upgrade", "apply", "-s", str(site), "-i", "hosts.yml", "--plan", "plan.json", "--json", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "confirm with --yes" in err and "--plan plan.json --yes" in err
    doc = json.loads(out.read_text())
    assert doc["exitCode"] == 2 and doc["error"]["type"] == "ConfigError"
    jsonschema.Draft202012Validator(jsonout.json_schema(jsonout.UPGRADE_APPLY)).validate(doc)


def test_resume_reruns_helm_after_its_own_failed_upgrade(tmp_path, monkeypatch):
    """helm upgrade failed mid-way (a new revision, status failed): --resume runs it again instead of calling the
    plan stale."""
    from installer.errors import ClusterError

    rig = Rig(tmp_path, monkeypatch)
    rig.write_plan()

    def failing_helm(plan, opts, rec, kubeconfig, say):
        rig.cluster.revision += 1
        rig.cluster.status = "failed"
        raise ClusterError("helm upgrade --install gpu-operator failed: timed out waiting for the condition")

    monkeypatch.setattr(ua, "_helm", failing_helm)
    with pytest.raises(ClusterError):
        rig.run()
    rec = rig.saved()
    assert rec.phase == "upgrading" and rec.failure is not None and rec.failure.exitCode == 7
    monkeypatch.setattr(ua, "_helm", rig._helm)
    rig.run(resume=True)
    assert rig.steps("helm") == ["v23.9.2"] and rig.saved().applied == st.Revision(6, "v23.9.2")
    assert rig.saved().phase == "done"


# ---------------------------------------------------------------- --resume holds the state file to the plan


def _failed_canary(tmp_path, monkeypatch) -> tuple[Rig, dict]:
    """Three nodes in three batches (the canary, gpu-b, gpu-c); the canary's validation failed: the state file as
    the run wrote it, and the log cleared."""
    rig = Rig(tmp_path, monkeypatch, max_parallel=1)
    rig.write_plan()
    rig.fail[("validate", "gpu-a")] = ValidationFindings("validate gpu-a: 1 check(s) failed")
    with pytest.raises(ValidationFindings):
        rig.run()
    rig.log.clear()
    return rig, json.loads(rig.state_file.read_text())


def _canary_done(d: dict) -> None:
    d["batches"][0]["status"] = "done"


def _merge_2_and_3(d: dict) -> None:
    _canary_done(d)
    d["batches"][1]["nodes"] += d["batches"].pop(2)["nodes"]


def _swap_2_and_3(d: dict) -> None:
    d["batches"][1]["nodes"], d["batches"][2]["nodes"] = d["batches"][2]["nodes"], d["batches"][1]["nodes"]


@pytest.mark.parametrize(("edit", "named"), [
    (_merge_2_and_3, "its batches are not those of --plan {plan}: batch 2: the state file has gpu-b, gpu-c, the "
                     "plan gpu-b"),
    (_swap_2_and_3, "batch 2: the state file has gpu-c, the plan gpu-b"),
    (lambda d: d["batches"][2].update(nodes=["gpu-x"]), "batch 3: the state file has gpu-x, the plan gpu-c"),
    (lambda d: d["batches"][0].update(canary=False), "batch 1: the state file has gpu-a, the plan gpu-a (canary)"),
    (lambda d: d["batches"].pop(), "the state file has 2 batch(es), the plan 3"),
    (_canary_done, "batch 1 (gpu-a) is recorded done, but its recorded steps are not a passed run of the batch "
                   "(recorded: cordon gpu-a ok, drain gpu-a ok, driver ok, reboot gpu-a ok, validate failed;"),
    (lambda d: (_canary_done(d), d["batches"][0].pop("steps")), "batch 1 (gpu-a) is recorded done, but no step of "
                                                                 "it is recorded (its validate among them)"),
    (lambda d: d["batches"][1].update(status="done", steps=[]), "batch 2 (gpu-b) is recorded done after batch 1 "
                                                                "is failed"),
    (lambda d: d.update(phase="done"), "phase is done, but batch(es) 1, 2, 3 are not"),
])
def test_resume_refuses_a_state_whose_batches_the_run_cannot_have_written(tmp_path, monkeypatch, edit, named):
    """A hand-edited state file (the failed canary marked done, batches merged, reordered or renamed, a batch done
    out of order) is refused before the cluster is read: exit 2 naming the file, the batch and what differs, nothing
    drained, the file as it was."""
    rig, doc = _failed_canary(tmp_path, monkeypatch)
    edit(doc)
    rig.state_file.write_text(json.dumps(doc))
    before = rig.state_file.read_bytes()
    monkeypatch.setattr("installer.upgrade.cluster.read", lambda *a, **k: pytest.fail("read the cluster"))
    with pytest.raises(ConfigError) as err:
        rig.run(resume=True)
    msg = err.value.message
    assert err.value.exit_code == 2 and msg.startswith(f"upgrade state file {rig.state_file}: ")
    assert named.format(plan=rig.plan_file) in msg
    hint = err.value.hint or ""
    assert f"--state {rig.state_file} --yes" in hint and f"mv {rig.state_file} {rig.state_file}.abandoned" in hint
    assert "gpu-install upgrade plan -s site.yaml -i hosts.yml -o FILE" in hint
    assert rig.log == [] and rig.state_file.read_bytes() == before


def test_resume_refuses_a_plan_file_whose_batches_are_not_its_nodes(tmp_path, monkeypatch):
    """The plan file and the state file merged alike: the plan's own batches are recomputed from its nodes and
    limits (nodes.batches, as upgrade plan made them) and the edit is refused (exit 2)."""
    rig, state_doc = _failed_canary(tmp_path, monkeypatch)
    _merge_2_and_3(state_doc)
    rig.state_file.write_text(json.dumps(state_doc))
    plan = json.loads(rig.plan_file.read_text())
    plan["batches"][1]["nodes"] += plan["batches"].pop(2)["nodes"]
    rig.plan_file.write_text(json.dumps(plan))
    with pytest.raises(ConfigError) as err:
        rig.run(resume=True)
    assert err.value.message == (f"--plan {rig.plan_file}: batches: batch 2: the plan file's has gpu-b, gpu-c, its "
                                 "nodes' gpu-b")
    assert err.value.exit_code == 2 and rig.log == []


def test_each_step_of_a_batch_is_recorded_with_its_outcome(tmp_path, monkeypatch):
    rig, doc = _failed_canary(tmp_path, monkeypatch)
    assert doc["batches"][0]["steps"] == [
        {"step": "cordon", "node": "gpu-a", "outcome": "ok"}, {"step": "drain", "node": "gpu-a", "outcome": "ok"},
        {"step": "driver", "node": None, "outcome": "ok"}, {"step": "reboot", "node": "gpu-a", "outcome": "ok"},
        {"step": "validate", "node": None, "outcome": "failed"}]
    assert doc["batches"][1]["steps"] == [] and doc["batches"][1]["status"] == "pending"
    rig.run(resume=True)  # the canary again from its start: its steps are this attempt's
    rec = rig.saved()
    assert [(s.step, s.node, s.outcome) for s in rec.batches[0].steps] == [
        ("cordon", "gpu-a", "ok"), ("drain", "gpu-a", "ok"), ("driver", None, "ok"), ("reboot", "gpu-a", "ok"),
        ("validate", None, "ok"), ("uncordon", "gpu-a", "ok")]
    assert all(b.status == "done" for b in rec.batches) and rec.phase == "done"
    rig.log.clear()
    out = rig.run(resume=True)  # done and consistent: nothing to resume
    assert out.message == "already done" and rig.log == []


def test_operator_mode_records_the_release_step(tmp_path, monkeypatch):
    rig = Rig(tmp_path, monkeypatch, driver={"mode": "operator"})
    rig.cluster = Cluster("v23.6.2", revision=3)
    rig.write_plan()
    monkeypatch.setitem(sys.modules, "installer.upgrade.operator_rollout", FakeOperatorRollout(rig.log, {}))
    rig.run()
    assert [[(s.step, s.outcome) for s in b.steps] for b in rig.saved().batches] == [[("release", "ok")]] * 2
    st.check_history(rig.saved(), rig.state_file)


@pytest.mark.parametrize(("content", "named"), [
    ("[" * 200_000 + "]" * 200_000, "nested more than 64 levels deep"),
    ('{"schema": "gpu-install.upgrade-state/v1", "schema": "x"}', "key 'schema' is given twice in one object"),
])
def test_a_state_file_nested_deep_or_with_a_key_twice_is_refused(tmp_path, content, named):
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        st.load(path)
    assert err.value.message.startswith(f"upgrade state file {path}: {named}") and err.value.exit_code == 2
