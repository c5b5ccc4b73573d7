"""GPU sharing by a component of its own: sharing.mode gpumanager (tkestack GPUManager + gpu-quota-admission).

One place for what the mode means, read by the plan and the stages:

- images(): the two pinned images (values/sharing/gpumanager.yaml, site overrides) → Plan.images, so they are in
  `gpu-install images`, the mirror plan and apply's registry check like the operator's;
- extenders(): the site's scheduler.extenders plus gpu-quota-admission's (filterVerb predicates, plain HTTP, full
  Node objects, managing tencent.com/vcuda-core and -memory; last, as upstream asks) → the scheduler_policy role;
- conflicts(): site combinations where two things would hand out the same GPUs or break the isolation (the
  operator's NVIDIA device plugin, a toolkit that makes nvidia the default runtime, time-slicing/MPS, MIG) → exit 3;
  cluster_conflicts(): the same seen in the cluster (GPUs already advertised by something else; docker on 1.24+);
- chart_values() + install()/uninstall(): the Helm release of charts/gpu-manager (our chart: DaemonSet, Deployment,
  Service, ConfigMap, least-privilege RBAC), the pull Secret in its namespace, and the node label
  nvidia-device-enable=enable on the GPU nodes gpu-manager runs on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.config import Extender, ManagedResource, Site
from installer.errors import ConfigError, PreflightError

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.plan import Plan

GPUMANAGER = "gpumanager"
RELEASE = "gpu-manager"  # Helm release and chart name
NODE_LABEL = ("nvidia-device-enable", "enable")  # gpu-manager's DaemonSet selects these nodes
VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEMORY = "tencent.com/vcuda-memory"
ADMISSION = "gpu-quota-admission"
ADMISSION_PORT = 3456
MANAGER_COMPONENT, ADMISSION_COMPONENT = "gpuManager", "gpuQuotaAdmission"  # names in the image list
RUNTIME_ENDPOINTS = {"containerd": "/var/run/containerd/containerd.sock", "docker": "/var/run/dockershim.sock"}
Progress = Callable[[str], None]


def enabled(site: Site) -> bool:
    return site.sharing.mode == GPUMANAGER


@lru_cache(maxsize=4)
def _pins(path: str) -> dict[str, dict[str, str]]:
    from installer.config import read_yaml

    doc = read_yaml(Path(path), what="sharing image pins")
    return {k: {f: str(v) for f, v in (doc.get(k) or {}).items()} for k in ("manager", "admission")}


def pins() -> dict[str, dict[str, str]]:
    from installer import content

    return _pins(str(content.sharing_pins_file(GPUMANAGER)))


def sources(site: Site) -> dict[str, str]:
    """component -> upstream image reference (pins, site overrides per field)."""
    g = site.sharing.gpumanager
    out = {}
    for comp, key, over in ((MANAGER_COMPONENT, "manager", g.manager), (ADMISSION_COMPONENT, "admission", g.admission)):
        pin = pins()[key]
        repo, image, version = over.repository or pin["repository"], over.image or pin["image"], \
            over.version or pin["version"]
        out[comp] = f"{repo}/{image}{'@' if version.startswith('sha256:') else ':'}{version}"
    return out


def images(site: Site) -> list[Image]:
    """The mode's images, source -> destination in the site registry (none when sharing is off)."""
    from installer.artifacts import Image
    from installer.render.values import destination_repository

    if not enabled(site):
        return []
    out = []
    for comp, src in sources(site).items():
        sep = "@" if "@" in src else ":"
        repo, _, ref = src.rpartition(sep)
        repo_path, _, _name = repo.rpartition("/")
        out.append(Image(src, f"{destination_repository(repo_path, site.registry)}/{_name}{sep}{ref}", comp))
    return out


def destinations(site: Site) -> dict[str, str]:
    return {i.component: i.destination for i in images(site)}


def extender_url(site: Site) -> str:
    g = site.sharing.gpumanager
    return g.extenderUrl or f"http://{ADMISSION}.{g.namespace}.svc:{ADMISSION_PORT}/scheduler"


def extender(site: Site) -> Extender:
    """gpu-quota-admission as kube-scheduler's extender: POST <url>/predicates with whole Node objects (it reads
    them: nodeCacheCapable false), plain HTTP, for pods asking the vcuda resources."""
    return Extender(urlPrefix=extender_url(site), filterVerb="predicates", enableHTTPS=False, nodeCacheCapable=False,
                    managedResources=[ManagedResource(name=VCUDA_CORE), ManagedResource(name=VCUDA_MEMORY)])


def extenders(site: Site) -> list[Extender]:
    """Every extender the scheduler_policy role writes: the site's, then gpu-quota-admission's (upstream: keep it
    the last one). A site entry at the same URL is refused (it would be consulted twice)."""
    own = list(site.scheduler.extenders)
    if not enabled(site):
        return own
    ours = extender(site)
    for i, e in enumerate(own):
        if e.urlPrefix.rstrip("/") == ours.urlPrefix.rstrip("/"):
            raise ConfigError(f"scheduler.extenders.{i}: {e.urlPrefix} is gpu-quota-admission's URL, which "
                              "sharing.mode gpumanager already wires into kube-scheduler",
                              hint=f"drop scheduler.extenders.{i} (or point sharing.gpumanager.extenderUrl elsewhere)")
    return [*own, ours]


def runtime_endpoint(site: Site) -> str:
    return site.sharing.gpumanager.runtimeEndpoint or RUNTIME_ENDPOINTS[site.runtime]


def runtime_dir(endpoint: str) -> str:
    """The socket's directory when /var/run (mounted whole) does not hold it, else ''."""
    parent = str(Path(endpoint).parent)
    return "" if any(parent == p or parent.startswith(p + "/") for p in ("/var/run", "/run")) else parent


def chart_values(site: Site) -> dict[str, Any]:
    """charts/gpu-manager's values for this site."""
    g = site.sharing.gpumanager
    dest = destinations(site)
    ps = site.registry.pullSecret
    ep = runtime_endpoint(site)
    return {
        "images": {"manager": dest[MANAGER_COMPONENT], "admission": dest[ADMISSION_COMPONENT]},
        "imagePullPolicy": "IfNotPresent",
        "imagePullSecrets": [ps.name] if ps else [],
        "logLevel": g.logLevel,
        "manager": {"nodeSelector": {NODE_LABEL[0]: NODE_LABEL[1]}, "cgroupDriver": g.cgroupDriver,
                    "runtimeEndpoint": ep, "runtimeDir": runtime_dir(ep), "metricsPort": 5678},
        "admission": {"port": ADMISSION_PORT, "config": {
            "QuotaConfigMapName": g.quotaConfigMapName, "QuotaConfigMapNamespace": g.quotaConfigMapNamespace,
            "GPUModelLabel": g.gpuModelLabel, "GPUPoolLabel": g.gpuPoolLabel}},
    }


def chart_dir() -> Path:
    from installer import content

    return content.chart_dir(RELEASE)


# ---------------------------------------------------------------- conflicts (exit 3, before any host is touched)


def conflicts(plan: Plan) -> list[str]:
    """What in the site contradicts sharing.mode gpumanager, each with its fix (empty: none, or sharing off)."""
    site = plan.site
    if not enabled(site):
        return []
    out = []
    dp = plan.components.get("devicePlugin")
    if dp is not None and plan.deployed(dp):
        out.append("the GPU Operator's NVIDIA device plugin would run on the GPU nodes too and advertise the same GPUs "
                   "as nvidia.com/gpu beside gpu-manager's tencent.com/vcuda-*: set components.devicePlugin.enabled: "
                   "false")
    tk = plan.components.get("toolkit")  # toolkit.mode decides the chart's toolkit.enabled
    if site.toolkit.mode == "operator" and tk is not None and plan.deployed(tk):
        out.append("toolkit.mode operator: the operator's toolkit makes nvidia the default runtime, and every "
                   "container with NVIDIA_VISIBLE_DEVICES (most CUDA images) would then see all GPUs past "
                   "gpu-manager's limits (it needs plain runc): set toolkit.mode: host (gpu-install's roles install "
                   "the toolkit and keep runc the default runtime on GPUManager sites)")
    method, replicas, _ = site.devicePlugin.sharing()
    if replicas > 1:
        out.append(f"devicePlugin.{method}.replicas {replicas}: time-slicing and MPS are the NVIDIA device plugin's, "
                   "which does not run with gpu-manager: set the replicas to 0")
    migs = sorted({a.node for a in plan.mig})
    if site.mig.config or migs:
        where = f" (nodes {', '.join(migs)})" if migs else ""
        out.append(f"a MIG layout is set{where}: gpu-manager shares whole GPUs and does not handle MIG devices: "
                   "drop mig.config / gpu_install_mig_config")
    return out


def check(plan: Plan) -> None:
    found = conflicts(plan)
    if found:
        raise PreflightError("sharing.mode gpumanager conflicts with the site:\n    " + "\n    ".join(found),
                             hint="fix the site file; nothing was changed on any host")


def cluster_conflicts(plan: Plan, client: Any, operator_namespace: str) -> list[str]:
    """Read-only: the cluster's view. GPU nodes where something other than the GPU Operator's device plugin (which
    this apply turns off) advertises nvidia.com/gpu; the docker runtime on Kubernetes 1.24+ (dockershim, which
    gpu-manager's CRI client speaks to, is gone there)."""
    from kubernetes import client as k

    from installer import kube
    from installer.config import kubernetes_minor

    site = plan.site
    if not enabled(site):
        return []
    out = []
    version = kube.server_version(client)
    if site.runtime == "docker" and kubernetes_minor(version) >= (1, 24) and not site.sharing.gpumanager.runtimeEndpoint:
        out.append(f"runtime docker on Kubernetes {version}: the dockershim socket gpu-manager talks CRI to is gone "
                   "since 1.24: set sharing.gpumanager.runtimeEndpoint to your CRI socket (cri-dockerd) or use "
                   "containerd")
    core: Any = k.CoreV1Api(client)
    names = [n.node_name for n in plan.nodes]
    objs = {n.metadata.name: n for n in kube._call("list the nodes", lambda: core.list_node().items)}
    for name in names:
        node = objs.get(name)
        if node is None:
            continue
        try:
            gpus = int((node.status.allocatable or {}).get("nvidia.com/gpu", "0"))
        except ValueError:
            gpus = 0
        if gpus <= 0:
            continue
        selector = f"spec.nodeName={name}"
        pods = kube._call(f"list the pods on {name}",
                          lambda: core.list_pod_for_all_namespaces(field_selector=selector).items)  # noqa: B023
        operator_plugin = any(p.metadata.namespace == operator_namespace and "device-plugin" in p.metadata.name
                              for p in pods)
        if operator_plugin:
            continue  # the operator's: this apply disables it (components.devicePlugin.enabled false)
        others = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if "device-plugin" in p.metadata.name)
        by = f"pod(s) {', '.join(others)}" if others else "a device plugin outside Kubernetes (no pod of it on the node)"
        out.append(f"node {name} already advertises {gpus} nvidia.com/gpu, by {by}: gpu-manager would hand out the "
                   "same GPUs again as tencent.com/vcuda-*: remove that device plugin from the node first")
    return out


def check_cluster(plan: Plan, client: Any, operator_namespace: str) -> None:
    found = cluster_conflicts(plan, client, operator_namespace)
    if found:
        raise PreflightError("sharing.mode gpumanager conflicts with the cluster:\n    " + "\n    ".join(found),
                             hint="fix these first; nothing was changed on any host")


# ---------------------------------------------------------------- the sharing stage


@dataclass
class Report:
    release: str
    namespace: str
    changed: bool
    revision: int | None
    labelled: list[str] = field(default_factory=list)
    secret: str = "none"
    seconds: float = 0.0

    def lines(self) -> list[str]:
        return [f"release {self.release} in {self.namespace}: revision {self.revision}"
                + (" (changed)" if self.changed else " (unchanged)"),
                f"label {NODE_LABEL[0]}={NODE_LABEL[1]} set on {len(self.labelled)} node(s)"
                + (f" ({', '.join(self.labelled)})" if self.labelled else ""),
                f"done in {self.seconds:.1f}s"]


def install(plan: Plan, kubeconfig: Path, timeout: float = 300, wait: bool = True,
            progress: Progress | None = None) -> Report:
    """Pull Secret in the namespace, `helm upgrade --install` of charts/gpu-manager, then the node label on every
    GPU node of the plan (gpu-manager's DaemonSet starts there)."""
    from installer import helm, kube

    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    site = plan.site
    ns = site.sharing.gpumanager.namespace
    client = kube.api_client(kubeconfig)
    kube.ensure_namespace(client, ns, timeout=timeout)
    secret = "none"
    if site.registry.pullSecret:
        secret = kube.ensure_secret(client, kube.pull_secret_body(site.registry, ns))
        say(f"pull secret {ns}/{site.registry.pullSecret.name}: {secret}")
    say(f"helm upgrade --install {RELEASE} {chart_dir()} -n {ns}" + (f" (wait up to {timeout:.0f}s)" if wait else ""))
    # no --wait on helm: gpu-manager's pods only start once the nodes are labelled, below; rollout() waits then
    state = helm.install_or_upgrade(chart_dir(), RELEASE, ns, chart_values(site), kubeconfig, timeout=timeout,
                                    wait=False)
    labelled = []
    for node in (n.node_name for n in plan.nodes):
        current = kube.node_labels(client, [node]).get(node)
        if current is None:
            raise ConfigError(f"no Node {node} in the cluster for GPU host {node}",
                              hint="join the node, or set gpu_install_node_name to its Kubernetes name")
        if current.get(NODE_LABEL[0]) != NODE_LABEL[1]:
            kube.set_node_label(client, node, *NODE_LABEL)
            labelled.append(node)
    if wait:
        rollout(client, ns, [n.node_name for n in plan.nodes], timeout=max(30.0, timeout - (time.monotonic() - t0)),
                progress=say)
    return Report(RELEASE, ns, bool(state.changed) or bool(labelled), state.revision, labelled, secret,
                  time.monotonic() - t0)


def preview(plan: Plan, kubeconfig: Path) -> tuple[bool, str]:
    """apply --check: (would change, what) for the release and the node labels, read-only."""
    from installer import helm, kube

    site = plan.site
    ns = site.sharing.gpumanager.namespace
    rp = helm.plan_release(chart_dir(), RELEASE, ns, chart_values(site), kubeconfig)
    labels = kube.node_labels(kube.api_client(kubeconfig), [n.node_name for n in plan.nodes])
    todo = sorted(n for n, ls in labels.items() if ls is None or ls.get(NODE_LABEL[0]) != NODE_LABEL[1])
    what = f"release {RELEASE} in {ns}: {'would ' + rp.action if rp.action != 'unchanged' else 'unchanged'}; " + (
        f"would label {', '.join(todo)} {NODE_LABEL[0]}={NODE_LABEL[1]}" if todo else "node labels in place")
    return rp.action != "unchanged" or bool(todo), what


def rollout(client: Any, namespace: str, nodes: list[str], timeout: float, progress: Progress,
            poll: float = 1.0) -> None:
    """Wait until gpu-manager runs on every labelled node and gpu-quota-admission is available; a pod that cannot
    pull its image or keeps crashing ends the wait with the kubelet's message."""
    from kubernetes import client as k

    from installer.errors import ClusterError

    core: Any = k.CoreV1Api(client)
    apps: Any = k.AppsV1Api(client)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/part-of=gpu-install-sharing").items
        running = {p.spec.node_name for p in pods if p.metadata.labels.get("app.kubernetes.io/name") == RELEASE
                   and p.status.phase == "Running"}
        dep = apps.read_namespaced_deployment(ADMISSION, namespace)
        ready = (dep.status.available_replicas or 0) >= 1
        missing = sorted(set(nodes) - running)
        stuck = []
        for p in pods:
            for s in (p.status.container_statuses or []):
                w = s.state.waiting if s.state else None
                if w and w.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                                      "CreateContainerConfigError"):
                    stuck.append(f"{p.metadata.name} on {p.spec.node_name}: {w.reason} {w.message or ''}".strip())
        if not missing and ready:
            progress(f"gpu-manager running on {len(nodes)} node(s), {ADMISSION} available")
            return
        state = f"gpu-manager missing on {', '.join(missing) or 'none'}; {ADMISSION} {'ready' if ready else 'not ready'}"
        if state != last:
            progress(state)
            last = state
        if time.monotonic() > deadline or any("ImagePull" in s or "InvalidImage" in s for s in stuck):
            raise ClusterError(f"sharing: {state}" + (f" ({'; '.join(stuck[:5])})" if stuck else "")
                               + f" after {timeout - max(0.0, deadline - time.monotonic()):.0f}s",
                               hint=f"kubectl -n {namespace} get pods -l app.kubernetes.io/part-of=gpu-install-sharing "
                                    "-o wide; images: gpu-install mirror push; the pull Secret")
        time.sleep(poll)


def uninstall(plan: Plan, kubeconfig: Path, timeout: float = 300, progress: Progress | None = None) -> list[str]:
    """The Helm release, the node label from the GPU nodes, the pull Secret (only if gpu-install made it)."""
    from installer import helm, kube

    say = progress or (lambda _m: None)
    site = plan.site
    ns = site.sharing.gpumanager.namespace
    client = kube.api_client(kubeconfig)
    done = []
    if helm.uninstall(RELEASE, ns, kubeconfig, timeout=timeout):
        done.append(f"Helm release {RELEASE} in {ns} removed")
    labels = kube.node_labels(client, [n.node_name for n in plan.nodes])
    unlabelled = [n for n, ls in labels.items() if ls is not None and NODE_LABEL[0] in ls]
    for node in unlabelled:
        kube.set_node_label(client, node, NODE_LABEL[0], None)
    if unlabelled:
        done.append(f"label {NODE_LABEL[0]} removed from {', '.join(sorted(unlabelled))}")
    ps = site.registry.pullSecret
    if ps and ns != site.operator.namespace and kube.delete_secret_if_ours(client, ns, ps.name):
        done.append(f"pull Secret {ns}/{ps.name} removed")
    for line in done:
        say(line)
    return done


def release_state(site: Site, kubeconfig: Path) -> Mapping[str, Any] | None:
    from installer import helm

    st = helm.release_state(RELEASE, site.sharing.gpumanager.namespace, kubeconfig)
    return None if st is None else {"revision": st.revision, "status": st.status}
