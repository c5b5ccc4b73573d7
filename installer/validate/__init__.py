"""`gpu-install validate`: the post-install verdict, layer by layer, as a report (installer/validate/report.py).

Layers in this version: node (installer/validate/probe.py: SSH with paramiko; nvsmi.py parses `nvidia-smi -q -x`,
node.py turns the facts and the site's expectations into findings), runtime (the same SSH session; runtime.py),
cluster (cluster.py), smoke (smoke.py) and mig (mig.py, on the Node objects the cluster layer lists). Each GPU
node of the plan (inventory group gpu_nodes, Kubernetes name gpu_install_node_name or the host name) gets its
checks; checks about the cluster as a whole have the node '(cluster)'. See docs/validate.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from installer.errors import ClusterUnreachable, ConfigError
from installer.validate.report import LAYERS, Check, Report

if TYPE_CHECKING:
    from installer.plan import Plan

AVAILABLE = ("node", "runtime", "cluster", "smoke", "mig", "metrics")  # the layers this version runs
LOCAL = ("node", "runtime")  # validate --local: this machine


def parse_only(text: str | None, local: bool = False) -> tuple[str, ...]:
    """--only node,cluster -> the layers in report order; None/empty: every available layer (--local: LOCAL)."""
    available = LOCAL if local else AVAILABLE
    if not text:
        return available
    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in LAYERS]
    if unknown:
        raise ConfigError(f"--only {text}: unknown layer(s) {', '.join(unknown)}", hint=f"layers: {', '.join(LAYERS)}")
    missing = [p for p in asked if p not in AVAILABLE]
    if missing:
        raise ConfigError(f"--only {text}: the {', '.join(missing)} layer(s) are not in this version",
                          hint=f"available: {', '.join(AVAILABLE)}")
    remote = [p for p in asked if p not in available]
    if remote:
        raise ConfigError(f"--only {text}: --local checks this machine: the {', '.join(remote)} layer(s) need the "
                          "cluster", hint=f"with --local: {', '.join(LOCAL)}; leave out --local for the others")
    return tuple(layer for layer in LAYERS if layer in asked)


def image_for(plan: Plan, *components: str) -> str | None:
    """The site-registry reference of the first of components that the plan deploys an image for."""
    by = {i.component: i.destination for i in plan.images}
    return next((by[c] for c in components if c in by), None)


def runtime_class(client: Any, name: str | None) -> str | None:
    """name when that RuntimeClass exists in the cluster (the operator creates it), else None."""
    if not name:
        return None
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    try:
        k.NodeV1Api(client).read_runtime_class(name)
        return name
    except ApiException:
        return None


def expectations(plan: Plan, node: str) -> Any:
    """What the site says the node should show: the driver version (site driver.version, else the release's driver
    image version when the operator deploys the driver), its MIG layout and whether it has NVSwitches (node.fabric)."""
    from installer.validate.node import Expectations, fabric_expected

    comp = plan.components.get("driver")
    pin = plan.site.driver.version or (comp.version if comp is not None and plan.deployed(comp) else None)
    mig = next((a.config for a in plan.mig if a.node == node), None)
    gpu = next((n for n in plan.nodes if node in (n.node_name, n.name)), None)
    nvswitch = None if gpu is None else fabric_expected(gpu.nvswitch, gpu.role_vars.get("nvidia_driver_fabric_manager",
                                                                                        "auto"))
    return Expectations(driver_version=pin, mig_config=mig, nvswitch=nvswitch, signer=signer_expectation(plan))


def signer_expectation(plan: Plan) -> Any:
    """node.driver.signer's expectation when the site asks for Secure Boot (driver.secureBoot.mode require/auto) and
    the module is built on the node from a file on its disk (driver.mode host/runfile): signed by the site
    certificate. None otherwise. Raises ConfigError naming driver.secureBoot.certificate when it cannot be read."""
    from installer.validate.node import SignerExpectation, site_certificate

    sb = plan.site.driver.secureBoot
    if sb.mode == "off" or plan.site.driver.mode not in ("host", "runfile") or sb.certificate is None:
        return None
    field = f"driver.secureBoot.certificate {sb.certificate}"
    hint = "set driver.secureBoot.certificate to the site's MOK certificate (DER or PEM)"
    try:
        with open(sb.certificate, "rb") as f:
            data = f.read(64 * 1024 + 1)
    except OSError as e:
        raise ConfigError(f"{field}: cannot be read ({e.strerror})", hint=hint) from None
    try:
        return SignerExpectation(site_certificate(data, field))
    except ValueError as e:
        raise ConfigError(str(e), hint=hint) from None


def runtime_expectations(plan: Plan, host_vars: dict[str, Any]) -> Any:
    """What the runtime layer expects on a node: the site's runtime with the nvidia runtime (the inventory may rename
    it: containerd_runtime_name), the default runtime when gpu-install's role set it (toolkit.mode host, CDI off), and
    CDI specs when CDI is on."""
    from installer import features
    from installer.validate.runtime import RuntimeExpect

    site = plan.site
    host_toolkit = site.toolkit.mode == "host"
    cdi = plan.effective("cdi.enabled") is True if site.cdi.enabled is None else site.cdi.enabled
    name = str(host_vars.get("containerd_runtime_name") or "nvidia") if site.runtime == "containerd" else "nvidia"
    # a feature may need nvidia as the default runtime whoever configures it, or plain runc (installer.features)
    needs = features.default_runtime(site)
    default = True if (host_toolkit or needs == "nvidia") and not cdi and needs != "runc" else None
    return RuntimeExpect(runtime=site.runtime, name=name, default=default,
                         cdi=bool(cdi), by="gpu-install apply" if host_toolkit else
                         "the GPU Operator's toolkit daemonset (toolkit.mode operator)")


def node_targets(plan: Plan) -> list[Any]:
    from installer.plan import gpu_host_vars
    from installer.validate.probe import Target

    names = {n.name: n.node_name for n in plan.nodes}
    return [Target(host, names.get(host, host), hv) for host, hv in gpu_host_vars(plan.require_inventory())]


def run(plan: Plan, kubeconfig: str | None, layers: Sequence[str] = AVAILABLE, *, keep_failed: bool = False,
        timeout: float = 300.0, node_timeout: float = 30.0, progress: Callable[[str], None] | None = None,
        client: Any = None, operator_wait: float = 0.0) -> Report:
    """The report of the layers asked. operator_wait: with the cluster layer, first give every ClusterPolicy up to
    that many seconds to report ready, and with the mig layer each node with a MIG layout as long for mig-manager's
    verdict (apply's validate stage, right after the operator's install and the mig stage's labels)."""
    from kubernetes import client as k

    from installer import features, kube
    from installer.validate import cluster, probe

    report = Report(plan.release.version, tuple(layers))
    t0 = time.monotonic()
    nodes = [n.node_name for n in plan.nodes]
    if not nodes:
        raise ConfigError("no GPU nodes to validate", hint="pass -i with an inventory whose group gpu_nodes has hosts")
    kube_layers = bool({"cluster", "smoke", "mig", "metrics"} & set(layers))
    if kube_layers and client is None:  # a bad kubeconfig is exit 2 before any node is contacted
        client = kube.api_client(kube.resolve_kubeconfig(kubeconfig))
    ssh_layers = tuple(layer for layer in ("node", "runtime") if layer in layers)
    facts: dict[str, Any] = {}  # node -> NvidiaSmi from the node layer, for the cluster layer's counts
    if ssh_layers:
        targets = node_targets(plan)
        if progress:
            progress(f"{'+'.join(ssh_layers)}: {len(targets)} GPU node(s) over SSH")
        report.add(*probe.run(targets, lambda t: expectations(plan, t.node), node_timeout, progress, layers=ssh_layers,
                              runtime_expect=lambda t: runtime_expectations(plan, dict(t.vars)), facts=facts))
    if not kube_layers:
        report.seconds = time.monotonic() - t0
        return report
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    core = k.CoreV1Api(client)
    try:
        if operator_wait > 0 and "cluster" in layers:  # before the nodes are read: the operator labels them too
            cluster.wait_clusterpolicy(k.CustomObjectsApi(client), operator_wait, progress)
        objs = {n.metadata.name: n for n in kube._call("list the nodes", lambda: core.list_node().items)}
        node_checks = cluster.node_checks(objs, nodes)
        ns = plan.site.operator.namespace
        secret = plan.pull_secret.name if plan.pull_secret else None
        if "cluster" in layers:
            if progress:
                progress(f"cluster: {len(nodes)} GPU node(s)")
            report.add(*node_checks)
            # what advertises the GPUs counts them: a sharing feature, else the device plugin (x its replicas)
            report.add(*features.cluster_counts(plan, objs, facts))
            report.add(*cluster.operator_checks(core, k.CustomObjectsApi(client), ns, plan.site.registry.host, secret))
        if "smoke" in layers:
            report.add(*_smoke(plan, client, core, objs, nodes, ns, secret, keep_failed, timeout, progress))
        if "mig" in layers:
            from installer.validate import mig

            if progress:
                progress(f"mig: {len(plan.mig)} node(s) with a MIG layout")
            dynamic = features.mig_checks(plan, objs, facts)  # a feature that makes the layouts checks its own
            if dynamic is None and operator_wait > 0 and plan.mig:  # apply: the mig stage has just set the labels
                objs = mig.wait_states(lambda: kube._call("list the nodes", lambda: core.list_node().items),
                                       [a.node for a in plan.mig], operator_wait, progress)
            report.add(*(dynamic if dynamic is not None else
                         mig.checks([(a.node, a.config) for a in plan.mig], plan.site.mig.strategy, objs)))
        if "metrics" in layers:
            report.add(*_metrics(plan, client, core, objs, nodes, ns, secret, timeout, progress,
                                 asked=tuple(layers) != AVAILABLE, facts=facts))
    except ApiException as exc:  # refused (RBAC, admission) or gone: the API server's message, exit 7
        raise kube._api_error("validate", exc) from None
    except (ClusterUnreachable, HTTPError) as exc:  # no API server (or it went away mid-run): the layers that need
        report.add(api_unreachable(exc, client, layers))  # it end here; the node results stay in the report (exit 5)
    report.seconds = time.monotonic() - t0
    return report


API_SERVER_CHECK = "cluster.api-server"


def api_unreachable(exc: BaseException, client: Any, layers: Sequence[str]) -> Check:
    """The report's finding when the API server cannot be reached: status unreachable (exit 5), naming the server,
    in the first layer asked for that needs it."""
    from installer.validate.report import CLUSTER

    server = str(getattr(getattr(client, "configuration", None), "host", "") or "(the kubeconfig's server)")
    if isinstance(exc, ClusterUnreachable):
        message, fix = exc.message, exc.hint or ""
    else:  # a urllib3 error from a client not made by kube.api_client()
        message = f"cannot reach the Kubernetes API server {server} ({type(exc).__name__})"
        fix = "check the kubeconfig's server and that the cluster is up"
    if server not in message:
        message += f" (API server {server})"
    layer = next(x for x in ("cluster", "smoke", "mig", "metrics") if x in layers)
    return Check(layer, API_SERVER_CHECK, CLUSTER, "unreachable",
                 message + "; the checks that need the API server were not run", fix)


def _metrics(plan: Plan, client: Any, core: Any, objs: dict[str, Any], nodes: list[str], ns: str,
             secret: str | None, timeout: float, progress: Callable[[str], None] | None, asked: bool,
             facts: dict[str, Any]) -> list[Check]:
    from installer import features
    from installer.validate import metrics, smoke

    if not plan.site.monitoring.enabled and not asked:
        return [Check("metrics", "metrics.exporter", "(cluster)", "skip", "monitoring.enabled is false (validate "
                      "--only metrics reads the exporter anyway)")]
    image = image_for(plan, "operator.initContainer", "validator", "operator")
    rc = runtime_class(client, plan.effective("operator.runtimeClass") or "nvidia")
    run = smoke.run_id()

    def probe(node: str) -> dict[str, Any] | None:
        obj = objs.get(node)
        if obj is None or image is None:
            return None
        t = _gpu_target(plan, node, obj)
        spec: dict[str, Any] = {
            "restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "nodeName": node,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "hold-gpu", "image": image, "command": ["sleep", str(int(timeout) + 60)],
                            "resources": {"limits": dict(t.limits) if t.limits else {t.resource: "1"}}}]}
        if secret:
            spec["imagePullSecrets"] = [{"name": secret}]
        if rc and features.default_runtime(plan.site) != "runc":
            spec["runtimeClassName"] = rc
        return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                "metadata": {"name": f"gpu-install-metrics-{run}-{nodes.index(node)}", "namespace": ns,
                             "labels": {**metrics.PROBE_LABELS, smoke.RUN_LABEL: run}}}

    if progress:
        progress(f"metrics: the DCGM exporter on {len(nodes)} GPU node(s) through the API server")
    return metrics.run(core, ns, nodes, facts, objs, probe, timeout=min(timeout, 180.0), progress=progress)


def _gpu_target(plan: Plan, n: str, obj: Any) -> Any:
    """What a pod asks to hold one GPU of node n (as the smoke layer's pod): an active feature's share (a sharing
    mode's slice, a MIG device a dynamic-MIG feature makes on demand), else one GPU as the node advertises it (a MIG
    device where it advertises only those)."""
    from installer import features
    from installer.validate import cluster, smoke

    target = features.smoke_target(plan, n, obj)
    if target is not None:
        return target
    res = cluster.gpu_resources(obj.status.allocatable) or cluster.gpu_resources(obj.status.capacity)
    return smoke.Target(n, cluster.GPU if cluster.GPU in res or not res else sorted(res)[0])


def _smoke(plan: Plan, client: Any, core: Any, objs: dict[str, Any], nodes: list[str], ns: str, secret: str | None,
           keep_failed: bool, timeout: float, progress: Callable[[str], None] | None) -> list[Check]:
    from kubernetes.client.exceptions import ApiException

    from installer.validate import smoke

    smi = image_for(plan, "operator.initContainer", "validator", "operator")
    vector = image_for(plan, "validator", "operator")
    if smi is None or vector is None:
        return [Check("smoke", "smoke.gpu-pod", n, "skip", "the release pins no CUDA/validator image") for n in nodes]
    try:
        core.read_namespace(ns)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return [Check("smoke", "smoke.gpu-pod", n, "fail", f"namespace {ns} does not exist",
                      "install the operator first (gpu-install apply / operator install): the smoke pods run in its "
                      "namespace, with its pull Secret") for n in nodes]
    from installer import features

    plain_runc = features.default_runtime(plan.site) == "runc"
    targets, out = [], []
    for n in nodes:
        if n not in objs:
            out.append(Check("smoke", "smoke.gpu-pod", n, "skip", f"no Node {n} (cluster layer: node-present)"))
            continue
        targets.append(_gpu_target(plan, n, objs[n]))
    # a feature's containers may run with plain runc (gpu-manager mounts the driver and its CUDA interception itself)
    rc = None if plain_runc else runtime_class(client, plan.effective("operator.runtimeClass") or "nvidia")
    out += smoke.run(core, ns, targets, smi, vector, secret, rc, timeout=timeout, keep_failed=keep_failed,
                     progress=progress)
    return out


__all__ = ["AVAILABLE", "LOCAL", "Check", "Report", "parse_only", "run"]
