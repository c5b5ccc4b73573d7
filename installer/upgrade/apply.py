"""`gpu-install upgrade apply --plan plan.json --yes [--resume]`: the plan `upgrade plan -o` wrote, applied batch by
batch (docs/upgrade.md "upgrade apply").

In order:
1. The plan file (schema gpu-install.upgrade-plan/v1, untrusted: every field read is type-checked) is refused when it
   has blockers or an error (exit 3). The cluster is read again (installer.upgrade.cluster) and the plan rebuilt with
   the plan file's --max-parallel/--max-unavailable: a different plan hash is a stale plan (exit 3, naming what
   changed: the fields of the two plans compared), nothing changed. A plan with nothing to do ends there (exit 0).
2. The state file (installer.upgrade.state) is written before anything changes: the plan hash, the release's
   revision and chart now, each node's driver version now and whether it is cordoned, the batches.
3. Air gap: every image the release deploys is in registry.host (installer.mirror.verify.for_apply, apply's mirror
   check; exit 3), and with packages.url every package root the driver role installs (packages_for_apply).
4. driver.mode operator|precompiled with batches: the skip label on every GPU node (installer.upgrade.
   operator_rollout.hold_all), so that the operator's upgrade controller waits for the batches.
5. The release: CRDs server-side, then `helm upgrade --install --skip-crds` with the rendered values (installer.
   operator.install, the path apply's operator stage takes). Its new revision is recorded.
6. The batches, canary first: host|runfile through installer.upgrade.host_rollout (cordon, drain with PDBs
   honoured, driver role, reboot and wait, validate, uncordon); operator|precompiled through operator_rollout.
   release_batch (the skip label lifted on the batch, the controller's state label watched to upgrade-done). Each
   batch is recorded done before the next starts; a failed batch stops the run with its nodes left cordoned and
   named, the later batches untouched (exit 4 for a node step, 6 for validate findings, 5 unreachable).
7. operator mode: the labels restored (operator_rollout.lift_all); the state's phase `done`.

--resume continues the run recorded in the state file for the same plan hash: the finished batches are not run
again, the batch that was running starts over (every step is safe to repeat). The state file is first held to the
plan and to what the run can have written (check_batches, exit 2, nothing changed): its batches exactly those
recomputed from the plan document (installer.upgrade.nodes.batches, as upgrade plan made them), a done batch only with
every step of it recorded passed (state.check_history) -- a failed batch becomes done only by running again. The stale-plan check is then not the
hash (the run itself changed what it covers: the Helm revision, the nodes' cordons and labels) but what the run
expects: the release at the revision the run's helm upgrade made (or, before it, at the revision recorded), with the
target's chart and the same rendered values (their hash), the same Kubernetes version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from installer.errors import (
    EXIT_OK,
    ConfigError,
    GpuInstallError,
    PreflightError,
)
from installer.upgrade import state as st

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.progress import Display
    from installer.upgrade.cluster import ClusterState
    from installer.upgrade.model import Batch
    from installer.upgrade.plan import UpgradePlan

Progress = Callable[[str], None]
PLAN_SCHEMA = "gpu-install.upgrade-plan/v1"
MAX_PLAN_BYTES = 32 << 20
HOST_MODES = ("host", "runfile")


@dataclass(frozen=True)
class Options:
    plan_file: str
    resume: bool = False
    kubeconfig: str | None = None
    chart: str | None = None
    state_file: str | None = None
    operator_timeout: float = 300.0
    wait: bool = True
    drain_timeout: float = 300.0
    node_timeout: float = 900.0  # a node back Ready after its reboot
    batch_timeout: float = 1800.0  # operator mode: a batch's nodes reach upgrade-done
    validate_timeout: float = 300.0
    validate_layers: tuple[str, ...] = ("node", "runtime", "smoke")  # a batch's validation (validate --only)
    mirror_check: bool = True


@dataclass
class Outcome:
    plan_hash: str
    state_path: Path | None
    state: st.State | None
    nothing_to_do: bool = False
    resumed: bool = False
    exit_code: int = EXIT_OK
    seconds: dict[int, float] = field(default_factory=dict)  # batch index -> seconds it took in this run
    message: str = ""


# ---------------------------------------------------------------- the plan file


def _bad_plan(path: str, what: str) -> ConfigError:
    return ConfigError(f"--plan {path}: {what}",
                       hint="give the file `gpu-install upgrade plan -o FILE` wrote (schema "
                            f"{PLAN_SCHEMA}), unchanged")


def load_plan_doc(path: str) -> dict[str, Any]:
    """The plan document, its fields apply reads checked (ConfigError, exit 2, naming the field); read through
    installer.safefile.read_json (at most MAX_PLAN_BYTES, nested at most 64 levels, no key given twice)."""
    from installer.safefile import read_json

    doc = read_json(Path(path), "plan file", MAX_PLAN_BYTES,
                    hint=f"give the file `gpu-install upgrade plan -o FILE` wrote (schema {PLAN_SCHEMA}), unchanged")
    if not isinstance(doc, dict):
        raise _bad_plan(path, "not a JSON object")
    if doc.get("schema") != PLAN_SCHEMA:
        raise _bad_plan(path, f"schema {doc.get('schema')!r}, not {PLAN_SCHEMA}")
    for key, kind in (("planHash", str), ("batches", list), ("nodes", list), ("blockers", list),
                      ("maxParallel", int), ("maxUnavailable", str), ("nothingToDo", bool)):
        value = doc.get(key)
        if key == "planHash" and value is None and doc.get("error"):
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _bad_plan(path, f"{key}: {type(value).__name__} where {kind.__name__} belongs")
    for i, b in enumerate(doc["batches"]):
        if not (isinstance(b, dict) and isinstance(b.get("index"), int) and isinstance(b.get("canary"), bool)
                and isinstance(b.get("nodes"), list) and all(isinstance(n, str) for n in b["nodes"])):
            raise _bad_plan(path, f"batches[{i}]: not {{index, nodes, canary}}")
    for i, n in enumerate(doc["nodes"]):
        if not (isinstance(n, dict) and isinstance(n.get("name"), str)):
            raise _bad_plan(path, f"nodes[{i}]: no name")
    return doc


def plan_batches(path: str, doc: Mapping[str, Any]) -> tuple[Batch, ...]:
    """The batches recomputed from the plan document's nodes and limits by the function that made them
    (installer.upgrade.nodes.batches), and the document's own batches required to be those (ConfigError, exit 2,
    naming the first that differs): what --resume holds the state file's batches to."""
    from installer.upgrade import nodes as node_side
    from installer.upgrade.model import Blocker, NodePlan

    actions = ("none", "operand-restart", "driver-reload", "host-reboot")
    plans: list[NodePlan] = []
    for i, n in enumerate(doc["nodes"]):
        flags = {k: n.get(k) for k in ("present", "ready", "cordoned")}
        if n.get("action") not in actions or not all(isinstance(v, bool) for v in flags.values()) \
                or not isinstance(n.get("blockers"), list):
            raise _bad_plan(path, f"nodes[{i}] ({n['name']}): not {{name, action, present, ready, cordoned, "
                                  "blockers}")
        plans.append(NodePlan(name=n["name"], action=n["action"], evicts=(),
                              blockers=tuple(Blocker(n["name"], str(b), "") for b in n["blockers"]),
                              cordoned=flags["cordoned"], ready=flags["ready"], upgrade_state=None,
                              present=flags["present"]))
    try:
        limit = node_side.max_unavailable_arg(str(doc["maxUnavailable"]))
        batches, _ = node_side.batches(plans, int(doc["maxParallel"]), limit)
    except ConfigError as exc:
        raise _bad_plan(path, exc.message) from None
    recorded = [(b["index"], list(b["nodes"]), b["canary"]) for b in doc["batches"]]
    computed = [(b.index, list(b.nodes), b.canary) for b in batches]
    if recorded != computed:
        raise _bad_plan(path, "batches: " + _batch_difference(recorded, computed, "the plan file's", "its nodes'"))
    return batches


def _batch_difference(got: list[tuple[int, list[str], bool]], want: list[tuple[int, list[str], bool]],
                      got_name: str, want_name: str) -> str:
    """The first difference between two batch lists, in words."""
    def show(b: tuple[int, list[str], bool]) -> str:
        return f"{', '.join(b[1]) or 'no node'}{' (canary)' if b[2] else ''}"

    for pos, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return (f"batch {pos + 1}: {got_name} has index {a[0]}: {show(a)}, {want_name} index {b[0]}: {show(b)}"
                    if a[0] != b[0] else f"batch {b[0]}: {got_name} has {show(a)}, {want_name} {show(b)}")
    return (f"{got_name} has {len(got)} batch(es), {want_name} {len(want)} (the first not in both: batch "
            f"{min(len(got), len(want)) + 1})")


def check_batches(rec: st.State, path: Path, plan_file: str, doc: Mapping[str, Any]) -> None:
    """--resume: the state file's batches are exactly the plan's (same batches, same nodes in the same order, the
    same canary), and the record is one the run can have written (state.check_history); ConfigError (exit 2)
    naming the state file, the batch and what differs. Nothing is changed before this passed."""
    computed = plan_batches(plan_file, doc)
    recorded = [(b.index, list(b.nodes), b.canary) for b in rec.batches]
    want = [(b.index, list(b.nodes), b.canary) for b in computed]
    if recorded != want:
        raise ConfigError(f"upgrade state file {path}: its batches are not those of --plan {plan_file}: "
                          + _batch_difference(recorded, want, "the state file", "the plan"),
                          hint=st.redo_hint(rec, path))
    st.check_history(rec, path)


def refuse_blocked(path: str, doc: Mapping[str, Any]) -> None:
    """A plan that failed or that has blockers is not applied (exit 3)."""
    err = doc.get("error")
    if isinstance(err, dict) or doc.get("planHash") is None:
        msg = err.get("message") if isinstance(err, dict) else None
        raise PreflightError(f"--plan {path}: the plan did not finish ({msg or 'no plan hash'})",
                             hint="fix what it says and run `gpu-install upgrade plan -o FILE` again")
    blockers = [b for b in doc["blockers"] if isinstance(b, dict)]
    if doc["blockers"]:
        named = "; ".join(f"{b.get('where')}: {b.get('what')}" for b in blockers[:5])
        more = f" (and {len(blockers) - 5} more)" if len(blockers) > 5 else ""
        raise PreflightError(f"--plan {path} has {len(doc['blockers'])} blocker(s): {named}{more}",
                             hint="fix each as the plan says, then run `gpu-install upgrade plan -o FILE` again and "
                                  "apply the new plan")


# ---------------------------------------------------------------- stale plans


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def plan_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between the plan file and the plan rebuilt from the cluster now, field by field (the fields the
    plan document shows of what its hash covers)."""
    out: list[str] = []
    for key in ("kubernetesVersion", "targetVersion", "maxParallel", "maxUnavailable"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {_short(old.get(key))} -> {_short(new.get(key))}")
    o_rel, n_rel = old.get("release"), new.get("release")
    if isinstance(o_rel, dict) and isinstance(n_rel, dict):
        for key in sorted(set(o_rel) | set(n_rel)):
            if o_rel.get(key) != n_rel.get(key):
                out.append(f"release {key}: {_short(o_rel.get(key))} -> {_short(n_rel.get(key))}")
    elif o_rel != n_rel:
        out.append(f"release: {_short(o_rel)} -> {_short(n_rel)}")
    for key in ("components", "valuesDiff", "crdChanges"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: changed")
    o_nodes = {n["name"]: n for n in old.get("nodes") or [] if isinstance(n, dict) and "name" in n}
    n_nodes = {n["name"]: n for n in new.get("nodes") or [] if isinstance(n, dict) and "name" in n}
    for name in sorted(set(o_nodes) | set(n_nodes)):
        a, b = o_nodes.get(name), n_nodes.get(name)
        if a is None or b is None:
            out.append(f"node {name}: {'new in the plan' if a is None else 'no longer in the plan'}")
            continue
        for key in ("present", "ready", "cordoned", "upgradeState", "action", "evicts"):
            if a.get(key) != b.get(key):
                out.append(f"node {name} {key}: {_short(a.get(key))} -> {_short(b.get(key))}")
        if [x.get("what") for x in a.get("blockers") or [] if isinstance(x, dict)] != \
                [x.get("what") for x in b.get("blockers") or [] if isinstance(x, dict)]:
            out.append(f"node {name} blockers: changed")
    if old.get("batches") != new.get("batches"):
        out.append("batches: " + _short(old.get("batches")) + " -> " + _short(new.get("batches")))
    return out


def stale(path: str, doc: Mapping[str, Any], up: UpgradePlan) -> PreflightError:
    from installer.upgrade.plan import to_doc_fields

    changes = plan_changes(doc, to_doc_fields(up, path)) or [
        "what only the hash shows: the deployed values, a CRD's resourceVersion, a node's skip label, the site's "
        "rendered values or the target chart (its sha256, rendered objects or CRDs)"]
    return PreflightError(f"plan is stale: --plan {path} has hash {doc['planHash']}, the cluster now gives "
                          f"{up.plan_hash}; changed: " + "; ".join(changes),
                          hint="run `gpu-install upgrade plan -o FILE` again, review it, and apply the new plan; "
                               "nothing was changed")


# ---------------------------------------------------------------- the state file


def new_state(plan: Plan, up: UpgradePlan, cluster: ClusterState, doc: Mapping[str, Any], site: str,
              inventory: str | None) -> st.State:
    from installer.upgrade.nodes import node_driver_version

    cur = up.report.current
    mode = plan.site.driver.mode
    labels = {n.name: n.labels for n in cluster.nodes}
    driver_row = next((c for c in up.report.changes if c.component == "driver"), None)
    deployed_driver = None
    if driver_row and driver_row.current and " " in driver_row.current:
        deployed_driver = driver_row.current.split(" ", 1)[1]
    nodes = {}
    for n in up.nodes:
        version = node_driver_version(labels.get(n.name, {})) if mode in HOST_MODES else deployed_driver
        nodes[n.name] = st.NodeRecord(version, n.cordoned)
    batches = [st.BatchRecord(b.index, list(b.nodes), b.canary) for b in up.batches]
    op = plan.site.operator
    return st.State(planHash=str(doc["planHash"]), site=site, inventory=inventory,
                    targetVersion=plan.release.version, targetValuesHash=st.values_hash(plan.values),
                    driverMode=mode, releaseName=op.releaseName, releaseNamespace=op.namespace,
                    previous=None if cur is None else st.Revision(cur.revision, cur.chart_version),
                    nodes=nodes, batches=batches)


def check_resume(rec: st.State, plan: Plan, cluster: ClusterState, path: Path) -> None:
    """--resume after the run changed the cluster: the release and target are the run's (PreflightError, exit 3,
    naming what is not). Adopts a helm upgrade that finished before the run was stopped."""
    fix = ("run `gpu-install upgrade plan -o FILE` again and apply the new plan (the state file "
           f"{path} is then replaced), or put back what changed")
    problems = []
    if plan.release.version != rec.targetVersion:
        problems.append(f"the site's target is {plan.release.version}, the run's {rec.targetVersion}")
    elif st.values_hash(plan.values) != rec.targetValuesHash:
        problems.append("the site's rendered values differ from the run's (the site file changed)")
    rel = cluster.release
    if rel is None:
        problems.append(f"the Helm release {rec.releaseName} is gone")
    elif rec.applied is not None:
        if rel.revision != rec.applied.revision:
            problems.append(f"the Helm release is at revision {rel.revision}, not the run's {rec.applied.revision}")
    elif rec.previous is not None and rel.revision != rec.previous.revision:
        if (rel.revision > rec.previous.revision and rel.chart_version == rec.targetVersion
                and cluster.release_status == "deployed" and st.values_hash(rel.values) == rec.targetValuesHash):
            rec.applied = st.Revision(rel.revision, rel.chart_version)  # the run's helm upgrade finished
        elif (rel.revision > rec.previous.revision and rel.chart_version == rec.targetVersion
              and cluster.release_status != "deployed" and rec.phase == "upgrading"):
            pass  # the run's own helm upgrade failed (or was stopped) on the way: it runs again
        else:
            problems.append(f"the Helm release is at revision {rel.revision} ({rel.chart_version}), neither the "
                            f"run's starting revision {rec.previous.revision} nor its upgrade")
    missing = [n for b in rec.pending() for n in b.nodes
               if not any(s.name == n and s.present for s in cluster.nodes)]
    if missing:
        problems.append(f"node(s) of the remaining batches not in the cluster: {', '.join(missing)}")
    if problems:
        raise PreflightError("plan is stale for --resume: " + "; ".join(problems), hint=fix)


# ---------------------------------------------------------------- the run


def _operator_rollout() -> Any:
    """installer.upgrade.operator_rollout (hold_all, release_batch, lift_all, BatchFailed), imported when needed."""
    import importlib

    try:
        return importlib.import_module("installer.upgrade.operator_rollout")
    except ImportError as exc:
        from installer.errors import EnvironmentProblem

        raise EnvironmentProblem(f"driver.mode operator/precompiled rollouts need installer.upgrade.operator_rollout, "
                                 f"which this installation lacks ({exc})",
                                 hint="install a complete gpu-install") from None


def _gpu_nodes(cluster: ClusterState) -> list[str]:
    return [n.name for n in cluster.nodes if n.present]


def run(plan: Plan, opts: Options, *, site: str, inventory: str | None, say: Progress,
        display: Display | None = None, on_state: Callable[[st.State, Path], None] | None = None) -> Outcome:
    """The whole apply (see the module doc); raises the failing step's error after recording it in the state file."""
    from installer import kube
    from installer.upgrade import cluster as cluster_read
    from installer.upgrade import plan as upgrade_plan
    from installer.upgrade.nodes import max_unavailable_arg

    doc = load_plan_doc(opts.plan_file)
    refuse_blocked(opts.plan_file, doc)
    op = plan.site.operator
    path = Path(opts.state_file).expanduser() if opts.state_file else st.default_path(op.namespace, op.releaseName)
    rec = st.load(path)
    if opts.resume:
        if rec is None:
            raise ConfigError(f"--resume: no upgrade recorded in {path}",
                              hint="run without --resume to start applying the plan (or give --state FILE where "
                                   "the run was recorded)")
        if rec.planHash != doc["planHash"]:
            raise PreflightError(f"--resume: the state file {path} records plan {rec.planHash}, not --plan "
                                 f"{opts.plan_file} ({doc['planHash']})",
                                 hint="give the plan file that run applied, or finish it (upgrade rollback) before "
                                      "applying a new plan")
        check_batches(rec, path, opts.plan_file, doc)
        if rec.phase == "done":
            say(f"upgrade of plan {rec.planHash} already done ({path}); nothing to resume")
            return Outcome(rec.planHash, path, rec, resumed=True, message="already done")
    elif rec is not None and rec.touched and rec.phase != "done":
        done = sum(b.status == "done" for b in rec.batches)
        raise PreflightError(f"an unfinished upgrade is recorded in {path} (plan {rec.planHash}, phase {rec.phase}, "
                             f"{done} of {len(rec.batches)} batch(es) done)",
                             hint="continue it with --resume (and its plan file), or undo it with `gpu-install "
                                  "upgrade rollback`; remove the file only if that run is really abandoned")

    kubeconfig = kube.resolve_kubeconfig(opts.kubeconfig)
    say("reading the cluster again")
    cluster, client = cluster_read.read(plan, kubeconfig)
    resumed = bool(opts.resume and rec is not None and rec.touched)
    if resumed:
        assert rec is not None
        check_resume(rec, plan, cluster, path)
        say(f"resuming plan {rec.planHash}: {len(rec.done_nodes())} node(s) done, "
            f"{len(rec.pending())} batch(es) left")
    else:
        up = upgrade_plan.build(plan, cluster, client, site=site, inventory=inventory, chart=opts.chart,
                                max_parallel=int(doc["maxParallel"]),
                                max_unavailable=max_unavailable_arg(str(doc["maxUnavailable"])))
        if up.plan_hash != doc["planHash"]:
            raise stale(opts.plan_file, doc, up)
        if up.blockers:  # the same hash covers the same blockers; kept for a plan file edited by hand
            raise PreflightError(f"{len(up.blockers)} blocker(s): " + "; ".join(f"{b.where}: {b.what}"
                                                                                for b in up.blockers),
                                 hint="fix them and plan again")
        if up.nothing_to_do:
            say(f"nothing to do: the release is at {up.report.target_version} with these values and no node "
                "changes")
            return Outcome(up.plan_hash, None, None, nothing_to_do=True, message="nothing to do")
        say(f"plan {up.plan_hash} is current ({len(up.batches)} batch(es))")
        rec = new_state(plan, up, cluster, doc, site, inventory)
    assert rec is not None
    out = Outcome(rec.planHash, path, rec, resumed=resumed)

    def save() -> None:
        assert rec is not None
        rec.save(path)
        if on_state is not None:
            on_state(rec, path)

    operator_mode = rec.driverMode not in HOST_MODES
    if opts.mirror_check and rec.applied is None:
        from installer.mirror.verify import for_apply

        say(f"mirror check: {for_apply(plan)} image(s) in {plan.site.registry.host}")
        if not operator_mode and rec.pending() and plan.role_vars.get("package_repo_enabled"):
            from installer.mirror.verify import packages_for_apply

            say(f"mirror check: {packages_for_apply(plan)} package root(s) in {plan.site.packages.url}")
    save()
    say(f"state: {path}")
    try:
        if operator_mode and rec.pending() and rec.phase == "checked":
            nodes = _gpu_nodes(cluster)
            say(f"holding the operator's driver upgrades on {len(nodes)} GPU node(s) (skip label)")
            _operator_rollout().hold_all(client, nodes)
            rec.phase = "held"
            save()
        if rec.applied is None:
            rec.phase = "upgrading"
            save()
            _helm(plan, opts, rec, kubeconfig, say)
            rec.phase = "released"
            save()
        else:
            say(f"release {rec.releaseName}: revision {rec.applied.revision} ({rec.applied.chart}) from this run")
        _batches(plan, opts, rec, out, client, str(kubeconfig), say, display, save)
        if operator_mode:
            _operator_rollout().lift_all(client, _gpu_nodes(cluster))
        rec.phase = "done"
        rec.inProgress = None
        rec.failure = None
        save()
    except GpuInstallError as exc:
        if rec.phase != "done":
            failed = next((b for b in rec.batches if b.status == "in-progress"), None)
            if failed is not None:
                failed.status = "failed"
                _step_passed(rec, failed, "failed")
            rec.failure = st.Failure(failed.index if failed else None, list(failed.nodes) if failed else [],
                                     exc.exit_code, exc.message)
            rec.phase = "failed" if rec.applied is not None or failed is not None else rec.phase
            save()
        raise
    out.message = f"{len(rec.batches)} batch(es) done"
    return out


def _helm(plan: Plan, opts: Options, rec: st.State, kubeconfig: Path, say: Progress) -> None:
    from installer import operator

    prepared = operator.prepare(plan, kubeconfig, opts.chart or plan.site.operator.chart)
    say(f"release {rec.releaseName}: CRDs server-side, then helm upgrade to {rec.targetVersion}")
    report = operator.install(plan, prepared, timeout=opts.operator_timeout, wait=opts.wait,
                              progress=lambda m: say(f"operator: {m}"))
    chart = report.release.chart
    version = chart[len("gpu-operator-"):] if chart.startswith("gpu-operator-") else chart.rpartition("-")[2]
    rec.applied = st.Revision(report.release.revision, version)
    say(f"release {rec.releaseName}: revision {report.release.revision} {report.release.status}")


def _batches(plan: Plan, opts: Options, rec: st.State, out: Outcome, client: Any, kubeconfig: str, say: Progress,
             display: Display | None, save: Callable[[], None]) -> None:
    total = len(rec.batches)
    for b in rec.pending():
        t0 = time.monotonic()
        label = f"batch {b.index}/{total}{' (canary)' if b.canary else ''}: {', '.join(b.nodes)}"
        say(label + (" (again: it did not finish)" if b.status in ("in-progress", "failed") else ""))
        b.status = "in-progress"
        b.steps = []  # this attempt's steps: the batch starts over
        rec.failure = None
        rec.inProgress = st.InProgress(b.index, None, "start")
        rec.phase = "released"
        save()

        def step(node: str | None, what: str, b: st.BatchRecord = b) -> None:
            _step_passed(rec, b)  # a step starts only once the one before it returned
            rec.inProgress = st.InProgress(b.index, node, what)
            save()

        if rec.driverMode in HOST_MODES:
            _host_batch(plan, opts, rec, b, client, kubeconfig, say, display, step, save)
        else:
            _operator_batch(opts, b, client, say, step)
        _step_passed(rec, b)
        b.status = "done"
        rec.inProgress = None
        save()
        out.seconds[b.index] = round(time.monotonic() - t0, 1)
        say(f"batch {b.index}/{total} done in {out.seconds[b.index]:.1f}s")


def _step_passed(rec: st.State, b: st.BatchRecord, outcome: Literal["ok", "failed"] = "ok") -> None:
    """The batch's step in progress recorded with its outcome (the record --resume holds a done batch to)."""
    cur = rec.inProgress
    if cur is not None and cur.batch == b.index and cur.step != "start":
        b.steps.append(st.StepRecord(cur.step, cur.node, outcome))


def _host_batch(plan: Plan, opts: Options, rec: st.State, b: st.BatchRecord, client: Any, kubeconfig: str,
                say: Progress, display: Display | None, step: Callable[[str | None, str], None],
                save: Callable[[], None]) -> None:
    from installer.upgrade.host_rollout import HostBatch

    reboot = plan.site.driver.rebootPolicy in ("always", "if-needed")
    batch = HostBatch(plan, client, kubeconfig, drain_timeout=opts.drain_timeout, node_timeout=opts.node_timeout,
                      validate_timeout=opts.validate_timeout, say=say, display=display, step=step,
                      layers=opts.validate_layers)
    boot_ids: dict[str, str | None] = {n: rec.nodes[n].bootIdBefore for n in b.nodes
                                       if n in rec.nodes and rec.nodes[n].bootIdBefore is not None}

    class Recorded(dict[str, "str | None"]):
        def __setitem__(self, node: str, value: str | None) -> None:
            super().__setitem__(node, value)
            if node in rec.nodes:
                rec.nodes[node].bootIdBefore = value
                save()

    batch.run(b.nodes, reboot=reboot,
              cordoned_before=lambda n: bool(rec.nodes[n].cordonedBefore) if n in rec.nodes else False,
              boot_ids=Recorded(boot_ids))


def _operator_batch(opts: Options, b: st.BatchRecord, client: Any, say: Progress,
                    step: Callable[[str | None, str], None]) -> None:
    from installer.errors import HostFailures

    ro = _operator_rollout()
    step(None, "release")
    try:
        ro.release_batch(client, list(b.nodes), timeout=opts.batch_timeout,
                         progress=lambda node, what: say(f"{node}: {what}"))
    except ro.BatchFailed as exc:
        if isinstance(exc, GpuInstallError):  # the node's events and driver pod log are in it: as it is (exit 4)
            raise
        node = getattr(exc, "node", exc.args[0] if exc.args else "?")
        detail = getattr(exc, "detail", exc.args[1] if len(exc.args) > 1 else str(exc))
        raise HostFailures(f"batch {b.index}: the operator's driver upgrade failed on {node}: {detail}; the "
                           "batch's nodes are left as the upgrade controller has them, the later batches keep "
                           "their skip label",
                           hint=f"read the node's events and its driver pod's log (kubectl describe node {node}), "
                                "fix the cause, then run the same `upgrade apply --resume`") from None
