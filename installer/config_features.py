"""The site file's blocks of the features beside the GPU Operator (installer/features): mig.nos (dynamic MIG),
sharing.gpumanager, sharing.hami and monitoring. What selects them (mig.dynamic, sharing.mode, monitoring.enabled) and
the rules across blocks are the features' (Feature.check_block); these blocks check their own fields."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from installer.config_base import Block, ImageOverride, VersionText, rules
from installer.patterns import DNS_LABEL, DURATION, LABEL_KEY, URL_PREFIX, dns_label, no_userinfo


class Nos(Block):
    """nos (github.com/nebuly-ai/nos): dynamic MIG partitioning from the pods' nvidia.com/mig-* requests."""

    chart: str | None = Field(
        None, description="the nos chart apply installs: .tgz, directory or oci://<registry>/<path>/nos (mirror push "
        "prints it); a relative path is relative to the site file")
    version: VersionText | None = Field(None, description="nos chart version; default: values/sharing/nos.yaml")
    namespace: str = Field("nebuly-nos", description="namespace of the release (not default: the chart refuses it)",
                           json_schema_extra=rules({"pattern": DNS_LABEL}))
    releaseName: str = Field("nos", description="Helm release name", json_schema_extra=rules({"pattern": DNS_LABEL}))
    reset: StrictBool = Field(True, description="when MIG mode stays pending after `nvidia-smi -mig 1`, try a GPU reset "
                              "(nvidia-smi -r; refused while a process uses the GPU)")
    reboot: StrictBool = Field(False, description="reboot a node whose MIG mode is still pending after the reset; "
                               "false: stop and report the node (reboot it yourself, then apply again)")

    @field_validator("namespace", "releaseName")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        return dns_label(v)

    @field_validator("namespace")
    @classmethod
    def _not_default(cls, v: str) -> str:
        if v == "default":
            raise ValueError("nos refuses the default namespace (its chart fails there): use e.g. nebuly-nos")
        return v


def vcuda_request(core: int, memory: int, where: str = "") -> None:
    """A tencent.com/vcuda-core / vcuda-memory request GPUManager can grant, else ValueError saying why: 100 cores are
    one GPU, below 100 a share of one GPU (then memory, in 256 MiB units, must be given), from 100 whole GPUs only in
    multiples of 100 (gpu-manager refuses 150 at admission: "cores are greater than 100, must be multiple of 100")."""
    at = f"{where}: " if where else ""
    if core < 1:
        raise ValueError(f"{at}tencent.com/vcuda-core {core}: must be at least 1 (100 = one GPU)")
    if core > 100 and core % 100:
        raise ValueError(f"{at}tencent.com/vcuda-core {core} is not possible: below 100 it is a share of one GPU, "
                         f"above 100 only whole GPUs in multiples of 100 (use {core // 100 * 100} or "
                         f"{(core // 100 + 1) * 100}, or a share below 100)")
    if core < 100 and memory < 1:
        raise ValueError(f"{at}a GPU share (tencent.com/vcuda-core {core} < 100) needs tencent.com/vcuda-memory >= 1 "
                         "(256 MiB units): gpu-manager refuses a share without memory")


class VcudaRequest(Block):
    core: StrictInt = Field(50, description="tencent.com/vcuda-core of validate's smoke pod: below 100 a share of one "
                            "GPU, 100 one GPU, above only multiples of 100", json_schema_extra=rules(minimum=1))
    memory: StrictInt = Field(4, description="tencent.com/vcuda-memory of validate's smoke pod, in 256 MiB units",
                              json_schema_extra=rules(minimum=0))

    @model_validator(mode="after")
    def _possible(self) -> VcudaRequest:
        vcuda_request(self.core, self.memory)
        return self


class GpuManager(Block):
    """tkestack GPUManager (vGPU by CUDA interception) and its scheduler extender gpu-quota-admission."""

    namespace: str = Field("kube-system", description="namespace of gpu-manager and gpu-quota-admission",
                           json_schema_extra=rules({"pattern": DNS_LABEL}))
    manager: ImageOverride = Field(default_factory=ImageOverride,
                                   description="gpu-manager image (default: values/sharing/gpumanager.yaml)")
    admission: ImageOverride = Field(default_factory=ImageOverride,
                                     description="gpu-quota-admission image (default: values/sharing/gpumanager.yaml)")
    cgroupDriver: Literal["cgroupfs", "systemd"] = Field(
        "cgroupfs", description="the kubelet's cgroup driver on the GPU nodes (gpu-manager finds pods' cgroups by it)")
    runtimeEndpoint: str | None = Field(
        None, description="CRI socket path gpu-manager talks to; default: /var/run/containerd/containerd.sock "
        "(containerd), /var/run/dockershim.sock (docker)", json_schema_extra=rules({"pattern": r"^/[^\s]*$"}))
    extenderUrl: str | None = Field(
        None, description="URL kube-scheduler calls the extender at; default: "
        "http://gpu-quota-admission.<namespace>.svc:3456/scheduler", json_schema_extra=rules({"pattern": URL_PREFIX}))
    quotaConfigMapName: str = Field("gpuquota", description="ConfigMap with the per-namespace GPU quota (key gpu_quota)",
                                    json_schema_extra=rules({"pattern": DNS_LABEL}))
    quotaConfigMapNamespace: str = Field("kube-system", description="namespace of that ConfigMap",
                                         json_schema_extra=rules({"pattern": DNS_LABEL}))
    gpuModelLabel: str = Field("gaia.tencent.com/gpu-model", description="node label holding the GPU model",
                               json_schema_extra=rules({"pattern": LABEL_KEY}))
    gpuPoolLabel: str = Field("gaia.tencent.com/gpu-pool", description="node label holding the GPU pool",
                              json_schema_extra=rules({"pattern": LABEL_KEY}))
    logLevel: StrictInt = Field(4, ge=0, le=10, description="klog verbosity of both components")
    smoke: VcudaRequest = Field(default_factory=VcudaRequest, description="what validate's fractional smoke pod asks")

    @field_validator("namespace", "quotaConfigMapName", "quotaConfigMapNamespace")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        return dns_label(v)

    @field_validator("gpuModelLabel", "gpuPoolLabel")
    @classmethod
    def _label_key(cls, v: str) -> str:
        if not re.fullmatch(LABEL_KEY, v):
            raise ValueError(f"{v!r} is not a label key such as gaia.tencent.com/gpu-model")
        return v

    @field_validator("runtimeEndpoint")
    @classmethod
    def _socket(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v.startswith("unix://"):
            raise ValueError(f"{v!r}: gpu-manager dials a plain socket path; drop the unix:// prefix")
        if not re.fullmatch(r"/[^\s]*", v):
            raise ValueError(f"{v!r} is not an absolute socket path such as /var/run/containerd/containerd.sock")
        return v

    @field_validator("extenderUrl")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:
            no_userinfo(v, "kube-scheduler calls the extender without credentials in its URL")
        if v is not None and not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", v):
            raise ValueError(f"{v!r} is not an http(s) URL such as http://gpu-quota-admission.kube-system.svc:3456/scheduler")
        return v


class HamiSmoke(Block):
    memory: StrictInt = Field(1024, ge=1, description="nvidia.com/gpumem (MiB) of validate's smoke pod")
    cores: StrictInt = Field(30, ge=1, le=100, description="nvidia.com/gpucores (% of one GPU) of validate's smoke pod")


class Hami(Block):
    """Project-HAMi: vGPU by CUDA interception, its own scheduler (kube-scheduler + extender) and device plugin."""

    chart: str | None = Field(
        None, description="the HAMi chart apply installs: .tgz, directory or oci://<registry>/<path>/hami (mirror push "
        "prints it); a relative path is relative to the site file")
    version: VersionText | None = Field(None, description="HAMi chart version (2.7.0+); default: "
                                        "values/sharing/hami.yaml")
    namespace: str = Field("kube-system", description="namespace of the release",
                           json_schema_extra=rules({"pattern": DNS_LABEL}))
    releaseName: str = Field("hami", description="Helm release name", json_schema_extra=rules({"pattern": DNS_LABEL}))
    kubernetesVersion: str = Field(
        description="the cluster's Kubernetes version, vX.Y.Z: HAMi runs a kube-scheduler of exactly that version "
        "(its image is mirrored at that tag; apply checks it against the cluster)",
        json_schema_extra=rules({"pattern": r"^v?[0-9]+\.[0-9]+\.[0-9]+$"}))
    deviceSplitCount: StrictInt = Field(10, ge=1, le=100, description="pods per GPU at most (nvidia.com/gpu = GPUs x this)")
    deviceMemoryScaling: float = Field(1.0, gt=0, le=10, description="GPU memory advertised as this x the real memory "
                                       "(> 1 oversubscribes)")
    deviceCoreScaling: float = Field(1.0, gt=0, le=10, description="GPU cores advertised as this x 100%")
    smoke: HamiSmoke = Field(default_factory=HamiSmoke, description="what validate's smoke pod asks besides one GPU")

    @field_validator("namespace", "releaseName")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        return dns_label(v)

    @field_validator("kubernetesVersion")
    @classmethod
    def _kube(cls, v: str) -> str:
        if not re.fullmatch(r"v?[0-9]+\.[0-9]+\.[0-9]+", v):
            raise ValueError(f"{v!r}: give the cluster's exact version, e.g. v1.27.4 (kubectl version): the "
                             "kube-scheduler image HAMi runs is tagged with it")
        return v if v.startswith("v") else "v" + v

    @field_validator("version")
    @classmethod
    def _chart_version(cls, v: str | None) -> str | None:
        from packaging.version import InvalidVersion, Version

        if v is None:
            return v
        try:
            ok = Version(v.lstrip("v")) >= Version("2.7.0")
        except InvalidVersion:
            raise ValueError(f"{v!r} is not a HAMi chart version such as 2.10.0") from None
        if not ok:
            raise ValueError(f"{v}: gpu-install renders values for HAMi charts 2.7.0 and later (global.imageRegistry, "
                             "<component>.image.*); use 2.7.0 or newer")
        return v.lstrip("v")


class Monitoring(Block):
    """GPU monitoring: DCGM exporter with gpu-install's metric list, its scraping, alert rules and a Grafana dashboard
    (docs/monitoring.md)."""

    enabled: StrictBool = Field(False, description="turn the operator's DCGM exporter on with the metrics below and "
                                "install the scraping, the alert rules and the dashboard")
    metrics: Path | None = Field(None, description="a dcgm-exporter counters CSV of your own (relative to the site "
                                 "file); default: gpu-install's curated list (values/monitoring/dcgm-metrics.csv)")
    scrape: Literal["auto", "serviceMonitor", "config"] = Field(
        "auto", description="auto: a ServiceMonitor + PrometheusRule when the cluster serves the Prometheus Operator's "
        "monitoring.coreos.com/v1, else a plain scrape config and rules file | serviceMonitor | config")
    interval: str = Field("15s", description="scrape interval", json_schema_extra=rules({"pattern": DURATION}))
    labels: dict[str, str] = Field(default_factory=dict, description="labels your Prometheus selects ServiceMonitors "
                                   "and PrometheusRules by (e.g. release: kube-prometheus-stack)")
    namespace: str = Field("monitoring", description="namespace of the PrometheusRule and the ConfigMaps (rules, scrape "
                           "config, dashboard); created when missing",
                           json_schema_extra=rules({"pattern": DNS_LABEL}))
    files: Path | None = Field(None, description="scrape: config: also write the scrape config and the rules file "
                               "into this directory on the controller, for a Prometheus outside the cluster's reach")
    dashboardLabel: str = Field("grafana_dashboard", description="the label Grafana's dashboard sidecar watches "
                                "(value \"1\")")

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: str) -> str:
        if not re.fullmatch(DURATION, v):
            raise ValueError(f"{v!r} is not a duration such as 15s, 1m or 30s")
        return v

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        return dns_label(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.fullmatch(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
                                key):
                raise ValueError(f"{key!r} is not a Kubernetes label key")
            if not re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", str(value)):
                raise ValueError(f"{key}: {value!r} is not a Kubernetes label value")
        return v
