"""`gpu-install apply` end to end and `gpu-install uninstall`, each a list of named stages (installer.stages).

apply (apply_stages): preflight → nodes (installer.apply: playbooks/preflight.yml, site.yml) → operator
(installer.operator: namespace, pull Secret, helm upgrade --install) → the features' stages (installer.features:
sharing, monitoring) → mig (installer.mig: the nodes' nvidia.com/mig.config label) → validate. Everything the
operator and feature stages need (chart, kubeconfig, rendered values, registry credentials, the features' inputs, the
MIG layout names) is resolved BEFORE any stage runs, so a missing piece is a configuration error (exit 2) with
nothing changed and no stage table.

uninstall (uninstall_stages), guarded by --yes: the features' releases and objects, the Helm release and
gpu-install's pull Secret (installer.operator.uninstall), then playbooks/uninstall.yml with gpu_install_action=remove
(runtime configs back to their backups minus our keys, the registry CA files, then the toolkit and driver packages
and files that gpu-install installed -- its record on each node says which; what was there before stays), then the
packages it removed, read from the run's events.

The runner gives every stage its row in the Summary (its outcome, skipped with the reason, failed, or not run after
an earlier failure), printed by the CLI also when a stage fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from installer import apply as nodes
from installer import stages
from installer.errors import ConfigError, GpuInstallError, HostsUnreachable, ValidationFindings
from installer.stages import Result, Row, Stage

if TYPE_CHECKING:
    from installer.ansible import RunResult
    from installer.features import Feature
    from installer.operator import Prepared
    from installer.plan import Plan
    from installer.progress import Display

Progress = Callable[[str], None]
SKIP_HINT = "or pass --skip-operator to configure the nodes only"


@dataclass(frozen=True)
class OperatorOptions:
    enabled: bool = True  # --skip-operator turns it off
    kubeconfig: str | None = None  # --kubeconfig, else $KUBECONFIG, else ~/.kube/config
    chart: str | None = None  # --chart / $GPU_INSTALL_CHART, else the site's operator.chart
    timeout: float = 300
    wait: bool = True
    delete_namespace: bool = False  # uninstall only
    purge_crds: bool = False  # uninstall only: delete the chart's CRDs once no custom resource of theirs is left
    with_limit: bool = False  # --include-operator: run the cluster-wide operator stage also with --limit
    validate: bool = True  # apply only: `gpu-install validate` as the last stage (--skip-validate turns it off)
    mirror_check: bool = True  # apply only: the operator's images in registry.host before any host (--skip-mirror-check)


@dataclass
class Summary:
    """The stage table of one apply/uninstall: a row per stage (installer.stages), printed by the CLI also when a
    stage fails."""

    command: str
    check: bool = False
    stages: list[Row] = field(default_factory=list)
    nodes_changed: int | None = None  # sum of per-host changed counts of the node playbook
    report: Any = None  # apply's validate stage: its installer.validate.Report (printed with the stage table)

    def table(self) -> str:
        """The stage table printed after apply/uninstall (also when a stage failed)."""
        title = f"{self.command}{' (check mode: nothing changed)' if self.check else ''} stages:"
        return stages.table(title, self.stages)

    def records(self) -> list[dict[str, Any]]:
        """The stage table as data: [{name, outcome, reason, seconds}] per stage."""
        return stages.records(self.stages)


def _split(tags: str | None) -> set[str]:
    return {t.strip() for t in (tags or "").split(",") if t.strip()}


def _say(display: Display | None) -> Progress:
    return display.note if display is not None else (lambda _: None)


def operator_selected(run: nodes.RunOptions, op: OperatorOptions, limit: str | None = None) -> str | None:
    """None when the operator stage runs, else why not (it is tagged `operator` for --tags/--skip-tags). --limit
    never widens a run: the operator (and with it the mig stage) is cluster-wide, so a limited run leaves it alone
    unless --include-operator asks for it."""
    if not op.enabled:
        return "--skip-operator"
    if limit and not op.with_limit:
        return f"--limit {limit}: the operator is cluster-wide (add --include-operator to include it)"
    tags = _split(run.tags)
    if tags and not tags & {"operator", "all"}:
        return f"--tags {run.tags} does not include operator"
    if "operator" in _split(run.skip_tags):
        return "--skip-tags operator"
    return None


def _with_skip_hint(exc: ConfigError) -> ConfigError:
    return ConfigError(f"operator stage: {exc.message}", hint=f"{exc.hint}; {SKIP_HINT}" if exc.hint else SKIP_HINT)


def prepare_operator(plan: Plan, op: OperatorOptions) -> Prepared:
    """Chart, values, credentials and kubeconfig checked before any host is touched (exit 2 if missing)."""
    from installer import operator

    try:
        return operator.prepare(plan, op.kubeconfig, op.chart or plan.site.operator.chart)
    except ConfigError as exc:
        raise _with_skip_hint(exc) from None


def _nodes_detail(res: RunResult) -> str:
    return f"changed={res.changed} on {len(res.hosts)} host(s); run records {res.artifacts}"


def run_apply(plan: Plan, run: nodes.RunOptions, op: OperatorOptions, summary: Summary,
              display: Display | None = None) -> Summary:
    """preflight → nodes → operator → sharing → monitoring → mig → validate (apply_stages); raises the first stage's
    error after every stage has its row in summary."""
    stages.run(apply_stages(plan, run, op, summary, display), summary.stages)
    return summary


def apply_stages(plan: Plan, run: nodes.RunOptions, op: OperatorOptions, summary: Summary,
                 display: Display | None = None) -> list[Stage]:
    """apply's stages, in order. What the operator, sharing and monitoring stages need is resolved here, before any
    stage runs and so before any host is touched: a missing piece is exit 2 with nothing changed (and no stage)."""
    from installer import features, offline_checks, operator
    from installer.features import StageRun

    say = _say(display)
    site = plan.site
    summary.check = run.check
    skip_reason = operator_selected(run, op, plan.limit)
    prepared = None if skip_reason else prepare_operator(plan, op)
    # every offline input check `config check` makes too (installer.offline_checks: the inventory's groups, the
    # package repository's key, what the features read on the controller -- a stage's chart only when the stages
    # run --, the images and package roots the mirror check asks for), before any stage and any contact (exit 2)
    offline_checks.inputs(plan, stages=prepared is not None, mirror_check=op.mirror_check)
    cluster: dict[str, Any] = {}  # feature name -> what its stage needs of the cluster, found by preflight

    def with_operator(not_configured: str | None) -> Callable[[], str | None]:
        """The precondition of a stage that runs after the operator stage, on the same cluster."""
        return lambda: not_configured or ("runs with the operator stage" if prepared is None else None)

    def preflight() -> Result:
        offline_checks.conflicts(plan)  # the site's feature conflicts (exit 3), before anything is contacted
        if prepared is not None:  # the cluster's Kubernetes version, before any host is touched (read-only)
            note = operator.check_cluster(plan, prepared.kubeconfig)
            if note:
                say(f"note: {note}")
            if features.staged(site):  # each staged feature's cluster check (exit 3), e.g. GPUs already advertised
                from installer import kube  # by something else, or the scrape flavour the cluster allows

                cluster.update(features.check_cluster(plan, kube.api_client(prepared.kubeconfig), say))
            if op.mirror_check:  # every image the operator stage deploys is in the site registry (read-only)
                from installer.mirror.verify import for_apply

                say(f"preflight: {for_apply(plan)} images in {site.registry.host}")
        if op.mirror_check and plan.role_vars.get("package_repo_enabled"):
            # every package root the node roles install is in the site repository, its signature the site key's
            from installer.mirror.verify import packages_for_apply

            say(f"preflight: {packages_for_apply(plan)} package roots in {site.packages.url}")
        pre = nodes.preflight(plan, run, display, offline=False)  # offline_checks: made above
        return Result(stages.OK, f"{len(pre.hosts)} host(s) checked, read-only")

    def node_roles() -> Result:
        say("stage nodes: playbooks/site.yml")
        res = nodes.run_nodes("site.yml", plan, run, display)
        summary.nodes_changed = res.changed
        return Result(stages.changed(res.changed, run.check), _nodes_detail(res))

    def operator_release() -> Result:
        assert prepared is not None
        name = f"release {site.operator.releaseName} in namespace {site.operator.namespace}"
        if run.check:
            say(f"stage operator (check mode): comparing {name} with chart {prepared.shown}")
            report = operator.preview(plan, prepared)
            for line in report.lines():
                say(f"operator: {line}")
            return Result(stages.changed(report.changed, True), report.lines()[-1])
        say(f"stage operator: {name}, chart {prepared.shown}")
        done = operator.install(plan, prepared, timeout=op.timeout, wait=op.wait,
                                progress=lambda m: say(f"operator: {m}"))
        return Result(stages.changed(done.changed, False), done.lines()[-2])

    def kubeconfig() -> Any:
        assert prepared is not None
        return prepared.kubeconfig

    def feature_stage(name: str, feature: Feature | None, why_not: str) -> Stage:
        """A feature's stage (installer.features: sharing, monitoring), or its row saying why none runs it."""
        def apply() -> Result:
            assert feature is not None
            done = feature.apply(StageRun(plan, kubeconfig(), run.check, op.timeout, op.wait, say,
                                          cluster.get(feature.name)))
            return Result(done.outcome, done.detail)

        return Stage(name, apply, skip=with_operator(why_not if feature is None else None))

    return [
        Stage("preflight", preflight, failure=_without_artifacts),
        Stage("nodes", node_roles, failure=_without_artifacts),
        Stage("operator", operator_release, skip=lambda: skip_reason),
        *(feature_stage(*row) for row in features.feature_stages(site)),
        Stage("mig", lambda: run_mig(plan, run.check, str(kubeconfig()), say),
              skip=with_operator(None if plan.mig else NO_MIG)),
        Stage("validate", lambda: run_validate(plan, str(kubeconfig()), op, summary, say),
              skip=lambda: validate_skipped(plan, run, op, skip_reason)),
    ]


NO_MIG = "no MIG layout configured (site mig.config / inventory gpu_install_mig_config)"


def _without_artifacts(exc: GpuInstallError) -> str:
    """A node stage's error without the run-records path (the detail column names it for the stage that ran)."""
    return exc.message.split(" (run artifacts")[0]


def validate_skipped(plan: Plan, run: nodes.RunOptions, op: OperatorOptions, operator_skipped: str | None) -> str | None:
    """Why apply's validate stage does not run, or None."""
    if operator_skipped:
        return ("runs after the operator stage: run `gpu-install validate` once the operator is up" if op.validate
                else "--skip-validate")
    if not op.validate:
        return "--skip-validate"
    if run.check:
        return "check mode"
    if not op.wait:
        return "--no-wait: the operator's pods may not be up yet; run `gpu-install validate` when they are"
    if not plan.nodes:
        return f"no GPU node in this run (--limit {plan.limit})"
    return None


def run_validate(plan: Plan, kubeconfig: str, op: OperatorOptions, summary: Summary, say: Progress) -> Result:
    """apply's last stage: `gpu-install validate` (every layer) on what apply just installed; its report goes into
    summary.report. Findings fail the stage with ValidationFindings (exit 6), an unreachable node with
    HostsUnreachable (exit 5)."""
    from installer import validate

    say("stage validate: " + ", ".join(validate.AVAILABLE))
    # helm's wait covers the chart's own workloads, not the operands the operator deploys once it runs
    report = validate.run(plan, kubeconfig, validate.AVAILABLE, timeout=op.timeout, progress=say,
                          operator_wait=op.timeout)
    summary.report = report
    counts = report.counts()
    detail = ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" ({report.seconds:.1f}s)"
    code = report.exit_code()
    if code == HostsUnreachable.exit_code:
        api = next((c for c in report.checks if c.check == validate.API_SERVER_CHECK), None)
        if api is not None:
            return Result(stages.FAILED, detail, HostsUnreachable(
                f"validate: {api.message}", hint=api.fix or "check that the cluster is up, then run `gpu-install "
                                                            "validate`"))
        return Result(stages.FAILED, detail, HostsUnreachable(
            f"validate: {counts['unreachable']} node(s) unreachable (the report above names them)",
            hint="check the nodes' SSH (the inventory's connection settings), then run `gpu-install validate`"))
    if code:
        return Result(stages.FAILED, detail, ValidationFindings(
            f"validate: {counts['fail']} check(s) failed after the install (the report above gives the fix for each)",
            hint="fix them and run `gpu-install validate` (apply again where the fix says so)"))
    return Result("passed", detail)


def run_mig(plan: Plan, check: bool, kubeconfig: str, say: Progress) -> Result:
    """Label the GPU nodes nvidia.com/mig.config (installer.mig: every node checked before any is labelled);
    in check mode only report what would be set."""
    from installer import mig

    say(f"stage mig: {mig.LABEL} on the GPU nodes" + (" (check mode)" if check else ""))
    results = mig.label_nodes(plan, kubeconfig, dry_run=check, progress=lambda m: say(f"mig: {m}"))
    n = sum(r.changed for r in results)
    return Result(stages.changed(n, check), f"{mig.LABEL} on {len(results)} node(s), {n} set")


# ---------------------------------------------------------------- uninstall


def removal_plan(plan: Plan, op: OperatorOptions, skipped: str | None = None,
                 keep_packages: bool = False) -> list[str]:
    """What uninstall removes (printed without --yes, and before it acts), for the hosts the run covers."""
    site, ev = plan.site, plan.role_vars
    groups = plan.inventory.groups if plan.inventory else {}
    out: list[str] = []
    if skipped:
        out.append(f"not the GPU Operator release: {skipped}")
    if op.enabled:  # the features' stages: their releases, labels and objects
        from installer import features

        out += features.removal(plan)
    if op.enabled:
        ns, rel = site.operator.namespace, site.operator.releaseName
        out.append(f"Helm release {rel} and its resources in namespace {ns}")
        if site.registry.pullSecret:
            out.append(f"pull Secret {ns}/{site.registry.pullSecret.name} (only if gpu-install made it)")
        if op.delete_namespace:
            out.append(f"namespace {ns}")
        out.append("the chart's CRDs, if no custom resource of theirs is left (else exit 3, no CRD deleted)"
                   if op.purge_crds else "not the chart's CRDs: they stay, as helm leaves them (--purge-crds deletes them)")
    on = f"on the gpu_nodes hosts ({', '.join(groups.get('gpu_nodes', ())) or 'none under --limit'}):"
    if ev["docker_runtime_enabled"]:
        out.append(f"{on} /etc/docker/daemon.json back to its content before apply minus our keys "
                   "(runtimes.nvidia, default-runtime if still ours, registries we added); backup kept; docker restarted")
    if ev["containerd_runtime_enabled"]:
        out.append(f"{on} containerd drop-in /etc/containerd/conf.d/99-nvidia.toml and our `imports` entry in "
                   "/etc/containerd/config.toml; backup kept; containerd restarted")
    if ev["registry_trust_enabled"]:
        out.append(f"{on} the CA of {site.registry.host} from the OS trust store, docker certs.d and containerd "
                   "hosts.toml (only files gpu-install wrote)")
    if groups.get("kube_control_plane"):
        out.append("on the kube_control_plane hosts: gpu-install's flags and mount out of the kube-scheduler "
                   "static-pod manifest and its scheduler policy/config files, if an apply put them there; backup kept")
    # only mig.dynamic nos turns MIG mode on; the record also covers an earlier apply with nos on a site now without
    from installer.features import nos

    mig_record = "/var/lib/gpu-install/mig_mode.json"
    out.append(f"{on} MIG mode off on the GPUs gpu-install turned it on for (mig.dynamic nos; its record {mig_record}),"
               " their MIG instances destroyed first" if nos.FEATURE.requested(site) else
               f"{on} MIG mode off only where an earlier apply with mig.dynamic nos turned it on (its record "
               f"{mig_record}; this site does not use nos: usually nothing)")
    keep = keep_packages
    out.append(f"{on} the NVIDIA container toolkit and driver " + (
        "packages stay installed (keep packages); the files gpu-install wrote go" if keep else
        "packages gpu-install installed (its record in /var/lib/gpu-install; packages that were there before stay), "
        "the nouveau blacklist it wrote (initramfs regenerated), a runfile driver it ran"))
    return out


REMOVE_PACKAGES_TASK = "| Remove the packages gpu-install installed"


def removed_packages(res: RunResult) -> dict[str, list[str]]:
    """host -> the packages the driver and toolkit roles removed, from the run's job events."""
    import json

    out: dict[str, list[str]] = {}
    events = res.artifacts / "artifacts" / "run" / "job_events" if res.artifacts else None
    for ev in sorted(events.glob("*.json")) if events and events.is_dir() else []:
        try:
            data = json.loads(ev.read_text())
        except (OSError, ValueError):
            continue
        d = data.get("event_data") or {}
        if data.get("event") == "runner_on_ok" and str(d.get("task", "")).endswith(REMOVE_PACKAGES_TASK):
            out.setdefault(str(d.get("host")), []).extend((d.get("res") or {}).get("removed") or [])
    return out


def run_uninstall(plan: Plan, run: nodes.RunOptions, op: OperatorOptions, yes: bool, summary: Summary,
                  display: Display | None = None) -> Summary:
    """sharing → monitoring → operator → nodes → packages (uninstall_stages); raises the first stage's error after
    every stage has its row in summary."""
    stages.run(uninstall_stages(plan, run, op, yes, summary, display), summary.stages)
    return summary


def uninstall_stages(plan: Plan, run: nodes.RunOptions, op: OperatorOptions, yes: bool, summary: Summary,
                     display: Display | None = None) -> list[Stage]:
    """uninstall's stages, in order. Without yes, what it would remove is a ConfigError (exit 2, nothing touched);
    the kubeconfig is checked before any stage runs."""
    from installer import features, kube, operator

    say = _say(display)
    site = plan.site
    skip_reason = operator_selected(run, op, plan.limit)
    op = replace(op, enabled=skip_reason is None)
    todo = removal_plan(plan, op, skip_reason, run.keep_packages)
    if not yes:
        raise ConfigError("uninstall would remove:\n    " + "\n    ".join(todo) + "\nnot confirmed; nothing was changed",
                          hint="re-run with --yes to confirm")
    kubeconfig = None
    if op.enabled:  # checked before anything is touched
        try:
            kubeconfig = kube.resolve_kubeconfig(op.kubeconfig)
            kube.api_client(kubeconfig)  # parsed now: a malformed one changes nothing
        except ConfigError as exc:
            raise _with_skip_hint(exc) from None
    for line in todo:
        say(f"uninstall: {line}")

    def with_operator(not_configured: str | None) -> Callable[[], str | None]:
        return lambda: not_configured or ("runs with the operator stage" if kubeconfig is None else None)

    def feature_stage(name: str, feature: Feature | None, why_not: str) -> Stage:
        """A feature's removal (installer.features: sharing, monitoring), or its row saying why none runs it."""
        def remove() -> Result:
            assert feature is not None and kubeconfig is not None
            done = feature.uninstall(plan, kubeconfig, timeout=op.timeout, progress=lambda m: say(f"{name}: {m}"))
            return Result("removed" if done else stages.UNCHANGED, "; ".join(done) or "nothing of it was there")

        return Stage(name, remove, skip=with_operator(why_not if feature is None else None))

    def operator_release() -> Result:
        rep = operator.uninstall(plan, kubeconfig, yes=True, delete_namespace=op.delete_namespace,
                                 timeout=op.timeout, progress=lambda m: say(f"operator: {m}"),
                                 purge_crds=op.purge_crds, chart_ref=op.chart or site.operator.chart)
        return Result("removed" if rep.release_removed else stages.UNCHANGED, "; ".join(rep.lines()))

    ran: list[RunResult] = []  # the nodes stage's run, read by the packages stage

    def node_roles() -> Result:
        say("stage nodes: playbooks/uninstall.yml")
        res = nodes.run_nodes("uninstall.yml", plan, run.removing(), display)
        ran.append(res)
        summary.nodes_changed = res.changed
        return Result(stages.CHANGED if res.changed else stages.UNCHANGED, _nodes_detail(res))

    def packages() -> Result:
        removed = {h: pkgs for h, pkgs in removed_packages(ran[-1]).items() if pkgs}
        if not removed:
            return Result("kept", "no package gpu-install installed was left to remove")
        return Result("would remove" if run.check else "removed",
                      f"{sum(map(len, removed.values()))} package(s) gpu-install had installed, on "
                      f"{', '.join(sorted(removed))}; those that were there before stay")

    return [
        *(feature_stage(*row) for row in features.feature_stages(site)),
        Stage("operator", operator_release, skip=lambda: skip_reason),
        Stage("nodes", node_roles, failure=_without_artifacts),
        Stage("packages", packages),
    ]
