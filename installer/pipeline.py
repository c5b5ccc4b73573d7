"""`gpu-install apply` end to end and `gpu-install uninstall`.

apply: preflight → node roles (installer.apply: playbooks/preflight.yml, site.yml) → operator
(installer.operator: namespace, pull Secret, helm upgrade --install). Everything the operator stage
needs (chart, kubeconfig, rendered values, registry credentials) is resolved BEFORE any host is
touched, so a missing piece is a configuration error (exit 2) with nothing changed. Last, when a MIG
layout is configured (site mig.config, inventory gpu_install_mig_config), the mig stage labels the GPU
nodes nvidia.com/mig.config (installer.mig; names checked before any host is touched too).

uninstall: the reverse, guarded by --yes: the Helm release and gpu-install's pull Secret first
(installer.operator.uninstall), then playbooks/uninstall.yml with gpu_install_action=remove (runtime
configs back to their backups minus our keys, the registry CA files, then the toolkit and driver packages and files
that gpu-install installed -- its record on each node says which; what was there before stays).

Each stage's outcome is collected in a Summary, printed by the CLI also when a stage fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from installer import apply as nodes
from installer.errors import ConfigError, GpuInstallError, HostsUnreachable, ValidationFindings

if TYPE_CHECKING:
    from installer.ansible import RunResult
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
class Stage:
    name: str
    outcome: str  # ok | changed | unchanged | would change | skipped | FAILED | not run | removed
    detail: str = ""


@dataclass
class Summary:
    command: str
    check: bool = False
    stages: list[Stage] = field(default_factory=list)
    nodes_changed: int | None = None  # sum of per-host changed counts of the node playbook
    report: Any = None  # apply's validate stage: its installer.validate.Report (printed with the stage table)

    def add(self, name: str, outcome: str, detail: str = "") -> Stage:
        st = Stage(name, outcome, detail)
        self.stages.append(st)
        return st

    def table(self) -> str:
        """The stage table printed after apply/uninstall (also when a stage failed)."""
        from installer.ui import table

        title = f"{self.command}{' (check mode: nothing changed)' if self.check else ''} stages:"
        return table(title, ["stage", "outcome", "detail"], [(s.name, s.outcome, s.detail) for s in self.stages])


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
    """preflight → nodes → operator → sharing → monitoring → mig → validate; raises the first stage's error after
    recording it in summary."""
    from installer import monitoring, operator, sharing

    say = _say(display)
    site = plan.site
    summary.check = run.check
    skip_reason = operator_selected(run, op, plan.limit)
    prepared = None if skip_reason else prepare_operator(plan, op)
    if prepared is not None and sharing.active(site):  # the sharing stage's chart, before any host (exit 2)
        sharing.check_chart(site)
    if monitoring.enabled(site):  # the metrics CSV, before any host (exit 2)
        monitoring.metrics_csv(site)
    scrape = ""

    stage = "preflight"
    try:
        if prepared is not None:  # the cluster's Kubernetes version, before any host is touched (read-only)
            note = operator.check_cluster(plan, prepared.kubeconfig)
            if note:
                say(f"note: {note}")
            if sharing.active(site):  # GPUs already advertised by something else; docker on 1.24+ (exit 3)
                from installer import kube

                sharing.check_cluster(plan, kube.api_client(prepared.kubeconfig), site.operator.namespace)
            if monitoring.enabled(site):  # ServiceMonitor or plain scrape config (exit 3 if asked and impossible)
                from installer import kube

                scrape = monitoring.resolve_scrape(site, kube.api_client(prepared.kubeconfig))
                say(f"preflight: monitoring scrape {scrape}"
                    + (" (the cluster serves monitoring.coreos.com/v1)" if site.monitoring.scrape == "auto"
                       and scrape == "serviceMonitor" else ""))
            if op.mirror_check:  # every image the operator stage deploys is in the site registry (read-only)
                from installer.mirror.verify import for_apply

                say(f"preflight: {for_apply(plan)} images in {site.registry.host}")
        if op.mirror_check and plan.role_vars.get("package_repo_enabled"):
            # every package root the node roles install is in the site repository, its signature the site key's
            from installer.mirror.verify import packages_for_apply

            say(f"preflight: {packages_for_apply(plan)} package roots in {site.packages.url}")
        pre = nodes.preflight(plan, run, display)
        summary.add("preflight", "ok", f"{len(pre.hosts)} host(s) checked, read-only")
        stage = "nodes"
        say("stage nodes: playbooks/site.yml")
        res = nodes.run_nodes("site.yml", plan, run, display)
        summary.nodes_changed = res.changed
        outcome = ("would change" if run.check else "changed") if res.changed else "unchanged"
        summary.add("nodes", outcome, _nodes_detail(res))
    except GpuInstallError as exc:
        summary.add(stage, "FAILED", exc.message.split(" (run artifacts")[0][:300])
        if stage == "preflight":
            summary.add("nodes", "not run")
        summary.add("operator", "not run" if not skip_reason else "skipped", skip_reason or "")
        raise

    if skip_reason or prepared is None:
        summary.add("operator", "skipped", skip_reason or "")
        if sharing.active(site):
            summary.add("sharing", "skipped", "runs with the operator stage")
        if monitoring.enabled(site):
            summary.add("monitoring", "skipped", "runs with the operator stage")
        summary.add("mig", "skipped", "runs with the operator stage")
        summary.add("validate", "skipped", "runs after the operator stage: run `gpu-install validate` once the "
                                           "operator is up" if op.validate else "--skip-validate")
        return summary
    name = f"release {site.operator.releaseName} in namespace {site.operator.namespace}"
    try:
        if run.check:
            say(f"stage operator (check mode): comparing {name} with chart {prepared.chart}")
            report = operator.preview(plan, prepared)
            for line in report.lines():
                say(f"operator: {line}")
            summary.add("operator", "would change" if report.changed else "unchanged", report.lines()[-1])
        else:
            say(f"stage operator: {name}, chart {prepared.chart}")
            done = operator.install(plan, prepared, timeout=op.timeout, wait=op.wait,
                                    progress=lambda m: say(f"operator: {m}"))
            summary.add("operator", "changed" if done.changed else "unchanged", done.lines()[-2])
    except GpuInstallError as exc:
        summary.add("operator", "FAILED", exc.message[:300])
        if sharing.active(site):
            summary.add("sharing", "not run")
        if monitoring.enabled(site):
            summary.add("monitoring", "not run")
        summary.add("mig", "not run")
        summary.add("validate", "not run")
        raise
    if sharing.active(site):
        try:
            run_sharing(plan, run.check, op, prepared.kubeconfig, summary, say)
        except GpuInstallError:
            if monitoring.enabled(site):
                summary.add("monitoring", "not run")
            summary.add("mig", "not run")
            summary.add("validate", "not run")
            raise
    if monitoring.enabled(site):
        try:
            run_monitoring(plan, run.check, prepared.kubeconfig, scrape, summary, say)
        except GpuInstallError:
            summary.add("mig", "not run")
            summary.add("validate", "not run")
            raise
    if not plan.mig:
        summary.add("mig", "skipped", "no MIG layout configured (site mig.config / inventory gpu_install_mig_config)")
    else:
        try:
            run_mig(plan, run.check, str(prepared.kubeconfig), summary, say)
        except GpuInstallError:
            summary.add("validate", "not run")
            raise
    run_validate(plan, run, op, str(prepared.kubeconfig), summary, say)
    return summary


def run_validate(plan: Plan, run: nodes.RunOptions, op: OperatorOptions, kubeconfig: str, summary: Summary,
                 say: Progress) -> None:
    """apply's last stage: `gpu-install validate` (every layer) on what apply just installed; its report goes into
    summary.report. Findings raise ValidationFindings (exit 6), an unreachable node HostsUnreachable (exit 5)."""
    from installer import validate

    why = ("--skip-validate" if not op.validate else "check mode" if run.check else
           "--no-wait: the operator's pods may not be up yet; run `gpu-install validate` when they are"
           if not op.wait else f"no GPU node in this run (--limit {plan.limit})" if not plan.nodes else "")
    if why:
        summary.add("validate", "skipped", why)
        return
    say("stage validate: " + ", ".join(validate.AVAILABLE))
    try:
        report = validate.run(plan, kubeconfig, validate.AVAILABLE, timeout=op.timeout, progress=say)
    except GpuInstallError as exc:
        summary.add("validate", "FAILED", exc.message[:300])
        raise
    summary.report = report
    counts = report.counts()
    detail = ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" ({report.seconds:.1f}s)"
    code = report.exit_code()
    summary.add("validate", "passed" if code == 0 else "FAILED", detail)
    if code == HostsUnreachable.exit_code:
        raise HostsUnreachable(f"validate: {counts['unreachable']} node(s) unreachable (the report above names them)",
                               hint="check the nodes' SSH (the inventory's connection settings), then run "
                                    "`gpu-install validate`")
    if code:
        raise ValidationFindings(f"validate: {counts['fail']} check(s) failed after the install (the report above "
                                 "gives the fix for each)",
                                 hint="fix them and run `gpu-install validate` (apply again where the fix says so)")


def run_monitoring(plan: Plan, check: bool, kubeconfig: Any, scrape: str, summary: Summary, say: Progress) -> None:
    """monitoring.enabled: the ServiceMonitor + PrometheusRule or the scrape-config and rules ConfigMaps, and the
    dashboard ConfigMap (installer.monitoring); check mode: what would change (server-side dry run)."""
    from installer import monitoring

    say(f"stage monitoring: scrape {scrape}, namespace {plan.site.monitoring.namespace}"
        + (" (check mode)" if check else ""))
    try:
        rep = monitoring.install(plan, kubeconfig, scrape, progress=lambda m: say(f"monitoring: {m}"), dry_run=check)
    except GpuInstallError as exc:
        summary.add("monitoring", "FAILED", exc.message[:300])
        raise
    outcome = ("would change" if check else "changed") if rep.changed else "unchanged"
    summary.add("monitoring", outcome, "; ".join(rep.lines())[:300])


def run_sharing(plan: Plan, check: bool, op: OperatorOptions, kubeconfig: Any, summary: Summary,
                say: Progress) -> None:
    """sharing.mode hami / gpumanager: the mode's release and node label (installer.sharing); check mode: what
    would change."""
    from installer import sharing

    what = {"hami": "HAMi", "nos": "nos (dynamic MIG)"}.get(sharing.kind(plan.site) or "",
                                                           "gpu-manager + gpu-quota-admission")
    say(f"stage sharing: {what}" + (" (check mode)" if check else ""))
    try:
        if check:
            changed, what = sharing.preview(plan, kubeconfig)
            summary.add("sharing", "would change" if changed else "unchanged", what)
            return
        rep = sharing.install(plan, kubeconfig, timeout=op.timeout, wait=op.wait,
                              progress=lambda m: say(f"sharing: {m}"))
    except GpuInstallError as exc:
        summary.add("sharing", "FAILED", exc.message[:300])
        raise
    summary.add("sharing", "changed" if rep.changed else "unchanged", "; ".join(rep.lines()[:2]))


def run_mig(plan: Plan, check: bool, kubeconfig: str, summary: Summary, say: Progress) -> None:
    """Label the GPU nodes nvidia.com/mig.config (installer.mig: every node checked before any is labelled);
    in check mode only report what would be set."""
    from installer import mig

    say(f"stage mig: {mig.LABEL} on the GPU nodes" + (" (check mode)" if check else ""))
    try:
        results = mig.label_nodes(plan, kubeconfig, dry_run=check, progress=lambda m: say(f"mig: {m}"))
    except GpuInstallError as exc:
        summary.add("mig", "FAILED", exc.message[:300])
        raise
    changed = sum(r.changed for r in results)
    outcome = ("would change" if check else "changed") if changed else "unchanged"
    summary.add("mig", outcome, f"{mig.LABEL} on {len(results)} node(s), {changed} set")


# ---------------------------------------------------------------- uninstall


def removal_plan(plan: Plan, op: OperatorOptions, skipped: str | None = None,
                 keep_packages: bool = False) -> list[str]:
    """What uninstall removes (printed without --yes, and before it acts), for the hosts the run covers."""
    site, ev = plan.site, plan.role_vars
    groups = plan.inventory.groups if plan.inventory else {}
    out: list[str] = []
    if skipped:
        out.append(f"not the GPU Operator release: {skipped}")
    from installer import sharing

    if op.enabled and sharing.active(site):
        sns, label = sharing.namespace(site), sharing.node_label(site)
        out.append(f"Helm release {sharing.release_name(site)} ({sharing.kind(site)}) in namespace {sns}, the node "
                   f"label {label[0]} from the GPU nodes"
                   + (f", pull Secret {sns}/{site.registry.pullSecret.name} (only if gpu-install made it)"
                      if site.registry.pullSecret and sns != site.operator.namespace else ""))
    if op.enabled and site.monitoring.enabled:
        from installer import monitoring

        out.append(monitoring.describe(plan))
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
    out.append(f"{on} MIG mode off on the GPUs gpu-install turned it on for (its record "
               "/var/lib/gpu-install/mig_mode.json; mig.dynamic nos), their MIG instances destroyed first")
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
    from installer import kube, operator, sharing

    say = _say(display)
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
    if op.enabled and sharing.active(plan.site):
        assert kubeconfig is not None
        try:
            done = sharing.uninstall(plan, kubeconfig, timeout=op.timeout, progress=lambda m: say(f"sharing: {m}"))
            summary.add("sharing", "removed" if done else "unchanged", "; ".join(done) or "nothing of it was there")
        except GpuInstallError as exc:
            summary.add("sharing", "FAILED", exc.message[:300])
            summary.add("operator", "not run")
            summary.add("nodes", "not run")
            raise
    if op.enabled and plan.site.monitoring.enabled:
        from installer import monitoring

        assert kubeconfig is not None
        try:
            gone = monitoring.uninstall(plan, kubeconfig, progress=lambda m: say(f"monitoring: {m}"))
            summary.add("monitoring", "removed" if gone else "unchanged", "; ".join(gone) or "nothing of it was there")
        except GpuInstallError as exc:
            summary.add("monitoring", "FAILED", exc.message[:300])
            summary.add("operator", "not run")
            summary.add("nodes", "not run")
            raise
    if op.enabled:
        try:
            rep = operator.uninstall(plan, kubeconfig, yes=True, delete_namespace=op.delete_namespace,
                                     timeout=op.timeout, progress=lambda m: say(f"operator: {m}"),
                                     purge_crds=op.purge_crds, chart_ref=op.chart or plan.site.operator.chart)
            summary.add("operator", "removed" if rep.release_removed else "unchanged", "; ".join(rep.lines()))
        except GpuInstallError as exc:
            summary.add("operator", "FAILED", exc.message[:300])
            summary.add("nodes", "not run")
            raise
    else:
        summary.add("operator", "skipped", skip_reason or "")
    try:
        say("stage nodes: playbooks/uninstall.yml")
        res = nodes.run_nodes("uninstall.yml", plan, run.removing(), display)
        summary.nodes_changed = res.changed
        summary.add("nodes", "changed" if res.changed else "unchanged", _nodes_detail(res))
    except GpuInstallError as exc:
        summary.add("nodes", "FAILED", exc.message.split(" (run artifacts")[0][:300])
        raise
    removed = {h: pkgs for h, pkgs in removed_packages(res).items() if pkgs}
    if removed:
        summary.add("packages", "would remove" if run.check else "removed",
                    f"{sum(map(len, removed.values()))} package(s) gpu-install had installed, on "
                    f"{', '.join(sorted(removed))}; those that were there before stay")
    else:
        summary.add("packages", "kept", "no package gpu-install installed was left to remove")
    return summary
