"""sharing.mode gpumanager: tkestack GPUManager + gpu-quota-admission.

- images(): the two pinned images (values/sharing/gpumanager.yaml, site overrides);
- extenders(): gpu-quota-admission's (filterVerb predicates, plain HTTP, full Node objects, managing
  tencent.com/vcuda-core and -memory; after the site's, as upstream asks) → the scheduler_policy role;
- conflicts(): site combinations where two things would hand out the same GPUs or break the isolation (the
  operator's NVIDIA device plugin, a toolkit that makes nvidia the default runtime, time-slicing/MPS, MIG) → exit 3;
  cluster_conflicts(): the same seen in the cluster (GPUs already advertised by something else; docker on 1.24+);
- the sharing stage: the Helm release of charts/gpu-manager (our chart: DaemonSet, Deployment, Service, ConfigMap,
  least-privilege RBAC), the pull Secret in its namespace, and the node label nvidia-device-enable=enable on the GPU
  nodes gpu-manager runs on. Its containers run with plain runc (default_runtime).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from installer.config import Extender, ManagedResource, Site
from installer.errors import ConfigError
from installer.features.base import pinned
from installer.features.release import SharingMode, advertised_elsewhere, whole_gpu_conflicts

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.validate.report import Check
    from installer.validate.smoke import Target

NAME = "gpumanager"
RELEASE = "gpu-manager"  # Helm release and chart name
NODE_LABEL = ("nvidia-device-enable", "enable")  # gpu-manager's DaemonSet selects these nodes
VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEMORY = "tencent.com/vcuda-memory"
ADMISSION = "gpu-quota-admission"
ADMISSION_PORT = 3456
MANAGER_COMPONENT, ADMISSION_COMPONENT = "gpuManager", "gpuQuotaAdmission"  # names in the image list
RUNTIME_ENDPOINTS = {"containerd": "/var/run/containerd/containerd.sock", "docker": "/var/run/dockershim.sock"}


def extender_url(site: Site) -> str:
    g = site.sharing.gpumanager
    return g.extenderUrl or f"http://{ADMISSION}.{g.namespace}.svc:{ADMISSION_PORT}/scheduler"


def extender(site: Site) -> Extender:
    """gpu-quota-admission as kube-scheduler's extender: POST <url>/predicates with whole Node objects (it reads
    them: nodeCacheCapable false), plain HTTP, for pods asking the vcuda resources."""
    return Extender(urlPrefix=extender_url(site), filterVerb="predicates", enableHTTPS=False, nodeCacheCapable=False,
                    managedResources=[ManagedResource(name=VCUDA_CORE), ManagedResource(name=VCUDA_MEMORY)])


def runtime_endpoint(site: Site) -> str:
    return site.sharing.gpumanager.runtimeEndpoint or RUNTIME_ENDPOINTS[site.runtime]


def runtime_dir(endpoint: str) -> str:
    """The socket's directory when /var/run (mounted whole) does not hold it, else ''."""
    parent = str(Path(endpoint).parent)
    return "" if any(parent == p or parent.startswith(p + "/") for p in ("/var/run", "/run")) else parent


def chart_dir() -> Path:
    from installer import content

    return content.chart_dir(RELEASE)


def chart_values(site: Site) -> dict[str, Any]:
    """charts/gpu-manager's values for this site."""
    g = site.sharing.gpumanager
    dest = FEATURE.destinations(site)
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


class GpuManager(SharingMode):
    name: ClassVar[str] = NAME
    title: ClassVar[str] = "gpu-manager + gpu-quota-admission"
    default_runtime: ClassVar[str | None] = "runc"

    def sources(self, site: Site) -> dict[str, str]:
        """component -> upstream image reference (pins, site overrides per field)."""
        g = site.sharing.gpumanager
        out = {}
        for comp, key, over in ((MANAGER_COMPONENT, "manager", g.manager),
                                (ADMISSION_COMPONENT, "admission", g.admission)):
            pin = pinned(NAME)[key]
            repo, image, version = over.repository or pin["repository"], over.image or pin["image"], \
                over.version or pin["version"]
            out[comp] = f"{repo}/{image}{'@' if str(version).startswith('sha256:') else ':'}{version}"
        return out

    def extenders(self, site: Site) -> list[Extender]:
        """gpu-quota-admission's, after the site's (upstream: keep it the last one). A site entry at the same URL is
        refused (it would be consulted twice)."""
        ours = extender(site)
        for i, e in enumerate(site.scheduler.extenders):
            if e.urlPrefix.rstrip("/") == ours.urlPrefix.rstrip("/"):
                raise ConfigError(f"scheduler.extenders.{i}: {e.urlPrefix} is gpu-quota-admission's URL, which "
                                  "sharing.mode gpumanager already wires into kube-scheduler",
                                  hint=f"drop scheduler.extenders.{i} (or point sharing.gpumanager.extenderUrl "
                                       "elsewhere)")
        return [ours]

    def extenders_why(self, site: Site) -> str:
        return "sharing.mode gpumanager wires gpu-quota-admission as an extender"

    def conflicts(self, plan: Plan) -> list[str]:
        site = plan.site
        if not self.active(site):
            return []
        own = []
        tk = plan.components.get("toolkit")  # toolkit.mode decides the chart's toolkit.enabled
        if site.toolkit.mode == "operator" and tk is not None and plan.deployed(tk):
            own.append("toolkit.mode operator: the operator's toolkit makes nvidia the default runtime, and every "
                       "container with NVIDIA_VISIBLE_DEVICES (most CUDA images) would then see all GPUs past "
                       "gpu-manager's limits (it needs plain runc): set toolkit.mode: host (gpu-install's roles "
                       "install the toolkit and keep runc the default runtime on GPUManager sites)")
        return whole_gpu_conflicts(plan, "gpu-manager", "beside gpu-manager's tencent.com/vcuda-*", own)

    def cluster_conflicts(self, plan: Plan, client: Any, operator_namespace: str | None = None) -> list[str]:
        """GPUs already advertised by something else; the docker runtime on Kubernetes 1.24+ (dockershim, which
        gpu-manager's CRI client speaks to, is gone there)."""
        from installer import kube
        from installer.config import kubernetes_minor

        site = plan.site
        if not self.active(site):
            return []
        out = []
        version = kube.server_version(client)
        if site.runtime == "docker" and kubernetes_minor(version) >= (1, 24) \
                and not site.sharing.gpumanager.runtimeEndpoint:
            out.append(f"runtime docker on Kubernetes {version}: the dockershim socket gpu-manager talks CRI to is "
                       "gone since 1.24: set sharing.gpumanager.runtimeEndpoint to your CRI socket (cri-dockerd) or "
                       "use containerd")
        return out + advertised_elsewhere(self, plan, client, operator_namespace or site.operator.namespace,
                                          "as tencent.com/vcuda-*")

    # ---- the sharing stage

    def namespace(self, site: Site) -> str:
        return site.sharing.gpumanager.namespace

    def release_name(self, site: Site) -> str:
        return RELEASE

    def node_label(self, site: Site) -> tuple[str, str]:
        return NODE_LABEL

    def release_chart(self, site: Site) -> str | Path:
        return chart_dir()

    def release_values(self, site: Site) -> dict[str, Any]:
        return chart_values(site)

    def workloads(self, site: Site) -> tuple[str, str]:
        return RELEASE, ADMISSION

    # ---- validate

    def cluster_counts(self, plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
        """100 tencent.com/vcuda-core per GPU."""
        from installer.validate import cluster

        return cluster.count_checks(objs, facts, 100, False, "vcuda-core (gpu-manager)", resource=cluster.VCUDA_CORE)

    def smoke_target(self, plan: Plan, node: str, obj: Any) -> Target | None:
        from installer.validate import cluster, smoke

        g = plan.site.sharing.gpumanager
        return smoke.Target(node, f"{cluster.VCUDA_CORE} {g.smoke.core}",
                            limits={cluster.VCUDA_CORE: str(g.smoke.core), VCUDA_MEMORY: str(g.smoke.memory)})


FEATURE = GpuManager()
