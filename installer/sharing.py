"""GPU sharing by a component of its own: sharing.mode hami (Project-HAMi) and gpumanager (tkestack GPUManager +
gpu-quota-admission), and dynamic MIG partitioning by nos (mig.dynamic nos; nebuly-ai/nos). At most one of them is
active on a site (they exclude each other: conflicts()); kind() says which, and the sharing stage installs it.

nos: its chart from the site's chart repository (values: every image from the site registry, shareTelemetry off;
the site's pull Secret added to the release's ServiceAccounts, the chart having no value for it), the node label
nos.nebuly.com/gpu-partitioning=mig on the GPU nodes taking part (not those with gpu_install_mig_dynamic false),
where the mig_mode role turned MIG mode on before; the GPU Operator runs with mig.strategy mixed and mig-manager off
(installer.render.values). Needs Kubernetes 1.23+ and cert-manager (cluster_conflicts()).

One place for what the modes mean, read by the plan and the stages (gpumanager below; hami the same way with
HAMi's chart from the site's chart repository, its own scheduler instead of an extender in kube-scheduler, the node
label gpu=on, nvidia as the default runtime):

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
from collections.abc import Callable
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
HAMI = "hami"
NOS = "nos"
NOS_LABEL = ("nos.nebuly.com/gpu-partitioning", "mig")  # nos' mig-agent runs there and partitions the GPUs
NOS_MIN_KUBERNETES = (1, 23)
RELEASE = "gpu-manager"  # Helm release and chart name
HAMI_LABEL = ("gpu", "on")  # HAMi's device plugin DaemonSet selects these nodes (devicePlugin.nvidiaNodeSelector)
NODE_LABEL = ("nvidia-device-enable", "enable")  # gpu-manager's DaemonSet selects these nodes
VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEMORY = "tencent.com/vcuda-memory"
ADMISSION = "gpu-quota-admission"
ADMISSION_PORT = 3456
MANAGER_COMPONENT, ADMISSION_COMPONENT = "gpuManager", "gpuQuotaAdmission"  # names in the image list
RUNTIME_ENDPOINTS = {"containerd": "/var/run/containerd/containerd.sock", "docker": "/var/run/dockershim.sock"}
Progress = Callable[[str], None]


def enabled(site: Site) -> bool:
    """sharing.mode gpumanager (gpu-install's own chart, extender in kube-scheduler)."""
    return site.sharing.mode == GPUMANAGER


def hami(site: Site) -> bool:
    return site.sharing.mode == HAMI


def nos(site: Site) -> bool:
    """mig.dynamic nos, and no sharing mode (a sharing mode with it is refused by conflicts())."""
    return site.mig.dynamic == NOS and site.sharing.mode == "none"


def kind(site: Site) -> str | None:
    """What the sharing stage installs: gpumanager, hami, nos, or None."""
    if site.sharing.mode in (GPUMANAGER, HAMI):
        return site.sharing.mode
    return NOS if nos(site) else None


def active(site: Site) -> bool:
    """A component with a stage of its own (hami, gpumanager or nos)."""
    return kind(site) is not None


def what(site: Site) -> str:
    """How the site names it: sharing.mode X or mig.dynamic nos."""
    return f"mig.dynamic {NOS}" if nos(site) else f"sharing.mode {site.sharing.mode}"


def namespace(site: Site) -> str:
    if nos(site):
        return site.mig.nos.namespace
    return site.sharing.hami.namespace if hami(site) and site.sharing.hami else site.sharing.gpumanager.namespace


def release_name(site: Site) -> str:
    if nos(site):
        return site.mig.nos.releaseName
    return site.sharing.hami.releaseName if hami(site) and site.sharing.hami else RELEASE


def node_label(site: Site) -> tuple[str, str]:
    return NOS_LABEL if nos(site) else HAMI_LABEL if hami(site) else NODE_LABEL


def stage_nodes(plan: Plan) -> list[str]:
    """The Kubernetes Nodes the stage labels: every GPU node, under nos those taking part (gpu_install_mig_dynamic)."""
    return [n.node_name for n in plan.nodes if not nos(plan.site) or n.mig_dynamic]


@lru_cache(maxsize=4)
def pinned(mode: str) -> dict[str, Any]:
    """values/sharing/<mode>.yaml as shipped (read once): the mode's pinned images (and HAMi's chart)."""
    from installer import content
    from installer.config import read_yaml

    path = content.sharing_pins_file(mode)
    doc = read_yaml(path, what=f"{mode} pins")
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a mapping", hint="reinstall gpu-install: its shipped data is damaged")
    return doc


def hami_chart(site: Site) -> tuple[str, str, str]:
    """(name, version, upstream repository) of the HAMi chart."""
    c = pinned(HAMI)["chart"]
    h = site.sharing.hami
    return c["name"], (h.version if h and h.version else c["version"]), c["repository"]


def nos_chart(site: Site) -> tuple[str, str, str]:
    """(name, version, upstream repository) of the nos chart."""
    c = pinned(NOS)["chart"]
    return c["name"], (site.mig.nos.version or c["version"]), c["repository"]


def nos_sources(site: Site) -> dict[str, str]:
    """nos' images (component -> upstream reference), tagged with the chart's version (its appVersion) but the
    kube-rbac-proxy sidecar, pinned apart."""
    _name, version, _repo = nos_chart(site)
    out = {}
    for key, img in pinned(NOS)["images"].items():
        out[f"nos.{key}"] = f"{img['repository']}/{img['image']}:{img.get('version') or version}"
    return out


def hami_sources(site: Site) -> dict[str, str]:
    """HAMi's images (component -> upstream reference): hami (the chart's appVersion, v<chart version>),
    kube-scheduler at the cluster's version, the certgen image the chart picks for that Kubernetes minor."""
    from installer.config import kubernetes_minor

    h = site.sharing.hami
    assert h is not None
    imgs = pinned(HAMI)["images"]
    _name, version, _repo = hami_chart(site)
    legacy = kubernetes_minor(h.kubernetesVersion) < (1, 22)
    cert = imgs["certgenLegacy" if legacy else "certgen"]
    return {"hami": f"{imgs['hami']['repository']}/{imgs['hami']['image']}:v{version}",
            "hami.kubeScheduler": f"{imgs['kubeScheduler']['repository']}/{imgs['kubeScheduler']['image']}:"
                                  f"{h.kubernetesVersion}",
            "hami.certgen": f"{cert['repository']}/{cert['image']}:{cert['version']}"}


def sources(site: Site) -> dict[str, str]:
    """component -> upstream image reference (pins, site overrides per field)."""
    g = site.sharing.gpumanager
    out = {}
    for comp, key, over in ((MANAGER_COMPONENT, "manager", g.manager), (ADMISSION_COMPONENT, "admission", g.admission)):
        pin = pinned(GPUMANAGER)[key]
        repo, image, version = over.repository or pin["repository"], over.image or pin["image"], \
            over.version or pin["version"]
        out[comp] = f"{repo}/{image}{'@' if str(version).startswith('sha256:') else ':'}{version}"
    return out


def images(site: Site) -> list[Image]:
    """The mode's images, source -> destination in the site registry (none when sharing is off)."""
    from installer.artifacts import Image
    from installer.render.values import destination_ref

    k = kind(site)
    if k is None:
        return []
    found = {HAMI: hami_sources, NOS: nos_sources, GPUMANAGER: sources}[k](site)
    return [Image(src, destination_ref(src, site.registry), comp) for comp, src in found.items()]


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


def _split_ref(dest: str, site: Site) -> dict[str, str]:
    """A site-registry reference as HAMi's image values: {registry, repository, tag}."""
    base = site.registry.host + (f"/{site.registry.prefix}" if site.registry.prefix else "")
    repo, _, tag = dest.rpartition(":")
    assert repo.startswith(base + "/"), (repo, base)
    return {"registry": base, "repository": repo[len(base) + 1:], "tag": tag}


def hami_values(site: Site) -> dict[str, Any]:
    """The HAMi chart's values (layout of 2.7.0+): every image from the site registry (global.imageRegistry and each
    image's repository/tag, so that both registry layouts work), the pull Secret, the scheduler's kube-scheduler at
    the cluster's version, the device plugin's split and scaling, its node selector gpu=on."""
    h = site.sharing.hami
    assert h is not None
    dest = destinations(site)
    ps = site.registry.pullSecret
    base = site.registry.host + (f"/{site.registry.prefix}" if site.registry.prefix else "")
    img = _split_ref(dest["hami"], site)
    cert = _split_ref(dest["hami.certgen"], site)
    return {
        "global": {"imageRegistry": base, "imagePullSecrets": [ps.name] if ps else [], "imageTag": img["tag"]},
        "scheduler": {
            "kubeScheduler": {"image": _split_ref(dest["hami.kubeScheduler"], site)},
            "extender": {"image": dict(img)},
            # the chart uses imageNew from Kubernetes 1.22, image below: both point at the one mirrored
            "patch": {"image": dict(cert), "imageNew": dict(cert)},
        },
        "devicePlugin": {"image": dict(img), "monitor": {"image": dict(img)},
                         "deviceSplitCount": h.deviceSplitCount, "deviceMemoryScaling": h.deviceMemoryScaling,
                         "deviceCoreScaling": h.deviceCoreScaling,
                         "nvidiaNodeSelector": {HAMI_LABEL[0]: HAMI_LABEL[1]}},
    }


def nos_values(site: Site) -> dict[str, Any]:
    """The nos chart's values: each image's repository and tag in the site registry, telemetry off (its post-install
    Pod would post to nebuly.cloud from an image nobody mirrored)."""
    dest = destinations(site)

    def image(key: str) -> dict[str, str]:
        repo, _, tag = dest[f"nos.{key}"].rpartition(":")
        return {"repository": repo, "tag": tag}

    proxy = image("kubeRbacProxy")
    return {
        "shareTelemetry": False,
        "operator": {"image": image("operator"), "kubeRbacProxy": {"image": dict(proxy)}},
        "scheduler": {"image": image("scheduler")},
        "gpuPartitioner": {"image": image("gpuPartitioner"), "migAgent": {"image": image("migAgent")},
                           "gpuAgent": {"image": image("gpuAgent")}, "kubeRbacProxy": {"image": dict(proxy)}},
    }


def release_values(site: Site) -> dict[str, Any]:
    return nos_values(site) if nos(site) else hami_values(site) if hami(site) else chart_values(site)


def release_chart(site: Site) -> str | Path:
    """The chart the sharing stage installs: HAMi's from sharing.hami.chart, nos' from mig.nos.chart, else
    gpu-install's own gpu-manager."""
    if nos(site):
        if not site.mig.nos.chart:
            raise ConfigError("mig.dynamic nos: mig.nos.chart is not set, and apply installs nos from it",
                              hint="give the chart `gpu-install mirror push` printed (oci://<registry>/charts/nos:<v>) "
                                   "or the .tgz in the bundle; or pass --skip-operator to configure the nodes only")
        return site.mig.nos.chart
    if hami(site):
        h = site.sharing.hami
        assert h is not None
        if not h.chart:
            raise ConfigError("sharing.mode hami: sharing.hami.chart is not set, and apply installs HAMi from it",
                              hint="give the chart `gpu-install mirror push` printed (oci://<registry>/charts/hami:<v>) "
                                   "or the .tgz in the bundle; or pass --skip-operator to configure the nodes only")
        return h.chart
    return chart_dir()


def check_chart(site: Site) -> None:
    """The sharing stage's chart is there (exit 2 before any host): HAMi's sharing.hami.chart as a local path."""
    ref = release_chart(site)
    if isinstance(ref, str) and "://" not in ref and not Path(ref).exists():
        field_, chart = ("mig.nos.chart", "nos") if nos(site) else ("sharing.hami.chart", "hami")
        raise ConfigError(f"{field_} {ref}: no such file or directory",
                          hint=f"give the {chart}-<version>.tgz of the bundle (BUNDLE/charts/) or the oci:// reference "
                               "`gpu-install mirror push` printed")


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


def nos_conflicts(plan: Plan) -> list[str]:
    """What in the site contradicts mig.dynamic nos, each with its fix."""
    site = plan.site
    out = []
    if site.sharing.mode != "none":
        out.append(f"sharing.mode {site.sharing.mode} with mig.dynamic nos: {site.sharing.mode} shares whole GPUs, "
                   "nos cuts them into MIG devices; one node's GPUs cannot be both: drop one of them")
    static = sorted({a.node for a in plan.mig})
    if static:
        out.append(f"a static MIG layout (gpu_install_mig_config) is set for {', '.join(static)}: under mig.dynamic "
                   "nos mig-manager is off and nos makes the layouts: drop gpu_install_mig_config there (a node left "
                   "out of nos with gpu_install_mig_dynamic: false keeps whole GPUs)")
    dp = plan.components.get("devicePlugin")
    if dp is None or not plan.deployed(dp):
        out.append("components.devicePlugin.enabled: false: nos relies on the operator's device plugin (mig.strategy "
                   "mixed) to advertise the MIG devices it makes: leave the device plugin on")
    if site.driver.mode in ("operator", "precompiled"):
        out.append(f"driver.mode {site.driver.mode}: gpu-install turns MIG mode on with the host's nvidia-smi before "
                   "the operator starts, and with a driver container there is none on the host yet: use driver.mode "
                   "host, runfile or preinstalled")
    return out


def conflicts(plan: Plan) -> list[str]:
    """What in the site contradicts its sharing.mode or mig.dynamic, each with its fix (empty: none, or both off)."""
    site = plan.site
    if site.mig.dynamic == NOS:
        return nos_conflicts(plan)
    if not active(site):
        return []
    out = []
    dp = plan.components.get("devicePlugin")
    if dp is not None and plan.deployed(dp):
        other = ("HAMi's device plugin advertises them itself (nvidia.com/gpu split, nvidia.com/gpumem, gpucores)"
                 if hami(site) else "beside gpu-manager's tencent.com/vcuda-*")
        out.append("the GPU Operator's NVIDIA device plugin would run on the GPU nodes too and advertise the same GPUs "
                   f"as nvidia.com/gpu, {other}: set components.devicePlugin.enabled: false")
    tk = plan.components.get("toolkit")  # toolkit.mode decides the chart's toolkit.enabled
    if hami(site):
        if site.cdi.enabled is True:
            out.append("cdi.enabled: true: nvidia is then not the default runtime, and HAMi needs it to be (its "
                       "containers get no runtime class): leave cdi.enabled unset or false")
    elif site.toolkit.mode == "operator" and tk is not None and plan.deployed(tk):
        out.append("toolkit.mode operator: the operator's toolkit makes nvidia the default runtime, and every "
                   "container with NVIDIA_VISIBLE_DEVICES (most CUDA images) would then see all GPUs past "
                   "gpu-manager's limits (it needs plain runc): set toolkit.mode: host (gpu-install's roles install "
                   "the toolkit and keep runc the default runtime on GPUManager sites)")
    who = "HAMi" if hami(site) else "gpu-manager"
    method, replicas, _ = site.devicePlugin.sharing()
    if replicas > 1:
        out.append(f"devicePlugin.{method}.replicas {replicas}: time-slicing and MPS are the NVIDIA device plugin's, "
                   f"which does not run with {who}: set the replicas to 0")
    migs = sorted({a.node for a in plan.mig})
    if site.mig.config or migs:
        where = f" (nodes {', '.join(migs)})" if migs else ""
        out.append(f"a MIG layout is set{where}: {who} shares whole GPUs here (gpu-install does not drive MIG "
                   "under it): drop mig.config / gpu_install_mig_config")
    return out


def check(plan: Plan) -> None:
    found = conflicts(plan)
    if found:
        name = "mig.dynamic nos" if plan.site.mig.dynamic == NOS else f"sharing.mode {plan.site.sharing.mode}"
        raise PreflightError(f"{name} conflicts with the site:\n    "
                             + "\n    ".join(found), hint="fix the site file; nothing was changed on any host")


def cluster_conflicts(plan: Plan, client: Any, operator_namespace: str) -> list[str]:
    """Read-only: the cluster's view. GPU nodes where something other than the GPU Operator's device plugin (which
    this apply turns off) advertises nvidia.com/gpu; the docker runtime on Kubernetes 1.24+ (dockershim, which
    gpu-manager's CRI client speaks to, is gone there)."""
    from kubernetes import client as k

    from installer import kube
    from installer.config import kubernetes_minor

    site = plan.site
    if not active(site):
        return []
    if nos(site):
        return nos_cluster_conflicts(plan, client)
    out = []
    version = kube.server_version(client)
    h = site.sharing.hami
    if hami(site) and h is not None and version.split("+")[0].split("-")[0] != h.kubernetesVersion:
        out.append(f"sharing.hami.kubernetesVersion is {h.kubernetesVersion} but the cluster runs {version}: HAMi's "
                   "scheduler runs a kube-scheduler of the cluster's exact version, mirrored at that tag: set "
                   f"sharing.hami.kubernetesVersion: {version.split('+')[0].split('-')[0]}, mirror and push again")
    if enabled(site) and site.runtime == "docker" and kubernetes_minor(version) >= (1, 24) and not site.sharing.gpumanager.runtimeEndpoint:
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
        own = any(p.metadata.namespace == namespace(site) and p.metadata.name.startswith(release_name(site))
                  and "device-plugin" in p.metadata.name for p in pods)  # HAMi's own, from an earlier apply
        if operator_plugin or own:
            continue  # the operator's: this apply disables it (components.devicePlugin.enabled false)
        others = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if "device-plugin" in p.metadata.name)
        by = f"pod(s) {', '.join(others)}" if others else "a device plugin outside Kubernetes (no pod of it on the node)"
        again = "as tencent.com/vcuda-*" if enabled(site) else "through HAMi's device plugin"
        out.append(f"node {name} already advertises {gpus} nvidia.com/gpu, by {by}: {site.sharing.mode} would hand "
                   f"out the same GPUs again {again}: remove that device plugin from the node first")
    return out


def nos_cluster_conflicts(plan: Plan, client: Any) -> list[str]:
    """Read-only: Kubernetes 1.23+ (nos' scheduler), cert-manager's API (the operator's webhook certificate), and no
    static MIG layout label on a node nos is to manage."""
    from kubernetes import client as k

    from installer import kube
    from installer.config import kubernetes_minor
    from installer.mig import LABEL

    out = []
    version = kube.server_version(client)
    if kubernetes_minor(version) < NOS_MIN_KUBERNETES:
        out.append(f"the cluster runs Kubernetes {version}, and nos needs {NOS_MIN_KUBERNETES[0]}.{NOS_MIN_KUBERNETES[1]} "
                   "or newer (its scheduler is built on that kube-scheduler): upgrade the cluster, or use static "
                   "MIG layouts (mig.dynamic: none, mig.config)")
    groups: Any = k.ApisApi(client)
    served = {g.name: [v.version for v in g.versions]
              for g in kube._call("list the API groups", lambda: groups.get_api_versions().groups)}
    if "v1" not in served.get("cert-manager.io", []):
        out.append("the cluster serves no cert-manager.io/v1 API: nos' operator gets its webhook certificate from "
                   "cert-manager, and its pod does not start without it: install cert-manager first (its images "
                   "through the site registry too)")
    mine = stage_nodes(plan)
    labels = kube.node_labels(client, mine)
    for node in mine:
        value = (labels.get(node) or {}).get(LABEL)
        if value is not None:
            out.append(f"node {node} carries {LABEL}={value}, a static MIG layout: nos would change the layout under "
                       f"it: kubectl label node {node} {LABEL}- (or leave the node out of nos: "
                       "gpu_install_mig_dynamic: false)")
    return out


def check_cluster(plan: Plan, client: Any, operator_namespace: str) -> None:
    found = cluster_conflicts(plan, client, operator_namespace)
    if found:
        raise PreflightError(f"{what(plan.site)} conflicts with the cluster:\n    "
                             + "\n    ".join(found), hint="fix these first; nothing was changed on any host")


# ---------------------------------------------------------------- the sharing stage


def hami_fullname(site: Site) -> str:
    """The HAMi chart's name for its objects: the release name when it contains "hami", else <release>-hami."""
    rel = release_name(site)
    return rel if "hami" in rel else f"{rel}-hami"


def workloads(site: Site) -> tuple[str, str]:
    """(the DaemonSet that must run on every GPU node, the Deployment that must be available) of the mode."""
    if nos(site):
        rel = release_name(site)
        return f"{rel}-mig-agent", f"{rel}-gpu-partitioner"
    if hami(site):
        full = hami_fullname(site)
        return f"{full}-device-plugin", f"{full}-scheduler"
    return RELEASE, ADMISSION


@dataclass
class Report:
    release: str
    namespace: str
    changed: bool
    revision: int | None
    label: tuple[str, str]
    labelled: list[str] = field(default_factory=list)
    secret: str = "none"
    seconds: float = 0.0

    def lines(self) -> list[str]:
        return [f"release {self.release} in {self.namespace}: revision {self.revision}"
                + (" (changed)" if self.changed else " (unchanged)"),
                f"label {self.label[0]}={self.label[1]} set on {len(self.labelled)} node(s)"
                + (f" ({', '.join(self.labelled)})" if self.labelled else ""),
                f"done in {self.seconds:.1f}s"]


def install(plan: Plan, kubeconfig: Path, timeout: float = 300, wait: bool = True,
            progress: Progress | None = None) -> Report:
    """Pull Secret in the namespace, `helm upgrade --install` of the mode's chart (gpu-install's charts/gpu-manager,
    or HAMi's from sharing.hami.chart), then the mode's node label on every GPU node of the plan (its device plugin
    DaemonSet starts there), then a wait until that runs on every node and the scheduler part is available."""
    from installer import helm, kube

    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    site = plan.site
    ns, rel, label = namespace(site), release_name(site), node_label(site)
    chart = release_chart(site)
    client = kube.api_client(kubeconfig)
    kube.ensure_namespace(client, ns, timeout=timeout)
    secret = "none"
    if site.registry.pullSecret:
        secret = kube.ensure_secret(client, kube.pull_secret_body(site.registry, ns))
        say(f"pull secret {ns}/{site.registry.pullSecret.name}: {secret}")
    say(f"helm upgrade --install {rel} {chart} -n {ns}" + (f" (wait up to {timeout:.0f}s)" if wait else ""))
    # no --wait on helm: the device plugin's pods only start once the nodes are labelled, below; rollout() waits then
    state = helm.install_or_upgrade(chart, rel, ns, release_values(site), kubeconfig, timeout=timeout, wait=False)
    if nos(site) and site.registry.pullSecret:  # the chart has no imagePullSecrets value
        for line in service_account_secrets(client, ns, rel, site.registry.pullSecret.name):
            say(line)
    labelled = []
    for node in stage_nodes(plan):
        current = kube.node_labels(client, [node]).get(node)
        if current is None:
            raise ConfigError(f"no Node {node} in the cluster for GPU host {node}",
                              hint="join the node, or set gpu_install_node_name to its Kubernetes name")
        if current.get(label[0]) != label[1]:
            kube.set_node_label(client, node, *label)
            labelled.append(node)
    if wait:
        rollout(client, site, stage_nodes(plan),
                timeout=max(30.0, timeout - (time.monotonic() - t0)), progress=say)
    return Report(rel, ns, bool(state.changed) or bool(labelled), state.revision, label, labelled, secret,
                  time.monotonic() - t0)


def service_account_secrets(client: Any, namespace: str, release: str, secret: str) -> list[str]:
    """The pull Secret on every ServiceAccount of the release (Helm's meta.helm.sh/release-name), and the release's
    pods that started before without it deleted (their controllers make them again, with it)."""
    from kubernetes import client as k

    from installer import kube

    core: Any = k.CoreV1Api(client)
    accounts = [sa for sa in kube._call(f"list the ServiceAccounts in {namespace}",
                                        lambda: core.list_namespaced_service_account(namespace).items)
                if (sa.metadata.annotations or {}).get("meta.helm.sh/release-name") == release]
    done = []
    for sa in accounts:
        have = [r.name for r in (sa.image_pull_secrets or [])]
        if secret not in have:
            body = {"imagePullSecrets": [{"name": n} for n in [*have, secret]]}
            name: str = sa.metadata.name

            def patch(name: str = name, body: dict[str, Any] = body) -> Any:
                return core.patch_namespaced_service_account(name, namespace, body)

            kube._call(f"patch ServiceAccount {namespace}/{name}", patch)
            done.append(f"pull secret {secret} on ServiceAccount {namespace}/{sa.metadata.name}")
    names = {sa.metadata.name for sa in accounts}
    for pod in kube._call(f"list the pods in {namespace}", lambda: core.list_namespaced_pod(namespace).items):
        if pod.spec.service_account_name in names and secret not in [r.name for r in (pod.spec.image_pull_secrets or [])]:
            pod_name: str = pod.metadata.name

            def delete(pod_name: str = pod_name) -> Any:
                return core.delete_namespaced_pod(pod_name, namespace)

            kube._call(f"delete pod {namespace}/{pod_name}", delete)
            done.append(f"pod {namespace}/{pod.metadata.name} made again with the pull secret")
    return done


def preview(plan: Plan, kubeconfig: Path) -> tuple[bool, str]:
    """apply --check: (would change, what) for the release and the node labels, read-only."""
    from installer import helm, kube

    site = plan.site
    ns, rel, label = namespace(site), release_name(site), node_label(site)
    rp = helm.plan_release(release_chart(site), rel, ns, release_values(site), kubeconfig)
    labels = kube.node_labels(kube.api_client(kubeconfig), stage_nodes(plan))
    todo = sorted(n for n, ls in labels.items() if ls is None or ls.get(label[0]) != label[1])
    what = f"release {rel} in {ns}: {'would ' + rp.action if rp.action != 'unchanged' else 'unchanged'}; " + (
        f"would label {', '.join(todo)} {label[0]}={label[1]}" if todo else "node labels in place")
    return rp.action != "unchanged" or bool(todo), what


def rollout(client: Any, site: Site, nodes: list[str], timeout: float, progress: Progress,
            poll: float = 1.0) -> None:
    """Wait until the mode's DaemonSet runs a pod on every GPU node and its Deployment is available; a pod that
    cannot pull its image ends the wait with the kubelet's message."""
    from kubernetes import client as k

    from installer.errors import ClusterError

    core: Any = k.CoreV1Api(client)
    apps: Any = k.AppsV1Api(client)
    ns = namespace(site)
    daemon, deployment = workloads(site)
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        pods = [p for p in core.list_namespaced_pod(ns).items
                if p.metadata.name.startswith((daemon + "-", deployment + "-"))]
        running = {p.spec.node_name for p in pods
                   if p.metadata.name.startswith(daemon + "-") and p.status.phase == "Running"}
        try:
            dep = apps.read_namespaced_deployment(deployment, ns)
            ready = (dep.status.available_replicas or 0) >= 1
        except k.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
            ready = False
        missing = sorted(set(nodes) - running)
        stuck = []
        for p in pods:
            for st in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
                w = st.state.waiting if st.state else None
                if w and w.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                                      "CreateContainerConfigError"):
                    stuck.append(f"{p.metadata.name} on {p.spec.node_name}: {w.reason} {w.message or ''}".strip())
        if not missing and ready:
            progress(f"{daemon} running on {len(nodes)} node(s), {deployment} available")
            return
        state = f"{daemon} missing on {', '.join(missing) or 'none'}; {deployment} {'ready' if ready else 'not ready'}"
        if state != last:
            progress(state)
            last = state
        if time.monotonic() > deadline or any("ImagePull" in s or "InvalidImage" in s for s in stuck):
            raise ClusterError(f"sharing: {state}" + (f" ({'; '.join(stuck[:5])})" if stuck else "")
                               + f" after {timeout - max(0.0, deadline - time.monotonic()):.0f}s",
                               hint=f"kubectl -n {ns} get pods -o wide; images: gpu-install mirror push; the pull "
                                    "Secret")
        time.sleep(poll)


def uninstall(plan: Plan, kubeconfig: Path, timeout: float = 300, progress: Progress | None = None) -> list[str]:
    """The Helm release, the mode's node label from the GPU nodes, the pull Secret (only if gpu-install made it)."""
    from installer import helm, kube

    say = progress or (lambda _m: None)
    site = plan.site
    ns, rel, label = namespace(site), release_name(site), node_label(site)
    client = kube.api_client(kubeconfig)
    done = []
    if helm.uninstall(rel, ns, kubeconfig, timeout=timeout):
        done.append(f"Helm release {rel} in {ns} removed")
    labels = kube.node_labels(client, stage_nodes(plan))
    unlabelled = [n for n, ls in labels.items() if ls is not None and label[0] in ls]
    for node in unlabelled:
        kube.set_node_label(client, node, label[0], None)
    if unlabelled:
        done.append(f"label {label[0]} removed from {', '.join(sorted(unlabelled))}")
    ps = site.registry.pullSecret
    if ps and ns != site.operator.namespace and kube.delete_secret_if_ours(client, ns, ps.name):
        done.append(f"pull Secret {ns}/{ps.name} removed")
    for line in done:
        say(line)
    return done
