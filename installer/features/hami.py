"""sharing.mode hami: Project-HAMi. Its chart from the site's chart repository (sharing.hami.chart; the mirror
carries it), every image from the site registry, its own scheduler (no extender in kube-scheduler), its device
plugin on the nodes labelled gpu=on, nvidia as the default runtime (default_runtime; CDI on is refused)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from installer.config import Sharing, Site
from installer.errors import ConfigError
from installer.features.base import pinned
from installer.features.release import SharingMode, advertised_elsewhere, whole_gpu_conflicts

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.validate.report import Check
    from installer.validate.smoke import Target

NAME = "hami"
LABEL = ("gpu", "on")  # HAMi's device plugin DaemonSet selects these nodes (devicePlugin.nvidiaNodeSelector)


def _split_ref(dest: str, site: Site) -> dict[str, str]:
    """A site-registry reference as HAMi's image values: {registry, repository, tag}."""
    base = site.registry.host + (f"/{site.registry.prefix}" if site.registry.prefix else "")
    repo, _, tag = dest.rpartition(":")
    assert repo.startswith(base + "/"), (repo, base)
    return {"registry": base, "repository": repo[len(base) + 1:], "tag": tag}


def values(site: Site) -> dict[str, Any]:
    """The HAMi chart's values (layout of 2.7.0+): every image from the site registry (global.imageRegistry and each
    image's repository/tag, so that both registry layouts work), the pull Secret, the scheduler's kube-scheduler at
    the cluster's version, the device plugin's split and scaling, its node selector gpu=on."""
    h = site.sharing.hami
    assert h is not None
    dest = FEATURE.destinations(site)
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
                         "nvidiaNodeSelector": {LABEL[0]: LABEL[1]}},
    }


def fullname(site: Site) -> str:
    """The HAMi chart's name for its objects: the release name when it contains "hami", else <release>-hami."""
    rel = FEATURE.release_name(site)
    return rel if "hami" in rel else f"{rel}-hami"


class Hami(SharingMode):
    name: ClassVar[str] = NAME
    title: ClassVar[str] = "HAMi"
    chart_field: ClassVar[str] = "sharing.hami.chart"
    chart_label: ClassVar[str] = "HAMi chart"
    default_runtime: ClassVar[str | None] = "nvidia"

    def check_block(self, block: BaseModel) -> None:
        if isinstance(block, Sharing) and block.mode == NAME and block.hami is None:
            raise ValueError("mode hami needs sharing.hami with at least kubernetesVersion (the cluster's vX.Y.Z)")

    def upstream_chart(self, site: Site) -> tuple[str, str, str]:
        """(name, version, upstream repository) of the HAMi chart."""
        c = pinned(NAME)["chart"]
        h = site.sharing.hami
        return c["name"], (h.version if h and h.version else c["version"]), c["repository"]

    def sources(self, site: Site) -> dict[str, str]:
        """HAMi's images (component -> upstream reference): hami (the chart's appVersion, v<chart version>),
        kube-scheduler at the cluster's version, the certgen image the chart picks for that Kubernetes minor."""
        from installer.config import kubernetes_minor

        h = site.sharing.hami
        assert h is not None
        imgs = pinned(NAME)["images"]
        _name, version, _repo = self.upstream_chart(site)
        legacy = kubernetes_minor(h.kubernetesVersion) < (1, 22)
        cert = imgs["certgenLegacy" if legacy else "certgen"]
        return {"hami": f"{imgs['hami']['repository']}/{imgs['hami']['image']}:v{version}",
                "hami.kubeScheduler": f"{imgs['kubeScheduler']['repository']}/{imgs['kubeScheduler']['image']}:"
                                      f"{h.kubernetesVersion}",
                "hami.certgen": f"{cert['repository']}/{cert['image']}:{cert['version']}"}

    def conflicts(self, plan: Plan) -> list[str]:
        if not self.active(plan.site):
            return []
        own = []
        if plan.site.cdi.enabled is True:
            own.append("cdi.enabled: true: nvidia is then not the default runtime, and HAMi needs it to be (its "
                       "containers get no runtime class): leave cdi.enabled unset or false")
        return whole_gpu_conflicts(plan, "HAMi", "HAMi's device plugin advertises them itself (nvidia.com/gpu split, "
                                                 "nvidia.com/gpumem, gpucores)", own)

    def cluster_conflicts(self, plan: Plan, client: Any, operator_namespace: str | None = None) -> list[str]:
        """GPUs already advertised by something else; sharing.hami.kubernetesVersion not the cluster's."""
        from installer import kube

        site = plan.site
        if not self.active(site):
            return []
        out = []
        version = kube.server_version(client)
        h = site.sharing.hami
        if h is not None and version.split("+")[0].split("-")[0] != h.kubernetesVersion:
            out.append(f"sharing.hami.kubernetesVersion is {h.kubernetesVersion} but the cluster runs {version}: "
                       "HAMi's scheduler runs a kube-scheduler of the cluster's exact version, mirrored at that tag: "
                       f"set sharing.hami.kubernetesVersion: {version.split('+')[0].split('-')[0]}, mirror and push "
                       "again")
        return out + advertised_elsewhere(self, plan, client, operator_namespace or site.operator.namespace,
                                          "through HAMi's device plugin")

    # ---- the sharing stage

    def namespace(self, site: Site) -> str:
        h = site.sharing.hami
        return h.namespace if h else site.sharing.gpumanager.namespace

    def release_name(self, site: Site) -> str:
        from installer.features.gpumanager import RELEASE

        h = site.sharing.hami
        return h.releaseName if h else RELEASE

    def node_label(self, site: Site) -> tuple[str, str]:
        return LABEL

    def release_chart(self, site: Site) -> str | Path:
        h = site.sharing.hami
        assert h is not None
        if not h.chart:
            raise ConfigError("sharing.mode hami: sharing.hami.chart is not set, and apply installs HAMi from it",
                              hint="give the chart `gpu-install mirror push` printed (oci://<registry>/charts/hami:<v>) "
                                   "or the .tgz in the bundle; or pass --skip-operator to configure the nodes only")
        return h.chart

    def release_values(self, site: Site) -> dict[str, Any]:
        return values(site)

    def workloads(self, site: Site) -> tuple[str, str]:
        full = fullname(site)
        return f"{full}-device-plugin", f"{full}-scheduler"

    # ---- validate

    def cluster_counts(self, plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
        """nvidia.com/gpu x deviceSplitCount."""
        from installer.validate import cluster

        h = plan.site.sharing.hami
        if h is None:
            return None
        return cluster.count_checks(objs, facts, h.deviceSplitCount, False, "HAMi deviceSplitCount")

    def smoke_target(self, plan: Plan, node: str, obj: Any) -> Target | None:
        """A HAMi share: one GPU slice with a memory and core limit."""
        from installer.validate import cluster, smoke

        h = plan.site.sharing.hami
        if h is None:
            return None
        hs = h.smoke
        return smoke.Target(node, f"{cluster.GPU} 1 ({hs.memory} MiB, {hs.cores}% cores)",
                            limits={cluster.GPU: "1", "nvidia.com/gpumem": str(hs.memory),
                                    "nvidia.com/gpucores": str(hs.cores)})


FEATURE = Hami()
