"""`gpu-install upgrade rollback -s site.yaml -i inventory [--to-revision N] --yes`: back to the Helm revision before
the upgrade, with its chart and values, and host drivers back to the version each node had.

1. The release (site operator.releaseName in operator.namespace) and its history are read (`helm history`). The
   revision to go back to: --to-revision N; else the revision the recorded `upgrade apply` run started from
   (installer.upgrade.state, `release.previous`) when the release is still at the revision that run made (or at its
   starting revision's successor, a run stopped after helm); else the revision before the current one (what `helm
   rollback` takes). A revision helm no longer has, the current one, or no release at all is refused (exit 2/3).
2. Without --yes, nothing changes: what it would do is printed (revisions, the values diff current -> target
   revision, the CRD caveat, the nodes whose host driver goes back, what the sweep of step 3 would delete or leave
   -- against the target revision's manifest), exit 0.
3. `helm rollback RELEASE N` (installer.helm.rollback, with --wait unless --no-wait). CRDs are never downgraded: helm
   does not touch them on a rollback, and gpu-install does not either -- the target's CRDs stay (plan.ROLLBACK_CANNOT).
4. driver.mode host: the nodes the recorded run changed (batches done, and the one that failed or was running) go back
   to their recorded previousDriverVersion through the same batches as apply (installer.upgrade.host_rollout:
   cordon, drain honouring PDBs, the driver role with driver.version set to that version, reboot per
   driver.rebootPolicy, validate, uncordon; pre-cordoned nodes stay cordoned). A node already at that version (GPU
   Feature Discovery's labels) is left alone; a node with no recorded version is named and left alone.
   driver.mode runfile: the recorded version cannot name a runfile -- the site's driver.runfile must be the previous
   one (put back in the site file); the batches then run as for host. driver.mode operator|precompiled: the driver
   container rolls back with the release (the operator's upgrade controller reloads it); skip labels the run left
   (operator_rollout's annotation) are lifted so that it can.
   Then the sweep: what the revisions after the target (those rolled back from: the upgrade's, a failed one, a
   refused helm rollback's) rendered and the new revision's manifest lacks, found in the cluster and annotated as
   this release's (meta.helm.sh/release-name and -namespace), is deleted -- helm diffs against its last revision
   only, so after a refused rollback (a failed revision holding the target's manifest) the newer chart's own
   resources would stay, annotated with the release, and outlive its uninstall. Anything another release or nobody
   owns, kept by helm.sh/resource-policy, or a CRD or Namespace is left and named (Outcome.orphans).
5. The state file is kept beside itself as `<name>.rolled-back-<UTC time>.json` (so `upgrade apply` no longer sees an
   unfinished run) once everything above is done.

Errors: ConfigError (2) a bad --to-revision, no --yes needed for preview; PreflightError (3) no release, or nothing
to roll back to; ClusterError (7) helm or the API server; the host batches' own (4, 5, 6; nodes left cordoned, named).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError, PreflightError
from installer.upgrade import state as st
from installer.upgrade.orphans import Orphan, leftovers, sweep

if TYPE_CHECKING:
    from installer.helm import HistoryEntry
    from installer.plan import Plan
    from installer.progress import Display

Progress = Callable[[str], None]
HOST_MODES = ("host", "runfile")


@dataclass(frozen=True)
class Options:
    to_revision: int | None = None
    yes: bool = False
    kubeconfig: str | None = None
    state_file: str | None = None
    timeout: float = 300.0
    wait: bool = True
    drain_timeout: float = 300.0
    node_timeout: float = 900.0
    validate_timeout: float = 300.0
    validate_layers: tuple[str, ...] = ("node", "runtime", "smoke")
    chart: str | None = None  # the target revision's chart: helm upgrade when helm rollback cannot (see _helm_back)


#: helm rollback's refusal of a resource the target revision renders that exists in the cluster but is not in the
#: current revision's manifest (helm upgrade adopts such a resource by its meta.helm.sh annotations; rollback does not):
#: v22.9's NFD subchart rendered its NodeFeatureRule CRD from a template, later ones carry it in crds/
NOT_IN_CURRENT = re.compile(r'no (\w+) with the name "([^"]+)" found')


@dataclass
class NodeBack:
    """One node whose host driver goes back: from what it runs now to the version recorded before the upgrade."""

    name: str
    batch: int
    now: str | None
    to: str | None
    action: str  # "driver-back", "none (already at VERSION)", "left alone (no recorded version)"


@dataclass
class Preview:
    release: str
    namespace: str
    current: HistoryEntry
    target: HistoryEntry
    why: str  # how the target revision was chosen
    values_diff: list[str]
    driver_mode: str
    state_path: Path
    state: st.State | None
    nodes: list[NodeBack] = field(default_factory=list)
    crd_caveat: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)  # without --yes: what the sweep would do (dry run)

    @property
    def helm_done(self) -> bool:
        return self.target.revision == self.current.revision

    @property
    def batches(self) -> list[tuple[int, list[NodeBack]]]:
        """The recorded batches' nodes whose driver goes back, batch by batch (empty batches left out)."""
        out: dict[int, list[NodeBack]] = {}
        for n in self.nodes:
            if n.action == "driver-back":
                out.setdefault(n.batch, []).append(n)
        return sorted(out.items())

    def lines(self) -> list[str]:
        if self.helm_done:
            out = [f"release {self.release} (namespace {self.namespace}): revision {self.current.revision} "
                   f"({self.current.chart}) is already helm's rollback [{self.why}]"]
        else:
            out = [f"release {self.release} (namespace {self.namespace}): revision {self.current.revision} "
                   f"({self.current.chart}, {self.current.status}) -> helm rollback to revision {self.target.revision} "
                   f"({self.target.chart}) [{self.why}]",
                   f"values (revision {self.current.revision} -> {self.target.revision}):",
                   *([f"  {d}" for d in self.values_diff] or ["  no change"])]
        out += [f"cannot undo: {c}" for c in self.crd_caveat]
        if self.driver_mode in HOST_MODES:
            if self.state is None:
                out.append(f"host drivers: no upgrade run recorded in {self.state_path}: no node's driver goes back")
            for index, nodes in self.batches:
                out.append(f"batch {index}: " + ", ".join(f"{n.name} {n.now or '?'} -> {n.to}" for n in nodes))
            out += [f"{n.name}: {n.action}" for n in self.nodes if n.action != "driver-back"]
        if self.orphans:
            out.append(f"in the cluster, rendered by a revision after {self.target.revision} and not by revision "
                       f"{self.target.revision} (deleted by helm, or after it where helm leaves them):")
            out += [f"  {o.line()}" for o in self.orphans]
        out += self.notes
        return out


def _flat_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """`~ path: a -> b` per values path that differs (credentials shown as ***, as upgrade plan shows them)."""
    from installer.catalog import split_path
    from installer.upgrade.release import REDACTED, _flatten, _show, redact_value, secret_key

    a, b = _flatten(before, frozenset()), _flatten(after, frozenset())
    out = []
    for path in sorted(set(a) | set(b)):
        x, y = a.get(path), b.get(path)
        if x == y:
            continue
        secret = any(secret_key(p) for p in split_path(path))
        sx = REDACTED if secret and x is not None else _show(redact_value(x))
        sy = REDACTED if secret and y is not None else _show(redact_value(y))
        out.append(f"{'+' if x is None else '-' if y is None else '~'} {path}: {sx} -> {sy}")
    return out


def choose_target(history: list[HistoryEntry], current: int, to_revision: int | None,
                  rec: st.State | None) -> tuple[HistoryEntry, str]:
    """The revision to roll back to and why (pure): --to-revision, the recorded run's starting revision, or the one
    before the current. The current revision itself when it is helm's rollback to the recorded run's starting
    revision (a rollback whose host batches stopped: run again, it does the nodes only). ConfigError for a revision helm does not have or the current one; PreflightError when there
    is nothing before the current revision."""
    by_rev = {h.revision: h for h in history}
    if to_revision is not None:
        if to_revision == current:
            raise ConfigError(f"--to-revision {to_revision} is the current revision",
                              hint="give an earlier revision (helm history), or leave --to-revision out")
        if to_revision not in by_rev:
            have = ", ".join(str(r) for r in sorted(by_rev)) or "none"
            raise ConfigError(f"--to-revision {to_revision}: the release has no such revision (helm keeps: {have})",
                              hint="pick one of those (helm history shows their charts)")
        return by_rev[to_revision], "--to-revision"
    if rec is not None and rec.previous is not None and by_rev.get(current) is not None and \
            by_rev[current].description == f"Rollback to {rec.previous.revision}":
        return by_rev[current], "helm rollback done already (an earlier rollback run): the nodes remain"
    if rec is not None and rec.previous is not None and rec.previous.revision in by_rev \
            and rec.previous.revision != current:
        made = rec.applied.revision if rec.applied is not None else None
        if made == current or (made is None and current == rec.previous.revision + 1):
            return by_rev[rec.previous.revision], "the revision before the recorded upgrade run"
    earlier = [r for r in by_rev if r < current]
    if not earlier:
        raise PreflightError(f"revision {current} is the release's first kept revision: nothing to roll back to",
                             hint="helm history shows what is kept; an earlier release is installed with "
                                  "`gpu-install apply` of the previous operator.version")
    return by_rev[max(earlier)], "the previous revision"


def node_plan(rec: st.State | None, labels: Mapping[str, Mapping[str, str] | None]) -> list[NodeBack]:
    """Per node the recorded run touched (batches done, failed or in progress): back to its recorded driver version,
    or why not (pure)."""
    from installer.upgrade.nodes import node_driver_version

    if rec is None:
        return []
    out = []
    for b in rec.batches:
        if b.status == "pending":
            continue
        for n in b.nodes:
            to = rec.nodes[n].previousDriverVersion if n in rec.nodes else None
            now = node_driver_version(labels.get(n) or {})
            if to is None:
                action = "left alone (no driver version recorded for it before the upgrade)"
            elif now == to:
                action = f"none (already at {to})"
            else:
                action = "driver-back"
            out.append(NodeBack(n, b.index, now, to, action))
    return out


def preview(plan: Plan, opts: Options, say: Progress) -> Preview:
    """Read-only: everything the rollback would do."""
    from installer import helm, kube
    from installer.upgrade.plan import ROLLBACK_CANNOT

    op = plan.site.operator
    kubeconfig = kube.resolve_kubeconfig(opts.kubeconfig)
    path = Path(opts.state_file).expanduser() if opts.state_file else st.default_path(op.namespace, op.releaseName)
    rec = st.load(path)
    if rec is not None and (rec.releaseName, rec.releaseNamespace) != (op.releaseName, op.namespace):
        raise ConfigError(f"upgrade state file {path} records release {rec.releaseNamespace}/{rec.releaseName}, "
                          f"not the site's {op.namespace}/{op.releaseName}",
                          hint="give the state file of this release with --state")
    history = helm.release_history(op.releaseName, op.namespace, kubeconfig)
    if not history:
        raise PreflightError(f"no Helm release {op.releaseName} in namespace {op.namespace}: nothing to roll back",
                             hint="check operator.releaseName/operator.namespace and the kubeconfig")
    current = history[-1]
    target, why = choose_target(history, current.revision, opts.to_revision, rec)
    cur_values = helm.revision_values(op.releaseName, op.namespace, current.revision, kubeconfig)
    tgt_values = helm.revision_values(op.releaseName, op.namespace, target.revision, kubeconfig)
    from installer.jsonout import redact, secret_values

    diff = [str(redact(d, secret_values(plan))) for d in _flat_diff(cur_values, tgt_values)]
    mode = plan.site.driver.mode
    pv = Preview(op.releaseName, op.namespace, current, target, why, diff, mode, path, rec,
                 crd_caveat=tuple(c for c in ROLLBACK_CANNOT if c.startswith("CRDs")))
    if mode in HOST_MODES and rec is not None:
        names = [n for b in rec.batches for n in b.nodes]
        pv.nodes = node_plan(rec, kube.node_labels(kube.api_client(kubeconfig), names))
        if mode == "runfile" and pv.batches:
            pv.notes.append(f"driver.mode runfile: the batches install the site's driver.runfile "
                            f"({plan.site.driver.runfile or 'not set'}): it must be the previous driver's runfile")
    elif mode not in HOST_MODES:
        pv.notes.append("driver.mode operator: the driver container goes back with the release (the operator's "
                        "upgrade controller reloads it node by node); skip labels of the upgrade run are lifted")
    if not opts.yes and not pv.helm_done:
        newer = [h.revision for h in history if h.revision > target.revision]
        docs = [helm.revision_manifest(op.releaseName, op.namespace, r, kubeconfig) for r in newer]
        tgt = helm.revision_manifest(op.releaseName, op.namespace, target.revision, kubeconfig)
        pv.orphans = sweep(kube.api_client(kubeconfig), op.releaseName, op.namespace, leftovers(docs, tgt),
                           lambda _: None, dry_run=True)
    say(f"rollback of {op.releaseName}: revision {current.revision} -> {target.revision}")
    return pv


def _site_with_driver(plan: Plan, version: str) -> Plan:
    """The plan with driver.version set (host mode: the version the node had before the upgrade)."""
    from installer.plan import resolve

    site = plan.site.model_copy(update={"driver": plan.site.driver.model_copy(update={"version": version})})
    return resolve(site, plan.options)


def _sweep_after(pv: Preview, new_revision: int, kubeconfig: Path, client: Any, say: Progress) -> list[Orphan]:
    """The sweep after helm made new_revision: the revisions rolled back from are those after the target revision
    (the upgrade's, a failed one, a refused helm rollback's), read from helm; the release's own manifest is that of
    the new revision. Needed because helm diffs against its last revision only -- after a refused rollback (a failed
    revision with the target's manifest) the resources only the newer chart had are never deleted."""
    from installer import helm

    history = helm.release_history(pv.release, pv.namespace, kubeconfig) or []
    newer = [h.revision for h in history if pv.target.revision < h.revision < new_revision]
    if not newer:
        return []
    docs = [helm.revision_manifest(pv.release, pv.namespace, r, kubeconfig) for r in newer]
    target = helm.revision_manifest(pv.release, pv.namespace, new_revision, kubeconfig)
    return sweep(client, pv.release, pv.namespace, leftovers(docs, target), say)


@dataclass
class Outcome:
    preview: Preview
    applied: bool
    revision: int | None = None  # the revision helm rollback made
    nodes_back: list[str] = field(default_factory=list)
    archived: Path | None = None
    orphans: list[Orphan] = field(default_factory=list)  # the revisions rolled back from's leftovers (sweep)


def run(plan: Plan, opts: Options, say: Progress, display: Display | None = None) -> Outcome:
    """Preview, and with opts.yes the rollback itself (see the module's docstring)."""
    from installer import kube

    pv = preview(plan, opts, say)
    if not opts.yes:
        return Outcome(pv, applied=False)
    if opts.chart and not pv.helm_done:  # read and held against its pin before anything changes; _helm_back
        from installer import operator  # gets this same copy

        operator.load_chart(plan, opts.chart)
    kubeconfig = kube.resolve_kubeconfig(opts.kubeconfig)
    out = Outcome(pv, applied=True, revision=pv.current.revision)
    client = kube.api_client(kubeconfig)
    if not pv.helm_done:
        state = _helm_back(plan, opts, pv, kubeconfig, say)
        say(f"release {pv.release}: revision {state.revision} {state.status} ({state.chart})")
        out.revision = state.revision
        out.orphans = _sweep_after(pv, state.revision, kubeconfig, client, say)
    if pv.driver_mode in HOST_MODES:
        _host_batches(plan, opts, pv, client, str(kubeconfig), say, display, out)
    elif pv.state is not None:
        from installer.upgrade import operator_rollout

        operator_rollout.lift_all(client, [n for b in pv.state.batches for n in b.nodes])
    if pv.state is not None:
        out.archived = pv.state_path.with_name(
            f"{pv.state_path.stem}.rolled-back-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
        pv.state_path.replace(out.archived)
        say(f"state file kept as {out.archived}")
    return out


def _helm_back(plan: Plan, opts: Options, pv: Preview, kubeconfig: Path, say: Progress) -> Any:
    """helm rollback to the target revision. Where helm refuses it for a resource the target renders that is in the
    cluster but not in the current revision (NOT_IN_CURRENT), and opts.chart is the target revision's chart: `helm
    upgrade --skip-crds` with that chart and exactly the target revision's values (helm's upgrade adopts the
    resource); without such a chart the refusal is said with that fix."""
    from installer import helm
    from installer.errors import ClusterError

    say(f"helm rollback {pv.release} {pv.target.revision} (namespace {pv.namespace})")
    try:
        return helm.rollback(pv.release, pv.namespace, pv.target.revision, kubeconfig, timeout=opts.timeout,
                             wait=opts.wait)
    except ClusterError as exc:
        found = NOT_IN_CURRENT.search(exc.message)
        if found is None:
            raise
        what = f"{found.group(1)} {found.group(2)}"
        if not opts.chart:
            raise ClusterError(
                f"{exc.message} -- revision {pv.target.revision} renders {what}, which is in the cluster but not in "
                f"revision {pv.current.revision}'s manifest: helm rollback does not adopt it (helm upgrade does)",
                hint=f"give the chart of revision {pv.target.revision} ({pv.target.chart}) with --chart: the "
                     "rollback then runs as helm upgrade with that chart and exactly that revision's values; helm "
                     "recorded the refused try as a failed revision, so name the revision with --to-revision "
                     f"{pv.target.revision}") from None
    from installer import operator

    ref = operator.load_chart(plan, opts.chart).ref  # read once, held against its pin; helm gets the copy read
    meta = operator.chart_metadata(ref) or {}
    name = f"{meta.get('name')}-{meta.get('version')}"
    if meta and name != pv.target.chart:
        raise ConfigError(f"--chart {opts.chart} is {name}, not revision {pv.target.revision}'s {pv.target.chart}",
                          hint=f"give the {pv.target.chart} chart (the previous bundle's charts/)")
    values = helm.revision_values(pv.release, pv.namespace, pv.target.revision, kubeconfig)
    say(f"helm rollback refused ({what} is not in revision {pv.current.revision}'s manifest): helm upgrade "
        f"{pv.release} with {opts.chart} and revision {pv.target.revision}'s values")
    return helm.install_or_upgrade(ref, pv.release, pv.namespace, values, kubeconfig, timeout=opts.timeout,
                                   wait=opts.wait)


def _host_batches(plan: Plan, opts: Options, pv: Preview, client: Any, kubeconfig: str, say: Progress,
                  display: Display | None, out: Outcome) -> None:
    from installer.upgrade.host_rollout import HostBatch

    assert pv.state is not None
    rec = pv.state
    reboot = plan.site.driver.rebootPolicy in ("always", "if-needed")
    for index, nodes in pv.batches:
        for version in sorted({n.to for n in nodes if n.to}):
            names = [n.name for n in nodes if n.to == version]
            say(f"batch {index}: {', '.join(names)} back to driver {version}")
            batch_plan = _site_with_driver(plan, version) if pv.driver_mode == "host" else plan
            HostBatch(batch_plan, client, kubeconfig, drain_timeout=opts.drain_timeout,
                      node_timeout=opts.node_timeout, validate_timeout=opts.validate_timeout, say=say,
                      display=display, layers=opts.validate_layers).run(
                names, reboot=reboot,
                cordoned_before=lambda n: bool(rec.nodes[n].cordonedBefore) if n in rec.nodes else False,
                boot_ids={})
            out.nodes_back += names
