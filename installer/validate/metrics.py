"""Metrics layer: on every GPU node, the GPU Operator's DCGM exporter is read the way Prometheus reads it, through the
API server's proxy to the exporter pod on that node (`/api/v1/namespaces/<ns>/pods/<pod>:9400/proxy/metrics`), and
parsed with prometheus_client's text-format parser:

- metrics.exporter      a running exporter pod on the node (label app=nvidia-dcgm-exporter in the operator's namespace)
- metrics.gpus          every GPU reports: the UUIDs nvidia-smi listed (node layer) or, without it, GFD's
                        nvidia.com/gpu.count, each appear in the exporter's series
- metrics.core          every GPU reports the core metrics: utilisation, framebuffer used/free, SM clock,
                        temperature and power (a vGPU guest reports no temperature/power: those two only warn)
- metrics.attribution   a running pod that holds a GPU of the node appears on the series (pod, namespace labels):
                        the workloads already running there, or, when none is, a probe pod of the layer's own (one
                        GPU, sleeping) for as long as it takes the exporter to see it (its pod-resources refresh)

A node without an exporter pod fails metrics.exporter and is not read further.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from installer.validate.report import Check

LAYER = "metrics"
EXPORTER_SELECTOR = "app=nvidia-dcgm-exporter"
PORT = 9400
CORE = {"DCGM_FI_DEV_GPU_UTIL": "utilisation", "DCGM_FI_DEV_FB_USED": "framebuffer used",
        "DCGM_FI_DEV_FB_FREE": "framebuffer free", "DCGM_FI_DEV_SM_CLOCK": "SM clock",
        "DCGM_FI_DEV_GPU_TEMP": "temperature", "DCGM_FI_DEV_POWER_USAGE": "power"}
SOFT = {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"}  # absent on vGPU guests
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-", "nvidia.com/gpu.shared", "tencent.com/vcuda-core")
PROBE_LABELS = {"app.kubernetes.io/managed-by": "gpu-install", "app.kubernetes.io/component": "validate-metrics"}


@dataclass
class Scrape:
    """What one exporter answered: per GPU UUID the metric names it reported, and the pods on its series."""
    gpus: dict[str, set[str]] = field(default_factory=dict)
    pods: set[tuple[str, str]] = field(default_factory=set)  # (namespace, pod)


def parse(text: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            uuid = s.labels.get("UUID")
            if not uuid:
                continue
            out.gpus.setdefault(uuid, set()).add(s.name)
            if s.labels.get("pod") and s.labels.get("namespace"):
                out.pods.add((s.labels["namespace"], s.labels["pod"]))
    return out


def read(core: Any, namespace: str, pod: str) -> str:
    """The exporter's /metrics through the API server's pod proxy."""
    return str(core.connect_get_namespaced_pod_proxy_with_path(f"{pod}:{PORT}", namespace, "metrics"))


def holds_gpu(pod: Any) -> bool:
    for c in pod.spec.containers or []:
        limits = (c.resources.limits or {}) if c.resources else {}
        if any(k.startswith(GPU_RESOURCES) and str(v) not in ("0", "") for k, v in limits.items()):
            return True
    return False


def _status_message(exc: Any) -> str:
    """The API server's message in an ApiException's Status body (what the proxy could not reach, and why)."""
    import json

    try:
        return str(json.loads(exc.body or "{}").get("message") or "")[:300]
    except ValueError:
        return str(exc.body or "")[:300]


def _check(name: str, node: str, status: str, message: str, fix: str = "") -> Check:
    return Check(LAYER, name, node, status, message, fix)  # type: ignore[arg-type]


def node_checks(node: str, scrape: Scrape, expected: Sequence[str] | None, count: int | None,
                pods: Sequence[tuple[str, str]]) -> list[Check]:
    """The checks of one node from what its exporter answered. expected: the GPU UUIDs nvidia-smi listed (None: not
    read); count: GFD's GPU count when there is no UUID list; pods: (namespace, pod) running there with a GPU."""
    out = []
    have = scrape.gpus
    if expected:
        missing = sorted(set(expected) - set(have))
        out.append(_check("metrics.gpus", node, "fail" if missing else "pass",
                          f"no series for GPU(s) {', '.join(missing)} of the {len(expected)} nvidia-smi lists"
                          if missing else f"{len(expected)} GPU(s) report, as nvidia-smi lists them",
                          "check the exporter's log (kubectl logs -l app=nvidia-dcgm-exporter); a GPU DCGM cannot "
                          "read (XID, fallen off the bus) reports nothing" if missing else ""))
    elif count is not None:
        ok = len(have) >= count
        out.append(_check("metrics.gpus", node, "pass" if ok else "fail",
                          f"{len(have)} GPU(s) report, GFD counts {count}",
                          "" if ok else "check the exporter's log (kubectl logs -l app=nvidia-dcgm-exporter)"))
    else:
        out.append(_check("metrics.gpus", node, "pass" if have else "fail",
                          f"{len(have)} GPU(s) report (no nvidia-smi or GFD count to compare with)",
                          "" if have else "the exporter reports no GPU: check its log"))
    hard, soft = [], []
    for uuid, names in sorted(have.items()):
        lacking = [m for m in CORE if m not in names]
        if [m for m in lacking if m not in SOFT]:
            hard.append(f"{uuid}: {', '.join(CORE[m] for m in lacking)}")
        elif lacking:
            soft.append(f"{uuid}: {', '.join(CORE[m] for m in lacking)}")
    if hard:
        out.append(_check("metrics.core", node, "fail", "core metrics missing: " + "; ".join(hard),
                          "the metrics list (monitoring.metrics / the ConfigMap gpu-install-dcgm-metrics) must "
                          "list them; restart the exporter pods after changing it (subPath mounts are not "
                          "refreshed)"))
    elif soft:
        out.append(_check("metrics.core", node, "warn", "no " + "; ".join(soft) + " (a vGPU guest reports none)",
                          "on bare metal: check the metrics list and the exporter's log"))
    elif have:
        out.append(_check("metrics.core", node, "pass",
                          f"utilisation, memory, SM clock, temperature and power for {len(have)} GPU(s)"))
    if pods:
        missing_pods = [f"{ns}/{p}" for ns, p in pods if (ns, p) not in scrape.pods]
        out.append(_check("metrics.attribution", node, "fail" if missing_pods else "pass",
                          f"{', '.join(missing_pods)} hold(s) a GPU but no series carries the pod"
                          if missing_pods else f"{', '.join(f'{ns}/{p}' for ns, p in pods)} on the GPU series",
                          "per-pod attribution needs DCGM_EXPORTER_KUBERNETES=true and the kubelet's pod-resources "
                          "socket mounted in the exporter (the operator does both); a Prometheus without "
                          "honor_labels renames these labels" if missing_pods else ""))
    return out


def run(core: Any, namespace: str, nodes: Sequence[str], facts: Mapping[str, Any], node_objs: Mapping[str, Any],
        probe: Callable[[str], dict[str, Any] | None], timeout: float = 120.0, poll: float = 2.0,
        progress: Callable[[str], None] | None = None) -> list[Check]:
    """The layer. probe(node) -> the body of a pod holding one GPU of that node (None: none can be made), started
    where no running pod holds a GPU, deleted at the end."""
    from kubernetes.client.exceptions import ApiException

    out: list[Check] = []
    exporters = {}
    for p in core.list_namespaced_pod(namespace, label_selector=EXPORTER_SELECTOR).items:
        if p.status.phase == "Running" and p.spec.node_name:
            exporters[p.spec.node_name] = p.metadata.name
    probes: dict[str, str] = {}
    probe_ns: dict[str, str] = {}
    workloads: dict[str, list[tuple[str, str]]] = {}
    try:
        for node in nodes:
            if node not in exporters:
                out.append(_check("metrics.exporter", node, "fail",
                                  f"no running DCGM exporter pod on {node} ({EXPORTER_SELECTOR} in {namespace})",
                                  "monitoring.enabled (or components.dcgmExporter), the node label "
                                  "nvidia.com/gpu.deploy.dcgm-exporter=true, and the exporter pod's events"))
                continue
            out.append(_check("metrics.exporter", node, "pass", f"{namespace}/{exporters[node]}"))
            selector = f"spec.nodeName={node},status.phase=Running"
            running = [p for p in core.list_pod_for_all_namespaces(field_selector=selector).items if holds_gpu(p)]
            workloads[node] = [(p.metadata.namespace, p.metadata.name) for p in running]
            if not running:
                body = probe(node)
                if body is not None:
                    core.create_namespaced_pod(body["metadata"]["namespace"], body)
                    probes[node] = body["metadata"]["name"]
                    probe_ns[node] = body["metadata"]["namespace"]
                    workloads[node] = [(body["metadata"]["namespace"], body["metadata"]["name"])]
        if progress:
            progress(f"metrics: {len(exporters)} exporter(s); {len(probes)} probe pod(s) holding a GPU")
        deadline = time.monotonic() + timeout
        pending = [n for n in nodes if n in exporters]
        results: dict[str, list[Check]] = {}
        last_error: dict[str, str] = {}
        while pending:
            for node in list(pending):
                if node in probes and workloads[node]:  # the probe must run before the exporter can see it
                    from installer.validate.smoke import _waiting

                    pod = core.read_namespaced_pod(probes[node], probe_ns[node])
                    phase = pod.status.phase
                    stuck = _waiting(pod)
                    if phase != "Running":
                        if time.monotonic() < deadline and not stuck and phase not in ("Failed", "Succeeded"):
                            continue
                        workloads[node] = []
                        ended = [st.state.terminated for st in (pod.status.container_statuses or [])
                                 if st.state and st.state.terminated]
                        why = (f"{stuck[0]} {stuck[1]}".strip() if stuck else
                               f"{phase}: exit {ended[0].exit_code} {ended[0].reason or ''} {ended[0].message or ''}"
                               .strip() if ended else f"phase {phase} after {timeout:.0f}s")
                        results.setdefault(node, []).append(_check(
                            "metrics.attribution", node, "fail",
                            f"the probe pod {probe_ns[node]}/{probes[node]} (one GPU) did not run: {why}",
                            "the cluster and smoke layers say why a GPU pod cannot run there"))
                try:
                    text = read(core, namespace, exporters[node])
                except ApiException as exc:
                    last_error[node] = f"HTTP {exc.status} {exc.reason}: {_status_message(exc)}"
                    if time.monotonic() < deadline:
                        continue
                    results[node] = [_check("metrics.scrape", node, "fail",
                                            f"reading {exporters[node]}:{PORT}/metrics through the API server: "
                                            f"{last_error[node]}", "the exporter pod's log and readiness")]
                    pending.remove(node)
                    continue
                smi = facts.get(node)
                expected = [g.uuid for g in smi.gpus if g.uuid] if smi is not None and smi.gpus else None
                obj = node_objs.get(node)
                gfd = (obj.metadata.labels or {}).get("nvidia.com/gpu.count") if obj is not None else None
                checks = node_checks(node, parse(text), expected, int(gfd) if gfd and gfd.isdigit() else None,
                                     workloads.get(node, []))
                attributed = all(c.status != "fail" for c in checks if c.check == "metrics.attribution")
                if attributed or time.monotonic() >= deadline:
                    results[node] = checks + results.get(node, [])
                    pending.remove(node)
            if pending:
                time.sleep(poll)
        for node in nodes:
            out += results.get(node, [])
    finally:
        for node, name in probes.items():
            try:
                core.delete_namespaced_pod(name, probe_ns[node], grace_period_seconds=0)
            except ApiException:
                pass
    return out
