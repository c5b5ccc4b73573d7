"""Cluster layer (kubernetes client, read-only): the GPU nodes are Ready and advertise GPUs; when the GPU Operator
is installed, its pods are healthy, the ClusterPolicy is ready, the pull Secret exists and every image of its pods
comes from the site registry."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from installer.validate.report import CLUSTER, Check, Status

LAYER = "cluster"
GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
VCUDA_CORE = "tencent.com/vcuda-core"  # sharing.mode gpumanager: 100 per GPU


def gpu_resources(allocatable: dict[str, str] | None) -> dict[str, int]:
    """{nvidia.com/gpu | nvidia.com/mig-<profile> | tencent.com/vcuda-core: count} with count > 0."""
    out = {}
    for k, v in (allocatable or {}).items():
        if k in (GPU, VCUDA_CORE) or k.startswith(MIG_PREFIX):
            try:
                n = int(v)
            except ValueError:
                continue
            if n > 0:
                out[k] = n
    return out


def _check(check: str, node: str, ok: bool, message: str, fix: str = "", t0: float | None = None,
           warn: bool = False) -> Check:
    status: Status = "pass" if ok else ("warn" if warn else "fail")
    return Check(LAYER, check, node, status, message, "" if ok else fix,
                 seconds=time.monotonic() - t0 if t0 is not None else 0.0)


def node_checks(node_objs: dict[str, Any], names: list[str]) -> list[Check]:
    """Per GPU node: present, Ready, GPUs allocatable. node_objs: name -> V1Node (missing: absent)."""
    out = []
    for name in names:
        node = node_objs.get(name)
        if node is None:
            out.append(_check("cluster.node-present", name, False, f"no Node {name} in the cluster",
                              "join the node, or set gpu_install_node_name for a host whose Kubernetes node name "
                              "differs from its inventory name"))
            continue
        out.append(_check("cluster.node-present", name, True, f"Node {name} registered"))
        conds = {c.type: c for c in node.status.conditions or []}
        ready = conds.get("Ready")
        if ready is not None and ready.status == "True":
            out.append(_check("cluster.node-ready", name, True, "Ready"))
        else:
            why = f"{ready.reason}: {ready.message}" if ready is not None else "no Ready condition"
            out.append(_check("cluster.node-ready", name, False, f"not Ready ({why})",
                              "on the node: systemctl status kubelet; journalctl -u kubelet (runtime down? CNI "
                              "missing? certificates expired?)"))
        if node.spec.unschedulable:
            out.append(_check("cluster.node-schedulable", name, False, "cordoned (spec.unschedulable)",
                              f"kubectl uncordon {name} when its maintenance is over", warn=True))
        res = gpu_resources(node.status.allocatable)
        cap = gpu_resources(node.status.capacity)
        if res:
            shown = ", ".join(f"{n} {r}" for r, n in sorted(res.items()))
            out.append(_check("cluster.gpu-allocatable", name, True, f"allocatable: {shown}"))
        elif cap:
            shown = ", ".join(f"{n} {r}" for r, n in sorted(cap.items()))
            out.append(_check("cluster.gpu-allocatable", name, False,
                              f"GPUs in capacity ({shown}) but none allocatable: the device plugin reports them "
                              "unhealthy", "see the device plugin's log on the node (XID errors? driver reloaded?) "
                              "and the node layer's findings; drain and reset the GPU or reboot the node"))
        else:
            out.append(_check("cluster.gpu-allocatable", name, False,
                              f"no {GPU}, {MIG_PREFIX}* or {VCUDA_CORE} advertised",
                              "the device plugin is not running on this node: check the operator's "
                              "nvidia-device-plugin-daemonset pod there (node labelled "
                              "nvidia.com/gpu.deploy.device-plugin? driver and toolkit ready?), or with sharing.mode "
                              "gpumanager the gpu-manager pod (node labelled nvidia-device-enable=enable?)"))
    return out


def wait_clusterpolicy(custom: Any, timeout: float, progress: Callable[[str], None] | None = None) -> None:
    """Wait up to timeout seconds until every ClusterPolicy reports status.state ready (the operator deploys its
    operands after helm's wait is over). Returns at once without a ClusterPolicy or its API (404); one still not
    ready then is for operator_checks() to report."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            listed: Any = custom.list_cluster_custom_object("nvidia.com", "v1", "clusterpolicies")
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        waiting = [f"{cp['metadata']['name']} ({(cp.get('status') or {}).get('state') or 'no state yet'})"
                   for cp in listed["items"] if (cp.get("status") or {}).get("state") != "ready"]
        if not waiting or time.monotonic() >= deadline:
            if said and progress:
                progress("cluster: ClusterPolicy " + (", ".join(waiting) + " still not ready" if waiting else "ready"))
            return
        if not said and progress:
            progress(f"cluster: waiting up to {timeout:.0f}s for the operator to report ClusterPolicy "
                     f"{', '.join(waiting)} ready")
        said = True
        time.sleep(2)


def operator_checks(core: Any, custom: Any, namespace: str, registry_host: str,
                    pull_secret: str | None) -> list[Check]:
    """The GPU Operator as a whole (node column '(cluster)'). Skipped when no ClusterPolicy exists."""
    from kubernetes.client.exceptions import ApiException

    try:
        policies = custom.list_cluster_custom_object("nvidia.com", "v1", "clusterpolicies")["items"]
    except ApiException as exc:
        if exc.status == 404:
            policies = []
        else:
            raise
    if not policies:
        return [Check(LAYER, "cluster.operator", CLUSTER, "skip",
                      "no ClusterPolicy in the cluster: the GPU Operator is not installed (apply --skip-operator?)")]
    out = []
    for cp in policies:
        state = (cp.get("status") or {}).get("state")
        name = cp["metadata"]["name"]
        if state == "ready":
            out.append(_check("cluster.clusterpolicy-ready", CLUSTER, True, f"ClusterPolicy {name}: state ready"))
        else:
            conds = [f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}".strip()
                     for c in (cp.get("status") or {}).get("conditions", []) if c.get("status") != "True"
                     or c.get("type") == "Error"]
            out.append(_check("cluster.clusterpolicy-ready", CLUSTER, False,
                              f"ClusterPolicy {name}: state {state or 'unset'}"
                              + (f" ({'; '.join(conds)})" if conds else ""),
                              f"kubectl -n {namespace} get pods: the component that is not Running names the "
                              "failing stage (driver, toolkit, device plugin, validator)"))
    pods = core.list_namespaced_pod(namespace).items
    bad, foreign = [], []
    for p in pods:
        phase = p.status.phase
        statuses = (p.status.init_container_statuses or []) + (p.status.container_statuses or [])
        waiting = [f"{s.name}: {s.state.waiting.reason}" + (f" ({s.state.waiting.message})"
                                                             if s.state.waiting.message else "")
                   for s in statuses if s.state and s.state.waiting and s.state.waiting.reason]
        if phase not in ("Running", "Succeeded") or (phase == "Running" and waiting):
            node = p.spec.node_name or "unscheduled"
            bad.append(f"{p.metadata.name} on {node}: {phase}" + (f", {'; '.join(waiting)}" if waiting else ""))
        for c in (p.spec.init_containers or []) + (p.spec.containers or []):
            if not (c.image or "").startswith(registry_host + "/"):
                foreign.append(f"{p.metadata.name}/{c.name}: {c.image}")
    out.append(_check("cluster.operator-pods", CLUSTER, not bad,
                      f"{len(pods)} pods in {namespace} healthy" if not bad else
                      f"{len(bad)} of {len(pods)} pods in {namespace} not healthy: " + "; ".join(bad[:10]),
                      f"kubectl -n {namespace} describe pod <pod>; kubectl -n {namespace} logs <pod> --all-containers"))
    out.append(_check("cluster.operator-images", CLUSTER, not foreign,
                      f"every image of the {len(pods)} pods comes from {registry_host}" if not foreign else
                      f"{len(foreign)} container(s) pull from outside {registry_host}: " + "; ".join(foreign[:10]),
                      "render and install again with this site file (gpu-install operator install): every image "
                      "is rewritten to the site registry; an air-gapped cluster cannot pull the others"))
    if pull_secret:
        try:
            core.read_namespaced_secret(pull_secret, namespace)
            out.append(_check("cluster.pull-secret", CLUSTER, True, f"Secret {namespace}/{pull_secret} present"))
        except ApiException as exc:
            if exc.status != 404:
                raise
            out.append(_check("cluster.pull-secret", CLUSTER, False, f"Secret {namespace}/{pull_secret} missing",
                              "gpu-install operator install creates it from the site's registry credentials"))
    return out


def count_checks(node_objs: dict[str, Any], facts: dict[str, Any], replicas: int = 0, rename: bool = False,
                 method: str = "time-slicing replicas", resource: str | None = None) -> list[Check]:
    """Per GPU node the node layer read (facts: node -> NvidiaSmi): the device plugin advertises as many GPUs as
    nvidia-smi counted (x the sharing replicas, time-slicing or MPS; nvidia.com/gpu.shared when renamed), and GFD's
    labels, where present, agree (nvidia.com/gpu.count, nvidia.com/gpu.product). Nodes with MIG on are the MIG
    layer's."""
    out = []
    shared = replicas > 1
    resource = resource or (f"{GPU}.shared" if shared and rename else GPU)
    for name, smi in sorted(facts.items()):
        node = node_objs.get(name)
        if node is None or not smi.gpus:
            continue
        if any(g.mig_current for g in smi.gpus):
            continue
        n = len(smi.gpus)
        want = n * (replicas if shared else 1)
        try:
            have = int((node.status.capacity or {}).get(resource, "0"))
        except ValueError:
            have = 0
        times = f" x {replicas} {method}" if shared else ""
        out.append(_check("cluster.gpu-count", name, have == want,
                          f"{have} {resource} in capacity, nvidia-smi counts {n} GPU(s){times}" if have != want else
                          f"{have} {resource} = {n} GPU(s){times}",
                          "the device plugin sees other GPUs than the driver: restart its pod on the node; with "
                          "sharing, check devicePlugin.timeSlicing / devicePlugin.mps in the site file against the "
                          "plugin's config"))
        labels = node.metadata.labels or {}
        problems = []
        if labels.get("nvidia.com/gpu.count") not in (None, str(n)):
            problems.append(f"nvidia.com/gpu.count={labels['nvidia.com/gpu.count']}")
        product = smi.gpus[0].product_name
        label = labels.get("nvidia.com/gpu.product")
        if label and product:
            base = label.removesuffix("-SHARED").split("-MIG-")[0]
            if base != product.replace(" ", "-"):
                problems.append(f"nvidia.com/gpu.product={label}")
        if problems:
            out.append(_check("cluster.gfd-labels", name, False,
                              f"GFD labels disagree with nvidia-smi ({n} x {product}): {', '.join(problems)}",
                              "restart the gpu-feature-discovery pod on the node; labels from another GPU mean the "
                              "node was re-imaged or its GPUs swapped", warn=True))
    return out
