"""GPU monitoring (site `monitoring:`): the GPU Operator's DCGM exporter with gpu-install's metric list, how
Prometheus scrapes it, the alert rules and the Grafana dashboard.

- operator values (render_values(), from installer.render.values): dcgmExporter on, `dcgmExporter.config` naming
  the ConfigMap gpu-install-dcgm-metrics with the metrics CSV (the chart makes it from `data` from v24.9.0; below,
  the operator stage writes it before the release: configmaps_before_operator()). Per-pod attribution is the
  exporter's default under the operator (DCGM_EXPORTER_KUBERNETES, the kubelet's pod-resources socket).
- objects() for the monitoring stage (in monitoring.namespace):
  - scrape serviceMonitor: a ServiceMonitor selecting the operator's Service nvidia-dcgm-exporter (port gpu-metrics)
    with honorLabels (the workload's pod/namespace labels survive) and jobLabel app (job nvidia-dcgm-exporter, as the
    operator's own), and the alert rules as a PrometheusRule; both with monitoring.labels;
  - scrape config: a ConfigMap with a plain Prometheus scrape job (kubernetes_sd_configs role endpoints in the
    operator's namespace, kept by Service and port name, honor_labels) and a ConfigMap with the rules file (and the
    same two files under monitoring.files on the controller);
  - always: the Grafana dashboard as a ConfigMap with the sidecar's label (monitoring.dashboardLabel: "1").
- scrape auto: the cluster decides at apply (resolve_scrape(): monitoring.coreos.com/v1 served or not).
- FEATURE: the same as a feature (installer.features): operator values, the metrics CSV checked before any host,
  the scrape flavour from the cluster, the monitoring stage and its removal.
The content is values/monitoring/ (metrics CSV, alerts.yaml and its promtool tests, dashboard.json).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from installer.config import Site
from installer.errors import ConfigError
from installer.features.base import Feature, StageResult, StageRun

if TYPE_CHECKING:
    from installer.catalog import Release
    from installer.plan import Plan

METRICS_CONFIGMAP = "gpu-install-dcgm-metrics"  # dcgmExporter.config.name, in the operator's namespace
METRICS_KEY = "dcgm-metrics.csv"  # the key the operator mounts (controllers/object_controls.go)
CONFIG_CREATE_FROM = "v24.9.0"  # the chart makes the ConfigMap from dcgmExporter.config.data from this release
SERVICE, PORT_NAME, PORT = "nvidia-dcgm-exporter", "gpu-metrics", 9400  # the operator's Service for the exporter
JOB = "nvidia-dcgm-exporter"  # the scrape job every rule and dashboard query selects
EXPORTER_LABEL = ("app", "nvidia-dcgm-exporter")  # the exporter's pods and Service
RULES = "gpu-install-gpu-alerts"
SCRAPE = "gpu-install-dcgm-scrape"
DASHBOARD = "gpu-install-gpu-dashboard"
SERVICE_MONITOR = "gpu-install-dcgm-exporter"
RULES_FILE, SCRAPE_FILE, DASHBOARD_FILE = "gpu-install-gpu-alerts.yaml", "gpu-install-dcgm-scrape.yaml", \
    "gpu-install-gpus.json"
MONITORING_GROUP = "monitoring.coreos.com"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-install", "app.kubernetes.io/part-of": "gpu-install-monitoring"}
Progress = Callable[[str], None]


def enabled(site: Site) -> bool:
    return site.monitoring.enabled


def content_dir() -> Path:
    from installer import content

    return content.root() / "values" / "monitoring"


@lru_cache(maxsize=1)
def _shipped(name: str) -> str:
    path = content_dir() / name
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}", hint="reinstall gpu-install: its shipped data is damaged") from None


def metrics_csv(site: Site) -> str:
    """The counters CSV the exporter gets: the site's (monitoring.metrics) or gpu-install's, checked line by line the
    way dcgm-exporter reads it (3 fields, a DCGM_FI_ name, a Prometheus type; no quotes)."""
    from installer.safefile import read_text

    path = site.monitoring.metrics
    text = read_text(path, what="monitoring.metrics") if path else _shipped("dcgm-metrics.csv")
    where = str(path) if path else "values/monitoring/dcgm-metrics.csv"
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or '"' in line:
            problems.append(f"line {n}: dcgm-exporter needs exactly 3 fields without quotes "
                            "(DCGM_FI_..., type, help without commas)")
        elif not fields[0].startswith("DCGM_"):
            problems.append(f"line {n}: {fields[0]!r} is not a DCGM field name (DCGM_FI_...)")
        elif fields[1] not in ("gauge", "counter", "label", "histogram", "summary"):
            problems.append(f"line {n}: type {fields[1]!r} is not gauge, counter or label")
    if problems:
        raise ConfigError(f"monitoring.metrics {where}: " + "; ".join(problems[:5]),
                          hint="the dcgm-exporter counters format: `DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization`")
    if not any(line.strip() and not line.startswith("#") for line in text.splitlines()):
        raise ConfigError(f"monitoring.metrics {where}: no metric in it", hint="list at least one DCGM field")
    return text


def alert_rules() -> dict[str, Any]:
    """values/monitoring/alerts.yaml: {groups: [...]}, checked by promtool in the tests."""
    doc = yaml.safe_load(_shipped("alerts.yaml"))
    assert isinstance(doc, dict) and doc.get("groups"), "alerts.yaml has no rule groups"
    return doc


def dashboard() -> str:
    return _shipped("dashboard.json")


# ---------------------------------------------------------------- operator values


def render_values(site: Site, release: Release, values: dict[str, Any]) -> None:
    """monitoring.enabled: the exporter on and pointed at gpu-install's metrics ConfigMap."""
    from installer.render.values import _set as set_

    if not enabled(site):
        return
    comp = release.components.get("dcgmExporter")
    if comp is None:
        raise ConfigError(f"monitoring.enabled: GPU Operator {release.version} has no DCGM exporter",
                          hint="choose another operator.version")
    ov = site.components.get("dcgmExporter")
    if ov is not None and ov.enabled is False:
        raise ConfigError("components.dcgmExporter.enabled: false contradicts monitoring.enabled: true, which needs "
                          "the DCGM exporter", hint="drop components.dcgmExporter.enabled or monitoring.enabled")
    if comp.enabled_path:  # v1.11 has no switch: the exporter always runs
        set_(values, comp.enabled_path, True)
    csv = metrics_csv(site)  # checked for every release (exit 2 at render / config check, before any host)
    config: dict[str, Any] = {"name": METRICS_CONFIGMAP}
    if creates_configmap(release):
        config |= {"create": True, "data": csv}
    values.setdefault("dcgmExporter", {})["config"] = config


def creates_configmap(release: Release) -> bool:
    return release.has_key("dcgmExporter.config.create")


def configmaps_before_operator(plan: Plan) -> list[dict[str, Any]]:
    """Releases below v24.9.0 only name the ConfigMap: gpu-install writes it into the operator's namespace before the
    release (the operator mounts it by name)."""
    site = plan.site
    if not enabled(site) or creates_configmap(plan.release):
        return []
    return [configmap(METRICS_CONFIGMAP, site.operator.namespace, {METRICS_KEY: metrics_csv(site)})]


# ---------------------------------------------------------------- objects of the monitoring stage


def configmap(name: str, namespace: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {**MANAGED, **(labels or {})}},
            "data": data}


def scrape_job(site: Site) -> dict[str, Any]:
    """The plain Prometheus scrape job (for a Prometheus in the cluster: in-cluster service account; it needs
    get/list/watch on endpoints, services and pods in the operator's namespace)."""
    return {
        "job_name": JOB,
        "honor_labels": True,  # dcgm-exporter's pod/namespace/container are the workload's, not the exporter's
        "scrape_interval": site.monitoring.interval,
        "metrics_path": "/metrics",
        "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [site.operator.namespace]}}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_service_name"], "regex": SERVICE, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": PORT_NAME, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "kubernetes_node"},
        ],
    }


def scrape_config_text(site: Site) -> str:
    return ("# gpu-install: scrape job for the GPU Operator's DCGM exporter; add it under scrape_configs of your\n"
            "# prometheus.yml (or load this file with your configuration tooling).\n"
            + yaml.safe_dump({"scrape_configs": [scrape_job(site)]}, sort_keys=False))


def rules_text() -> str:
    return _shipped("alerts.yaml")


def objects(site: Site, scrape: str) -> list[dict[str, Any]]:
    """What the monitoring stage applies, for scrape serviceMonitor or config (auto resolved)."""
    m = site.monitoring
    ns = m.namespace
    out: list[dict[str, Any]] = []
    if scrape == "serviceMonitor":
        out.append({"apiVersion": f"{MONITORING_GROUP}/v1", "kind": "ServiceMonitor",
                    "metadata": {"name": SERVICE_MONITOR, "namespace": ns, "labels": {**MANAGED, **m.labels}},
                    "spec": {"jobLabel": EXPORTER_LABEL[0],
                             "selector": {"matchLabels": {EXPORTER_LABEL[0]: EXPORTER_LABEL[1]}},
                             "namespaceSelector": {"matchNames": [site.operator.namespace]},
                             "endpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": m.interval,
                                            "honorLabels": True}]}})
        out.append({"apiVersion": f"{MONITORING_GROUP}/v1", "kind": "PrometheusRule",
                    "metadata": {"name": RULES, "namespace": ns, "labels": {**MANAGED, **m.labels}},
                    "spec": alert_rules()})
    else:
        out.append(configmap(SCRAPE, ns, {SCRAPE_FILE: scrape_config_text(site)}, m.labels))
        out.append(configmap(RULES, ns, {RULES_FILE: rules_text()}, m.labels))
    out.append(configmap(DASHBOARD, ns, {DASHBOARD_FILE: dashboard()}, {m.dashboardLabel: "1"}))
    return out


def write_files(site: Site) -> list[Path]:
    """scrape config: the scrape job and the rules file into monitoring.files (controller), unchanged files kept."""
    from installer.util import atomic_write

    if not site.monitoring.files:
        return []
    d = Path(site.monitoring.files)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in ((SCRAPE_FILE, scrape_config_text(site)), (RULES_FILE, rules_text())):
        path = d / name
        if not path.exists() or path.read_text() != text:
            atomic_write(path, text)
            written.append(path)
    return written


# ---------------------------------------------------------------- the cluster


def serves_monitoring_api(client: Any) -> bool:
    """The cluster serves monitoring.coreos.com/v1 with ServiceMonitor and PrometheusRule (the Prometheus Operator)."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    from installer import kube

    try:
        res = kube._call("list monitoring.coreos.com/v1",
                         lambda: k.CustomObjectsApi(client).get_api_resources(MONITORING_GROUP, "v1"))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise kube._api_error("list monitoring.coreos.com/v1", exc) from None
    kinds = {r.kind for r in (res.resources if res else [])}
    return {"ServiceMonitor", "PrometheusRule"} <= kinds


def resolve_scrape(site: Site, client: Any) -> str:
    """scrape auto → serviceMonitor when the cluster has the Prometheus Operator's API, else config; serviceMonitor
    asked on a cluster without it is exit 3 (nothing changed)."""
    from installer.errors import PreflightError

    mode = site.monitoring.scrape
    if mode == "config":
        return mode
    has = serves_monitoring_api(client)
    if mode == "serviceMonitor" and not has:
        raise PreflightError("monitoring.scrape serviceMonitor: the cluster serves no monitoring.coreos.com/v1 "
                             "ServiceMonitor/PrometheusRule (no Prometheus Operator)",
                             hint="install the Prometheus Operator (kube-prometheus-stack) first, or set "
                                  "monitoring.scrape: config (a plain scrape config and rules file); nothing was "
                                  "changed")
    return "serviceMonitor" if has else "config"


@dataclass
class Report:
    scrape: str
    actions: list[tuple[str, str]] = field(default_factory=list)  # (Kind ns/name, created|updated|unchanged)
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return any(a != "unchanged" for _, a in self.actions) or bool(self.files)

    def lines(self) -> list[str]:
        done = [f"{what}: {a}" for what, a in self.actions]
        return [f"scrape {self.scrape}; " + ", ".join(done)] + [f"wrote {p}" for p in self.files]


def install(plan: Plan, kubeconfig: Path, scrape: str, progress: Progress | None = None,
            dry_run: bool = False) -> Report:
    """Apply the stage's objects (server-side apply, field manager gpu-install); with dry_run the API server computes
    the result and nothing is stored (apply --check)."""
    from installer import kube

    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    site = plan.site
    client = kube.api_client(kubeconfig)
    rep = Report(scrape)
    if not dry_run:
        kube.ensure_namespace(client, site.monitoring.namespace)
    elif kube.namespace_phase(client, site.monitoring.namespace) is None:
        rep.actions = [(f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}", "would create")
                       for o in objects(site, scrape)]
        return rep
    for obj in objects(site, scrape):
        action = kube.apply_object(client, obj, dry_run=dry_run)
        what = f"{obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']}"
        rep.actions.append((what, action if not dry_run or action == "unchanged" else f"would be {action}"))
        say(f"{what}: {rep.actions[-1][1]}")
    if scrape == "config" and not dry_run:
        rep.files = write_files(site)
    rep.seconds = time.monotonic() - t0
    return rep


def uninstall(plan: Plan, kubeconfig: Path, progress: Progress | None = None) -> list[str]:
    """Remove what the stage made (both scrape flavours, whichever an apply chose); the metrics ConfigMap of old
    releases in the operator's namespace too. Files under monitoring.files stay (they are the admin's now)."""
    from installer import kube

    say = progress or (lambda _m: None)
    site = plan.site
    client = kube.api_client(kubeconfig)
    done = []
    targets = [*objects(site, "serviceMonitor"), *objects(site, "config"),
               configmap(METRICS_CONFIGMAP, site.operator.namespace, {})]
    seen = set()
    for obj in targets:
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in seen:
            continue
        seen.add(key)
        if kube.delete_object_if_ours(client, obj):
            done.append(f"{obj['kind']} {key[2]}/{key[3]} removed")
            say(done[-1])
    return done


def describe(plan: Plan) -> str:
    m = plan.site.monitoring
    return (f"the monitoring objects in namespace {m.namespace} (ServiceMonitor/PrometheusRule or the scrape-config and "
            f"rules ConfigMaps, the dashboard ConfigMap) and ConfigMap {plan.site.operator.namespace}/"
            f"{METRICS_CONFIGMAP} if gpu-install made them")


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard (panels and template variables), as written."""
    doc = json.loads(dashboard())
    out = []
    for panel in doc.get("panels", []):
        for sub in [panel, *panel.get("panels", [])]:
            out += [t["expr"] for t in sub.get("targets", []) if t.get("expr")]
    return out


class Monitoring(Feature):
    name: ClassVar[str] = "monitoring"
    stage: ClassVar[str | None] = "monitoring"

    def requested(self, site: Site) -> bool:
        return enabled(site)

    def what(self, site: Site) -> str:
        return "monitoring.enabled"

    def operator_values(self, site: Site, release: Release, values: dict[str, Any]) -> None:
        render_values(site, release, values)

    def check_inputs(self, site: Site) -> None:
        metrics_csv(site)  # the metrics CSV (exit 2)

    def check_cluster(self, plan: Plan, client: Any, say: Progress) -> Any:
        """ServiceMonitor or plain scrape config (exit 3 if asked and impossible): the scrape flavour."""
        scrape = resolve_scrape(plan.site, client)
        say(f"preflight: monitoring scrape {scrape}"
            + (" (the cluster serves monitoring.coreos.com/v1)" if plan.site.monitoring.scrape == "auto"
               and scrape == "serviceMonitor" else ""))
        return scrape

    def apply(self, run: StageRun) -> StageResult:
        """The ServiceMonitor + PrometheusRule or the scrape-config and rules ConfigMaps, and the dashboard ConfigMap;
        check mode: what would change (server-side dry run)."""
        scrape = str(run.cluster)
        run.say(f"stage monitoring: scrape {scrape}, namespace {run.plan.site.monitoring.namespace}"
                + (" (check mode)" if run.check else ""))
        rep = install(run.plan, run.kubeconfig, scrape, progress=lambda m: run.say(f"monitoring: {m}"),
                      dry_run=run.check)
        outcome = ("would change" if run.check else "changed") if rep.changed else "unchanged"
        return StageResult(outcome, "; ".join(rep.lines())[:300])

    def removal(self, plan: Plan) -> str:
        return describe(plan)

    def uninstall(self, plan: Plan, kubeconfig: Path, timeout: float = 300,
                  progress: Progress | None = None) -> list[str]:
        return uninstall(plan, kubeconfig, progress=progress)


FEATURE = Monitoring()
