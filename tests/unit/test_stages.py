"""The stage runner (installer.stages) and the stage lists of apply and uninstall (installer.pipeline).

The stage table must list every stage whatever happened: each stage is made to fail in turn (its work stubbed at
the entry points the pipeline calls: the runner and the stage lists are what is tested; the stages' real work is
tested in test_uninstall.py, test_ansible_apply.py and the lab tests) and the whole table is checked each time."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from installer import pipeline, stages
from installer.ansible import HostStats, RunResult
from installer.apply import RunOptions
from installer.config import parse_site
from installer.errors import (
    ClusterError,
    ConfigError,
    HostFailures,
    HostsUnreachable,
    PreflightError,
    ValidationFindings,
)
from installer.stages import Result, Row, Stage
from tests.conftest import plan_of

# ---------------------------------------------------------------- the runner


def _toy(calls: list[str], failing: str | None, error: BaseException | None = None) -> list[Stage]:
    """Four stages: a, b (skipped: its precondition says why), c, d; `failing` raises `error`."""
    def work(name: str, outcome: str) -> Stage:
        def run() -> Result:
            calls.append(f"run {name}")
            if name == failing:
                raise error or HostFailures(f"{name} broke (run artifacts: /x)")
            return Result(outcome, f"{name} done")

        def skip() -> str | None:
            calls.append(f"skip? {name}")
            return "not wanted here" if name == "b" else None

        return Stage(name, run, skip=skip)

    return [work("a", "ok"), work("b", "changed"), work("c", "changed"), work("d", "unchanged")]


@pytest.mark.parametrize("failing", ["a", "c", "d"])
def test_every_stage_has_its_row_whichever_fails(failing):
    calls: list[str] = []
    rows: list[Row] = []
    error = HostFailures(f"{failing} broke (run artifacts: /x)")
    with pytest.raises(HostFailures) as exc:
        stages.run(_toy(calls, failing, error), rows)
    assert exc.value is error  # the stage's own exception: its exit code is the command's
    expected = {
        "a": [("a", "failed", "a broke (run artifacts: /x)"), ("b", "not run", "a failed"),
              ("c", "not run", "a failed"), ("d", "not run", "a failed")],
        "c": [("a", "ok", "a done"), ("b", "skipped", "not wanted here"), ("c", "failed", "c broke (run artifacts: /x)"),
              ("d", "not run", "c failed")],
        "d": [("a", "ok", "a done"), ("b", "skipped", "not wanted here"), ("c", "changed", "c done"),
              ("d", "failed", "d broke (run artifacts: /x)")],
    }[failing]
    assert [(r.name, r.outcome, r.detail) for r in rows] == expected
    # nothing of a stage after the failure is asked, not even its precondition; a skipped stage does not run
    assert calls == {"a": ["skip? a", "run a"],
                     "c": ["skip? a", "run a", "skip? b", "skip? c", "run c"],
                     "d": ["skip? a", "run a", "skip? b", "skip? c", "run c", "skip? d", "run d"]}[failing]


def test_all_ok_returns_the_rows_and_the_table_text():
    rows: list[Row] = []
    assert stages.run(_toy([], None), rows) is rows
    assert stages.table("apply stages:", rows) == (
        "apply stages:\n"
        "stage  outcome    detail\n"
        "a      ok         a done\n"
        "b      skipped    not wanted here\n"
        "c      changed    c done\n"
        "d      unchanged  d done")


def test_failed_row_in_capitals_and_not_run_naming_the_stage():
    rows: list[Row] = []
    with pytest.raises(HostFailures):
        stages.run(_toy([], "c"), rows)
    assert stages.table("t", rows).splitlines()[1:] == [
        "stage  outcome  detail",
        "a      ok       a done",
        "b      skipped  not wanted here",
        "c      FAILED   c broke (run artifacts: /x)",
        "d      not run  c failed"]


def test_failure_detail_per_stage_and_cut_to_length():
    rows: list[Row] = []
    long = HostFailures("x" * 1000 + " (run artifacts: /tmp/r)")
    with pytest.raises(HostFailures):
        stages.run([Stage("n", lambda: (_ for _ in ()).throw(long),
                          failure=lambda e: e.message.split(" (run artifacts")[0])], rows)
    assert rows[0].outcome == "failed" and rows[0].detail == "x" * stages.DETAIL_MAX


def test_a_result_with_an_error_fails_with_its_detail_and_raises_it():
    findings = ValidationFindings("validate: 1 check(s) failed")
    rows: list[Row] = []
    with pytest.raises(ValidationFindings) as exc:
        stages.run([Stage("v", lambda: Result("passed", "1 fail, 3 pass (0.1s)", findings)),
                    Stage("after", lambda: pytest.fail("must not run"))], rows)
    assert exc.value is findings
    assert [(r.name, r.outcome, r.detail) for r in rows] == [("v", "failed", "1 fail, 3 pass (0.1s)"),
                                                             ("after", "not run", "v failed")]


def test_interrupt_and_unexpected_errors_are_rows_too_without_their_message():
    def boom() -> Result:
        raise ValueError("token=s3cr3t in an unexpected message")

    def cancel() -> Result:
        raise KeyboardInterrupt

    rows: list[Row] = []
    with pytest.raises(ValueError):
        stages.run([Stage("one", boom), Stage("two", lambda: Result("ok"))], rows)
    assert [(r.name, r.outcome, r.detail) for r in rows] == [("one", "failed", "internal error: ValueError"),
                                                             ("two", "not run", "one failed")]
    rows = []
    with pytest.raises(KeyboardInterrupt):
        stages.run([Stage("one", lambda: Result("ok")), Stage("two", cancel), Stage("three", lambda: Result("ok"))],
                   rows)
    assert [(r.name, r.outcome, r.detail) for r in rows] == [("one", "ok", ""), ("two", "failed", "cancelled"),
                                                             ("three", "not run", "two failed")]


def test_a_precondition_that_raises_fails_its_stage():
    def skip() -> str | None:
        raise ConfigError("cannot tell")

    rows: list[Row] = []
    with pytest.raises(ConfigError):
        stages.run([Stage("one", lambda: Result("ok"), skip=skip), Stage("two", lambda: Result("ok"))], rows)
    assert [(r.name, r.outcome, r.detail) for r in rows] == [("one", "failed", "cannot tell"),
                                                             ("two", "not run", "one failed")]


def test_records_carry_name_outcome_reason_and_seconds():
    def slow() -> Result:
        time.sleep(0.05)
        return Result("changed", "took a while")

    rows = stages.run([Stage("slow", slow), Stage("off", lambda: Result("ok"), skip=lambda: "--skip-off")], [])
    recs = stages.records(rows)
    assert [set(r) for r in recs] == [{"name", "outcome", "reason", "seconds"}] * 2
    assert recs[0]["name"] == "slow" and recs[0]["outcome"] == "changed" and recs[0]["reason"] == "took a while"
    assert 0.05 <= recs[0]["seconds"] < 5
    assert recs[1] == {"name": "off", "outcome": "skipped", "reason": "--skip-off", "seconds": 0.0}


def test_changed_words():
    assert [stages.changed(n, check) for n, check in ((0, False), (2, False), (0, True), (True, True))] == [
        "unchanged", "changed", "unchanged", "would change"]


# ---------------------------------------------------------------- apply and uninstall, each stage failing in turn

APPLY = ["preflight", "nodes", "operator", "sharing", "monitoring", "mig", "validate"]
UNINSTALL = ["sharing", "monitoring", "operator", "nodes", "packages"]

#: the table of a run where every stage does its work (the stubs' results below)
APPLY_OK = [
    ("preflight", "ok", "1 host(s) checked, read-only"),
    ("nodes", "changed", "changed=3 on 1 host(s); run records /runs/site"),
    ("operator", "changed", "release gpu-operator (chart): revision 1 deployed"),
    ("sharing", "changed", "gpu-manager installed; labelled gpu1"),
    ("monitoring", "unchanged", "ServiceMonitor unchanged"),
    ("mig", "changed", "nvidia.com/mig.config on 1 node(s), 1 set"),
    ("validate", "passed", "12 pass (2.0s)"),
]
UNINSTALL_OK = [
    ("sharing", "removed", "Helm release gpu-manager in kube-system removed"),
    ("monitoring", "unchanged", "nothing of it was there"),
    ("operator", "removed", "release gpu-operator: uninstalled"),
    ("nodes", "changed", "changed=2 on 1 host(s); run records /runs/uninstall"),
    ("packages", "kept", "no package gpu-install installed was left to remove"),
]

#: what each stage raises when it is the one failing: the error the real stage raises there, with its exit code
ERRORS = {
    "preflight": lambda: PreflightError("preflight failed on gpu1: no GPU (run artifacts: /runs/pre)"),
    "nodes": lambda: HostFailures("tasks failed on gpu1: apt broke (run artifacts: /runs/site)"),
    "operator": lambda: ClusterError("helm upgrade --install failed: timed out"),
    "sharing": lambda: ClusterError("gpu-manager did not start on gpu1"),
    "monitoring": lambda: ClusterError("ServiceMonitor refused"),
    "mig": lambda: ClusterError("node gpu1 not found"),
    "validate": lambda: HostsUnreachable("validate: cannot reach gpu1"),
    "packages": lambda: HostFailures("run records unreadable"),
}


@pytest.fixture
def staged_plan(tmp_path):
    """A site where every apply stage has work: gpumanager (sharing), monitoring, a MIG layout on gpu1."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": {"gpu1": {"gpu_install_os": "ubuntu22.04", "gpu_install_mig_config": "all-1g.10gb"}}},
        "kube_control_plane": {"hosts": {"cp": {}}}}}}))
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"},
                       "toolkit": {"mode": "host"}, "components": {"devicePlugin": {"enabled": False}},
                       "sharing": {"mode": "gpumanager"}, "monitoring": {"enabled": True}})
    return plan_of(site, inventory=str(inv))


class Stubs:
    """The entry points the stages call, each doing nothing but answering like the real one, or raising when its
    stage is the failing one. calls: which ran."""

    def __init__(self, monkeypatch, failing: str | None):
        from installer import apply, kube, mig, offline_checks, operator, validate
        from installer.features import StageResult, gpumanager, monitoring

        self.failing, self.calls, self.runs = failing, [], {}
        report = SimpleNamespace(changed=True, lines=lambda: ["namespace gpu-operator: created",
                                                              "release gpu-operator (chart): revision 1 deployed",
                                                              "operator install ok in 1.0s: changed"])
        prepared = SimpleNamespace(chart="chart", shown="chart", kubeconfig=Path("/kc"))
        run_result = {"site.yml": RunResult("site.yml", {"gpu1": HostStats(changed=3)}, artifacts=Path("/runs/site")),
                      "uninstall.yml": RunResult("uninstall.yml", {"gpu1": HostStats(changed=2)},
                                                 artifacts=Path("/runs/uninstall"))}
        validated = SimpleNamespace(counts=lambda: {"pass": 12, "fail": 0, "unreachable": 0}, seconds=2.0,
                                    exit_code=lambda: 0)
        for mod, name, stage, answer in [
            (operator, "prepare", None, prepared),
            (operator, "check_cluster", None, ""),
            # the site conflicts the preflight stage checks first (the MIG layout on gpu1 gives the mig stage work;
            # beside gpumanager a real apply refuses it: tested in test_config_check_offline.py)
            (offline_checks, "conflicts", None, None),
            (kube, "api_client", None, object()),
            (kube, "resolve_kubeconfig", None, Path("/kc")),
            (gpumanager.FEATURE, "check_cluster", None, None),
            (monitoring.FEATURE, "check_cluster", None, "serviceMonitor"),  # the scrape flavour its stage gets
            (apply, "preflight", "preflight", RunResult("preflight.yml", {"gpu1": HostStats()})),
            (apply, "run_nodes", "nodes", None),
            (operator, "install", "operator", report),
            (gpumanager.FEATURE, "apply", "sharing", StageResult("changed", "gpu-manager installed; labelled gpu1")),
            (monitoring.FEATURE, "apply", "monitoring", StageResult("unchanged", "ServiceMonitor unchanged")),
            (mig, "label_nodes", "mig", [SimpleNamespace(changed=True)]),
            (validate, "run", "validate", validated),
            (gpumanager.FEATURE, "uninstall", "sharing", ["Helm release gpu-manager in kube-system removed"]),
            (monitoring.FEATURE, "uninstall", "monitoring", []),
            (operator, "uninstall", "operator", SimpleNamespace(release_removed=True,
                                                                lines=lambda: ["release gpu-operator: uninstalled"])),
            (pipeline, "removed_packages", "packages", {}),
        ]:
            where = getattr(mod, "__name__", None) or f"features.{mod.name}"

            def stub(*args, _name=f"{where}.{name}", _stage=stage, _answer=answer, **kw):
                self.calls.append(_name)
                if _name.endswith(".apply"):  # a feature's stage: what apply hands it
                    self.runs[_name] = args[0]
                if _stage is not None and _stage == self.failing:
                    raise self.error
                if _name == "installer.apply.run_nodes":
                    return run_result[args[0]]
                return _answer

            monkeypatch.setattr(mod, name, stub)
        self.error = ERRORS[failing]() if failing else None


def _apply(plan, monkeypatch, failing=None, **op):
    stubs = Stubs(monkeypatch, failing)
    summary = pipeline.Summary("apply")
    options = pipeline.OperatorOptions(mirror_check=False, **op)
    if failing is None:
        pipeline.run_apply(plan, RunOptions(), options, summary)
        return summary, stubs, None
    with pytest.raises(type(stubs.error)) as exc:
        pipeline.run_apply(plan, RunOptions(), options, summary)
    return summary, stubs, exc.value


def _rows(summary):
    return [(r.name, r.outcome, r.detail) for r in summary.stages]


def test_apply_all_stages_ok(staged_plan, monkeypatch):
    summary, stubs, _ = _apply(staged_plan, monkeypatch)
    assert _rows(summary) == APPLY_OK
    assert summary.nodes_changed == 3 and summary.report is not None
    # each feature's stage gets the cluster, the options and what its own cluster check found in preflight
    sharing_run, monitoring_run = stubs.runs["features.gpumanager.apply"], stubs.runs["features.monitoring.apply"]
    assert (sharing_run.kubeconfig, sharing_run.check, sharing_run.cluster) == (Path("/kc"), False, None)
    assert (monitoring_run.plan, monitoring_run.cluster, monitoring_run.timeout) == (staged_plan, "serviceMonitor", 300)
    assert [r["name"] for r in summary.records()] == APPLY


@pytest.mark.parametrize("failing", APPLY)
def test_apply_each_stage_failing_in_turn(staged_plan, monkeypatch, failing):
    summary, stubs, raised = _apply(staged_plan, monkeypatch, failing)
    assert raised is stubs.error  # raised as the stage raised it: apply's exit code is that stage's
    i = APPLY.index(failing)
    failed_detail = {  # a node stage's detail leaves out the run records' path
        "preflight": "preflight failed on gpu1: no GPU",
        "nodes": "tasks failed on gpu1: apt broke",
    }.get(failing, stubs.error.message)
    assert _rows(summary) == [*APPLY_OK[:i], (failing, "failed", failed_detail),
                              *((name, "not run", f"{failing} failed") for name in APPLY[i + 1:])]


def test_apply_operator_failing_prints_the_whole_table(staged_plan, monkeypatch):
    summary, _, _ = _apply(staged_plan, monkeypatch, "operator")
    assert summary.table() == (
        "apply stages:\n"
        "stage       outcome  detail\n"
        "preflight   ok       1 host(s) checked, read-only\n"
        "nodes       changed  changed=3 on 1 host(s); run records /runs/site\n"
        "operator    FAILED   helm upgrade --install failed: timed out\n"
        "sharing     not run  operator failed\n"
        "monitoring  not run  operator failed\n"
        "mig         not run  operator failed\n"
        "validate    not run  operator failed")


def test_apply_validate_findings_fail_the_stage_with_its_counts(staged_plan, monkeypatch):
    from installer import validate

    stubs = Stubs(monkeypatch, None)
    found = SimpleNamespace(counts=lambda: {"pass": 10, "fail": 2, "unreachable": 0}, seconds=3.0, exit_code=lambda: 6)
    monkeypatch.setattr(validate, "run", lambda *a, **k: found)
    summary = pipeline.Summary("apply")
    with pytest.raises(ValidationFindings, match=r"validate: 2 check\(s\) failed after the install"):
        pipeline.run_apply(staged_plan, RunOptions(), pipeline.OperatorOptions(mirror_check=False), summary)
    assert _rows(summary) == [*APPLY_OK[:-1], ("validate", "failed", "10 pass, 2 fail (3.0s)")]
    assert summary.report is found and "installer.validate.run" not in stubs.calls


def test_apply_skip_operator_lists_every_stage_skipped_with_its_reason(staged_plan, monkeypatch):
    summary, stubs, _ = _apply(staged_plan, monkeypatch, enabled=False)
    assert _rows(summary) == [
        *APPLY_OK[:2],
        ("operator", "skipped", "--skip-operator"),
        ("sharing", "skipped", "runs with the operator stage"),
        ("monitoring", "skipped", "runs with the operator stage"),
        ("mig", "skipped", "runs with the operator stage"),
        ("validate", "skipped", "runs after the operator stage: run `gpu-install validate` once the operator is up")]
    assert not any(c.startswith(("installer.operator", "features.", "installer.mig")) for c in stubs.calls)
    # preflight failing: the later stages are not run, also those that would have been skipped
    summary, _, _ = _apply(staged_plan, monkeypatch, "preflight", enabled=False)
    assert [row[1:] for row in _rows(summary)[1:]] == [("not run", "preflight failed")] * 6


def test_apply_stages_not_configured_say_so(monkeypatch, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "gpu1": {"gpu_install_os": "ubuntu22.04"}}}}}}))
    plan = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"}}),
                   inventory=str(inv))
    summary, stubs, _ = _apply(plan, monkeypatch, wait=False)
    assert _rows(summary)[3:] == [
        ("sharing", "skipped", "no sharing.mode with a release of its own (gpumanager, hami) and no mig.dynamic nos"),
        ("monitoring", "skipped", "monitoring.enabled is false"),
        ("mig", "skipped", "no MIG layout configured (site mig.config / inventory gpu_install_mig_config)"),
        ("validate", "skipped", "--no-wait: the operator's pods may not be up yet; run `gpu-install validate` when "
                                "they are")]
    assert not stubs.runs and "installer.mig.label_nodes" not in stubs.calls


def _uninstall(plan, monkeypatch, failing=None):
    stubs = Stubs(monkeypatch, failing)
    summary = pipeline.Summary("uninstall")
    if failing is None:
        pipeline.run_uninstall(plan, RunOptions(), pipeline.OperatorOptions(), True, summary)
        return summary, stubs, None
    with pytest.raises(type(stubs.error)) as exc:
        pipeline.run_uninstall(plan, RunOptions(), pipeline.OperatorOptions(), True, summary)
    return summary, stubs, exc.value


def test_uninstall_all_stages_ok(staged_plan, monkeypatch):
    summary, _, _ = _uninstall(staged_plan, monkeypatch)
    assert _rows(summary) == UNINSTALL_OK and summary.nodes_changed == 2


@pytest.mark.parametrize("failing", UNINSTALL)
def test_uninstall_each_stage_failing_in_turn(staged_plan, monkeypatch, failing):
    summary, stubs, raised = _uninstall(staged_plan, monkeypatch, failing)
    assert raised is stubs.error
    i = UNINSTALL.index(failing)
    failed_detail = "tasks failed on gpu1: apt broke" if failing == "nodes" else stubs.error.message
    assert _rows(summary) == [*UNINSTALL_OK[:i], (failing, "failed", failed_detail),
                              *((name, "not run", f"{failing} failed") for name in UNINSTALL[i + 1:])]


def test_uninstall_without_yes_has_no_stage_and_touches_nothing(staged_plan, monkeypatch):
    stubs = Stubs(monkeypatch, None)
    summary = pipeline.Summary("uninstall")
    with pytest.raises(ConfigError, match="not confirmed; nothing was changed"):
        pipeline.run_uninstall(staged_plan, RunOptions(), pipeline.OperatorOptions(), False, summary)
    assert summary.stages == [] and stubs.calls == []
