"""mig.dynamic nos (nebuly-ai/nos): dynamic MIG partitioning from the pods' nvidia.com/mig-* requests.

Its chart from the site's chart repository (mig.nos.chart; values: every image from the site registry,
shareTelemetry off; the site's pull Secret added to the release's ServiceAccounts, the chart having no value for
it), the node label nos.nebuly.com/gpu-partitioning=mig on the GPU nodes taking part (not those with
gpu_install_mig_dynamic false), where the mig_mode role turned MIG mode on before (role_vars); the GPU Operator runs
with mig.strategy mixed and mig-manager off (operator_values). Needs Kubernetes 1.23+ and cert-manager
(cluster_conflicts()). Requested by mig.dynamic nos; active (its images, chart and stage) only without a sharing
mode, which it refuses (conflicts())."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from installer.config import Mig, Site
from installer.errors import ConfigError
from installer.features.base import pinned
from installer.features.release import ReleaseFeature

if TYPE_CHECKING:
    from installer.catalog import Release
    from installer.plan import Plan
    from installer.validate.report import Check
    from installer.validate.smoke import Target

NAME = "nos"
LABEL = ("nos.nebuly.com/gpu-partitioning", "mig")  # nos' mig-agent runs there and partitions the GPUs
MIN_KUBERNETES = (1, 23)


def values(site: Site) -> dict[str, Any]:
    """The nos chart's values: each image's repository and tag in the site registry, telemetry off (its post-install
    Pod would post to nebuly.cloud from an image nobody mirrored)."""
    dest = FEATURE.destinations(site)

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


def checks(nodes: Sequence[str], objs: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Check]:
    """validate's mig layer under mig.dynamic nos: on each node of nos, the label its mig-agent runs on, and (where the
    node layer read nvidia-smi) MIG mode on for every GPU (the mig_mode role's work). The layouts are nos' to make:
    not checked."""
    from installer.validate.mig import LAYER
    from installer.validate.report import Check

    out: list[Check] = []
    for name in nodes:
        obj = objs.get(name)
        if obj is None:
            out.append(Check(LAYER, "mig.nos-label", name, "skip", f"no Node {name} (cluster layer: node-present)"))
            continue
        value = (obj.metadata.labels or {}).get(LABEL[0])
        out.append(Check(LAYER, "mig.nos-label", name, "pass" if value == LABEL[1] else "fail",
                         f"{LABEL[0]}={value}" if value else f"no {LABEL[0]} label",
                         "" if value == LABEL[1] else "gpu-install apply (the sharing stage labels the nodes of "
                         "nos)"))
        smi = facts.get(name)
        if smi is None or not smi.gpus:
            continue
        off = [str(i) for i, g in enumerate(smi.gpus) if not g.mig_current]
        out.append(Check(LAYER, "mig.mode", name, "fail" if off else "pass",
                         f"MIG mode off on GPU {', '.join(off)}" if off else f"MIG mode on for {len(smi.gpus)} GPU(s)",
                         "gpu-install apply --tags mig_mode (turns it on; a pending mode needs the GPU free or a "
                         "reboot)" if off else ""))
    return out


class Nos(ReleaseFeature):
    name: ClassVar[str] = NAME
    title: ClassVar[str] = "nos (dynamic MIG)"
    chart_field: ClassVar[str] = "mig.nos.chart"
    chart_label: ClassVar[str] = "nos chart"

    def requested(self, site: Site) -> bool:
        return site.mig.dynamic == NAME

    def active(self, site: Site) -> bool:
        """mig.dynamic nos, and no sharing mode (a sharing mode with it is refused by conflicts())."""
        return self.requested(site) and site.sharing.mode == "none"

    def what(self, site: Site) -> str:
        return f"mig.dynamic {NAME}"

    def check_block(self, block: BaseModel) -> None:
        """mig.dynamic nos: strategy mixed (given otherwise: refused; unset: made mixed), no static layouts."""
        if not isinstance(block, Mig) or block.dynamic != NAME:
            return
        if "strategy" in block.model_fields_set and block.strategy != "mixed":
            raise ValueError(f"dynamic nos needs strategy mixed (nos asks for nvidia.com/mig-<profile> resources), not "
                             f"{block.strategy}: set mig.strategy: mixed or leave it unset")
        static = [k for k in ("config", "configMap", "customConfigs") if getattr(block, k)]
        if static:
            raise ValueError(f"dynamic nos and static MIG layouts ({', '.join('mig.' + k for k in static)}) exclude "
                             "each other: nos makes the layouts, mig-manager is off: drop " + ", ".join(static))
        if block.strategy != "mixed":
            object.__setattr__(block, "strategy", "mixed")  # not an assignment: that would validate the block again

    def upstream_chart(self, site: Site) -> tuple[str, str, str]:
        """(name, version, upstream repository) of the nos chart."""
        c = pinned(NAME)["chart"]
        return c["name"], (site.mig.nos.version or c["version"]), c["repository"]

    def sources(self, site: Site) -> dict[str, str]:
        """nos' images (component -> upstream reference), tagged with the chart's version (its appVersion) but the
        kube-rbac-proxy sidecar, pinned apart."""
        _name, version, _repo = self.upstream_chart(site)
        out = {}
        for key, img in pinned(NAME)["images"].items():
            out[f"nos.{key}"] = f"{img['repository']}/{img['image']}:{img.get('version') or version}"
        return out

    def operator_values(self, site: Site, release: Release, values: dict[str, Any]) -> None:
        """mig.strategy mixed is the site model's; mig-manager off: nos' mig-agent makes the layouts (its docs:
        migManager.enabled=false)."""
        from installer.render.values import _set

        mm = release.components.get("migManager")
        if mm is not None and mm.enabled_path:
            _set(values, mm.enabled_path, False)

    def component_modes(self, site: Site) -> dict[str, tuple[str, str, bool]]:
        # nos makes the MIG layouts: mig-manager must not (only contradicted by enabling it)
        return {"migManager": ("mig.dynamic", site.mig.dynamic, False)}

    def role_vars(self, site: Site) -> dict[str, Any]:
        # MIG mode on the GPU nodes (host var gpu_install_mig_dynamic false leaves one out)
        return {"mig_mode_enabled": self.requested(site), "mig_mode_reset": site.mig.nos.reset,
                "mig_mode_reboot": site.mig.nos.reboot}

    def conflicts(self, plan: Plan) -> list[str]:
        """What in the site contradicts mig.dynamic nos, each with its fix."""
        site = plan.site
        if not self.requested(site):
            return []
        out = []
        if site.sharing.mode != "none":
            out.append(f"sharing.mode {site.sharing.mode} with mig.dynamic nos: {site.sharing.mode} shares whole "
                       "GPUs, nos cuts them into MIG devices; one node's GPUs cannot be both: drop one of them")
        static = sorted({a.node for a in plan.mig})
        if static:
            out.append(f"a static MIG layout (gpu_install_mig_config) is set for {', '.join(static)}: under "
                       "mig.dynamic nos mig-manager is off and nos makes the layouts: drop gpu_install_mig_config "
                       "there (a node left out of nos with gpu_install_mig_dynamic: false keeps whole GPUs)")
        dp = plan.components.get("devicePlugin")
        if dp is None or not plan.deployed(dp):
            out.append("components.devicePlugin.enabled: false: nos relies on the operator's device plugin "
                       "(mig.strategy mixed) to advertise the MIG devices it makes: leave the device plugin on")
        if site.driver.mode in ("operator", "precompiled"):
            out.append(f"driver.mode {site.driver.mode}: gpu-install turns MIG mode on with the host's nvidia-smi "
                       "before the operator starts, and with a driver container there is none on the host yet: use "
                       "driver.mode host, runfile or preinstalled")
        return out

    def cluster_conflicts(self, plan: Plan, client: Any, operator_namespace: str | None = None) -> list[str]:
        """Read-only: Kubernetes 1.23+ (nos' scheduler), cert-manager's API (the operator's webhook certificate), and
        no static MIG layout label on a node nos is to manage."""
        from kubernetes import client as k

        from installer import kube
        from installer.config import kubernetes_minor
        from installer.mig import LABEL as MIG_LABEL

        if not self.active(plan.site):
            return []
        out = []
        version = kube.server_version(client)
        if kubernetes_minor(version) < MIN_KUBERNETES:
            out.append(f"the cluster runs Kubernetes {version}, and nos needs {MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]} "
                       "or newer (its scheduler is built on that kube-scheduler): upgrade the cluster, or use static "
                       "MIG layouts (mig.dynamic: none, mig.config)")
        groups: Any = k.ApisApi(client)
        served = {g.name: [v.version for v in g.versions]
                  for g in kube._call("list the API groups", lambda: groups.get_api_versions().groups)}
        if "v1" not in served.get("cert-manager.io", []):
            out.append("the cluster serves no cert-manager.io/v1 API: nos' operator gets its webhook certificate from "
                       "cert-manager, and its pod does not start without it: install cert-manager first (its images "
                       "through the site registry too)")
        mine = self.stage_nodes(plan)
        labels = kube.node_labels(client, mine)
        for node in mine:
            value = (labels.get(node) or {}).get(MIG_LABEL)
            if value is not None:
                out.append(f"node {node} carries {MIG_LABEL}={value}, a static MIG layout: nos would change the "
                           f"layout under it: kubectl label node {node} {MIG_LABEL}- (or leave the node out of nos: "
                           "gpu_install_mig_dynamic: false)")
        return out

    # ---- the sharing stage

    def namespace(self, site: Site) -> str:
        return site.mig.nos.namespace

    def release_name(self, site: Site) -> str:
        return site.mig.nos.releaseName

    def node_label(self, site: Site) -> tuple[str, str]:
        return LABEL

    def stage_nodes(self, plan: Plan) -> list[str]:
        """The GPU nodes taking part (gpu_install_mig_dynamic)."""
        return [n.node_name for n in plan.nodes if n.mig_dynamic]

    def release_chart(self, site: Site) -> str | Path:
        if not site.mig.nos.chart:
            raise ConfigError("mig.dynamic nos: mig.nos.chart is not set, and apply installs nos from it",
                              hint="give the chart `gpu-install mirror push` printed (oci://<registry>/charts/nos:<v>) "
                                   "or the .tgz in the bundle; or pass --skip-operator to configure the nodes only")
        return site.mig.nos.chart

    def release_values(self, site: Site) -> dict[str, Any]:
        return values(site)

    def workloads(self, site: Site) -> tuple[str, str]:
        rel = self.release_name(site)
        return f"{rel}-mig-agent", f"{rel}-gpu-partitioner"

    def after_release(self, client: Any, site: Site, namespace: str, release: str) -> list[str]:
        """The chart has no imagePullSecrets value: the pull Secret onto its ServiceAccounts."""
        if not site.registry.pullSecret:
            return []
        return service_account_secrets(client, namespace, release, site.registry.pullSecret.name)

    # ---- validate

    def mig_checks(self, plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
        """nos makes the layouts: its label and MIG mode on its nodes."""
        return checks(self.stage_nodes(plan), objs, facts)

    def smoke_target(self, plan: Plan, node: str, obj: Any) -> Target | None:
        """On a node of nos advertising no GPU yet, its GPU model's smallest MIG profile (nos makes that device when
        a pod asks one)."""
        from installer.mig import PRODUCT_LABEL, smallest_profile
        from installer.validate import cluster, smoke

        res = cluster.gpu_resources(obj.status.allocatable) or cluster.gpu_resources(obj.status.capacity)
        if res or node not in self.stage_nodes(plan):
            return None
        profile = smallest_profile((obj.metadata.labels or {}).get(PRODUCT_LABEL))
        if not profile:
            return None
        return smoke.Target(node, f"nvidia.com/mig-{profile}", limits={f"nvidia.com/mig-{profile}": "1"})


FEATURE = Nos()
