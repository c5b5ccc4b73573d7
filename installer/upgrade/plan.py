"""`gpu-install upgrade plan`: the whole read-only plan -- the release side (installer.upgrade.release), the node
side (installer.upgrade.nodes) and the batches -- from the cluster as it is (installer.upgrade.cluster) to the
target release, with a plan hash, the apply command, the exit code and the text and JSON forms
(gpu-install.upgrade-plan/v1, docs/json.md).

The plan hash is sha256 over the canonical JSON (sorted keys, no spaces) of what `upgrade apply` re-reads and
compares before it changes anything (hash_inputs): the release's name, namespace, revision, status, chart and
deployed values; the resourceVersion of each operator CRD; the Kubernetes version; the target release and its
rendered values; the target chart: the sha256 of its archive, the digests of its rendered objects and of its CRDs,
and the CRD changes it brings; per GPU node: present, Ready, cordoned, the upgrade-state and skip labels, the pods
it would evict and its blockers; --max-parallel and --max-unavailable. Anything else (pods on other nodes, events)
is not covered. So a chart that differs from the one planned with (a template or a CRD more or changed, any byte of
the archive) makes apply's plan stale.

The target chart is read once (installer.operator.load_chart: a private copy, held against operator.chartSha256 or
its bundle's signed lock); the plan renders that copy, and within `upgrade apply` the helm upgrade installs the same
copy.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from installer.errors import EXIT_OK, EXIT_PREFLIGHT
from installer.upgrade import nodes as node_side
from installer.upgrade.cluster import SKIP_LABEL, ClusterState
from installer.upgrade.model import Batch, Blocker, NodePlan, ReleaseReport

if TYPE_CHECKING:
    from installer.operator import Chart
    from installer.plan import Plan

CLUSTER = node_side.CLUSTER
ROLLBACK_CAN = ("the Helm release: back to the revision deployed now, with its chart and values",)
ROLLBACK_CANNOT = ("CRDs: never downgraded (the target's CRDs stay; fields only the target knows are kept in the "
                   "schema)",
                   "custom resources the operator or the target chart changed stay as they are",
                   "host drivers (driver.mode host/runfile) are not helm's: they come back through the driver "
                   "role with the previous driver.version (an operator-mode driver container rolls back with the "
                   "release, reloading the driver again)")


@dataclass(frozen=True)
class UpgradePlan:
    site: str
    inventory: str | None
    kube_version: str
    release_status: str | None
    report: ReleaseReport
    nodes: tuple[NodePlan, ...]
    batches: tuple[Batch, ...]
    blockers: tuple[Blocker, ...]  # every blocker: the release's, the nodes', the batches'
    truncated: tuple[str, ...]
    max_parallel: int
    max_unavailable: str | int
    plan_hash: str
    seconds: float
    chart: str | None = None  # the target chart as planned: its name, sha256 and pin (Chart.describe)

    @property
    def changes(self) -> list[Any]:
        return [c for c in self.report.changes if c.current != c.target]

    @property
    def nothing_to_do(self) -> bool:
        """The release is at the target with the target's values, and no node changes."""
        return (self.report.current is not None and not self.changes and not self.report.values_diff
                and all(c.startswith("= ") for c in self.report.crd_changes)  # "= CRD x: schema unchanged"
                and all(n.action == "none" for n in self.nodes))

    @property
    def exit_code(self) -> int:
        return EXIT_PREFLIGHT if self.blockers else EXIT_OK


def chart_inputs(chart: Chart | None, report: ReleaseReport) -> dict[str, Any] | None:
    """The target chart's part of the plan hash: the archive's sha256 (None for a directory or an oci:// reference),
    the digests of its rendered objects and CRDs, and the CRD changes it brings; None without a chart."""
    if chart is None:
        return None
    return {"sha256": chart.sha256, "objects": report.target_digests.get("objects"),
            "crds": report.target_digests.get("crds"), "crdChanges": list(report.crd_changes)}


def hash_inputs(state: ClusterState, plan: Plan, nodes: list[NodePlan], max_parallel: int,
                max_unavailable: str | int, chart: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the plan hash covers (see the module's docstring); chart: chart_inputs()."""
    rel = state.release
    labels = {s.name: s.labels for s in state.nodes}
    return {
        "kubernetes": state.kube_version,
        "release": None if rel is None else {
            "name": rel.name, "namespace": rel.namespace, "revision": rel.revision, "status": state.release_status,
            "chart": rel.chart_version, "values": rel.values,
            "crds": {n: ((c.get("metadata") or {}).get("resourceVersion") if isinstance(c, dict) else None)
                     for n, c in sorted(rel.crds.items())}},
        "target": {"release": plan.release.version, "values": plan.values, "chart": chart},
        "nodes": [{"name": n.name, "present": n.present, "ready": n.ready, "cordoned": n.cordoned,
                   "upgradeState": n.upgrade_state, "skip": labels.get(n.name, {}).get(SKIP_LABEL),
                   "action": n.action, "evicts": sorted(n.evicts), "blockers": sorted(b.what for b in n.blockers)}
                  for n in nodes],
        "maxParallel": max_parallel,
        "maxUnavailable": max_unavailable,
    }


def plan_hash(inputs: dict[str, Any]) -> str:
    raw = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(raw.encode()).hexdigest()


def release_blockers(state: ClusterState, plan: Plan) -> list[Blocker]:
    op = plan.site.operator
    if state.release is None:
        return [Blocker(CLUSTER, f"no Helm release {op.releaseName} in namespace {op.namespace}: nothing to upgrade",
                        "install it first (gpu-install apply, or gpu-install operator install), or fix "
                        "operator.releaseName/operator.namespace in the site file")]
    if state.release_status not in (None, "deployed"):
        return [Blocker(CLUSTER, f"Helm release {op.releaseName} revision {state.release.revision} is "
                                 f"{state.release_status}, not deployed",
                        f"finish or undo the last change first (helm history {op.releaseName} -n {op.namespace}; "
                        "gpu-install operator install re-runs it), then plan again")]
    return []


def build(plan: Plan, state: ClusterState, client: Any, *, site: str, inventory: str | None,
          chart: str | None = None, max_parallel: int = 1,
          max_unavailable: str | int = node_side.DEFAULT_MAX_UNAVAILABLE, started: float | None = None) -> UpgradePlan:
    """The plan from the resolved target (plan) and the cluster as read (state). chart: the target chart (default:
    what apply installs, installer.upgrade.release.chart_ref; "" for none), read once and checked against its pin
    (installer.operator.load_chart, ConfigError exit 2) before it is rendered."""
    from installer.operator import load_chart
    from installer.upgrade.release import chart_ref, release_report

    t0 = time.monotonic() if started is None else started
    ref = chart_ref(plan) if chart is None else chart or None
    loaded = load_chart(plan, ref) if ref else None
    report = release_report(plan, state.release, state.kube_version, client, chart=loaded.ref if loaded else "")
    action = node_side.node_action(report, plan.site)
    host_driver = plan.role_vars.get("nvidia_driver_package_version")
    nodes = node_side.plan_nodes(state.nodes, action, state.pdbs, plan.site.operator.namespace, plan.site,
                                 str(host_driver) if host_driver else None)
    bts, batch_blockers = node_side.batches(nodes, max_parallel, max_unavailable)
    blockers = (*release_blockers(state, plan), *report.blockers, *(b for n in nodes for b in n.blockers),
                *batch_blockers)
    digest = plan_hash(hash_inputs(state, plan, nodes, max_parallel, max_unavailable, chart_inputs(loaded, report)))
    return UpgradePlan(site, inventory, state.kube_version, state.release_status, report, tuple(nodes), bts,
                       tuple(blockers), state.truncated, max_parallel, max_unavailable, digest,
                       round(time.monotonic() - t0, 3), loaded.describe() if loaded else None)


def apply_command(up: UpgradePlan, plan_file: str | None) -> str:
    """The command that applies this plan (upgrade apply: re-reads the cluster and refuses a stale plan)."""
    argv = ["gpu-install", "upgrade", "apply", "-s", up.site, *(["-i", up.inventory] if up.inventory else []),
            "--plan", plan_file or "PLAN.json", "--yes"]
    return shlex.join(argv)


# ---------------------------------------------------------------- text


def _cell(value: str | None) -> str:
    return "-" if value is None else value


def to_text(up: UpgradePlan, plan_file: str | None = None) -> str:
    from installer.ui import table

    rep = up.report
    cur = rep.current
    lines: list[str] = []
    head = (f"GPU Operator release {cur.name} (namespace {cur.namespace}): revision {cur.revision}, chart "
            f"{cur.chart_version}, {up.release_status or 'status unknown'}" if cur else "GPU Operator: no release")
    lines += [head, f"Kubernetes {up.kube_version}; target {rep.target_version}"
              + (f", chart {up.chart}" if up.chart else ""), ""]
    lines += [table("", ["COMPONENT", "CURRENT", "TARGET"],
                    [(c.component, _cell(c.current), _cell(c.target) + ("" if c.current != c.target else " (same)"))
                     for c in rep.changes]), ""]
    lines += ["Values (deployed -> target):", *([f"  {d}" for d in rep.values_diff] or ["  no change"]), ""]
    lines += ["CRDs:", *([f"  {c}" for c in rep.crd_changes] or ["  no change"]), ""]
    if rep.findings or up.truncated:
        lines += ["Findings:", *[f"  - {f}" for f in rep.findings],
                  *[f"  - read only part of the cluster: {t}" for t in up.truncated], ""]
    lines += [table(f"Nodes ({len(up.nodes)} GPU node(s)):", ["NODE", "ACTION", "EVICTS", "BLOCKERS"],
                    [(n.name + (" (cordoned)" if n.cordoned else "") + ("" if n.ready or not n.present
                                                                         else " (NotReady)"),
                      n.action, ", ".join(n.evicts) or "-", str(len(n.blockers)) if n.blockers else "-")
                     for n in up.nodes]) if up.nodes else "Nodes: none in the inventory's GPU group", ""]
    limits = f"--max-parallel {up.max_parallel}, --max-unavailable {up.max_unavailable}"
    if up.batches:
        lines += [f"Batches ({limits}):", *[f"  {b.index}{' (canary)' if b.canary else ''}: {', '.join(b.nodes)}"
                                            for b in up.batches], ""]
    else:
        lines += [f"Batches ({limits}): none (no node reloads its driver"
                  f"{' or every such node is blocked' if any(n.blockers for n in up.nodes) else ''})", ""]
    if up.blockers:
        lines += [f"Blockers ({len(up.blockers)}):"]
        for b in up.blockers:
            lines += [f"  - {b.where}: {b.what}", f"    fix: {b.fix}"]
        lines += [""]
    lines += ["Rollback (helm revision " + (str(cur.revision) if cur else "-") + "):",
              *[f"  can undo: {c}" for c in ROLLBACK_CAN], *[f"  cannot undo: {c}" for c in ROLLBACK_CANNOT], ""]
    lines += [f"Plan hash: {up.plan_hash}", f"Planned in {up.seconds:.2f} s", ""]
    if up.nothing_to_do:
        lines += [f"Nothing to do: the release is at {rep.target_version} with these values and no node changes."]
    elif up.blockers:
        lines += [f"{len(up.blockers)} blocker(s): fix them and plan again (exit {EXIT_PREFLIGHT})."]
    else:
        lines += ["Next (with the plan written by -o; apply re-reads the cluster and refuses the plan once it is "
                  "stale):", f"  {apply_command(up, plan_file)}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- JSON (gpu-install.upgrade-plan/v1)


def _blocker(b: Blocker) -> dict[str, str]:
    return {"where": b.where, "what": b.what, "fix": b.fix}


def to_doc_fields(up: UpgradePlan, plan_file: str | None = None) -> dict[str, Any]:
    """The schema's own fields (the envelope is jsonout's)."""
    rep = up.report
    cur = rep.current
    return {
        "kubernetesVersion": up.kube_version,
        "release": None if cur is None else {"name": cur.name, "namespace": cur.namespace, "revision": cur.revision,
                                             "chart": cur.chart_version, "status": up.release_status},
        "targetVersion": rep.target_version,
        "components": [{"component": c.component, "current": c.current, "target": c.target} for c in rep.changes],
        "valuesDiff": list(rep.values_diff),
        "crdChanges": list(rep.crd_changes),
        "findings": [*rep.findings, *(f"read only part of the cluster: {t}" for t in up.truncated)],
        "nodes": [{"name": n.name, "action": n.action, "evicts": list(n.evicts),
                   "blockers": [_blocker(b) for b in n.blockers], "cordoned": n.cordoned, "ready": n.ready,
                   "present": n.present, "upgradeState": n.upgrade_state} for n in up.nodes],
        "batches": [{"index": b.index, "nodes": list(b.nodes), "canary": b.canary} for b in up.batches],
        "maxParallel": up.max_parallel,
        "maxUnavailable": str(up.max_unavailable),
        "blockers": [_blocker(b) for b in up.blockers],
        "rollback": {"can": list(ROLLBACK_CAN), "cannot": list(ROLLBACK_CANNOT)},
        "nothingToDo": up.nothing_to_do,
        "planHash": up.plan_hash,
        "applyCommand": apply_command(up, plan_file),
    }

