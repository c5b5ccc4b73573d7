"""GPU sharing through the GPU Operator's NVIDIA device plugin: time-slicing, or CUDA MPS (devicePlugin.timeSlicing /
devicePlugin.mps in the site file). No component of its own: a device plugin config the operator's chart creates
(operator_values), and validate counting nvidia.com/gpu x replicas (cluster_counts: also the count without sharing,
the device plugin advertising one per GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from installer.config import Site
from installer.errors import ConfigError
from installer.features.base import Feature

if TYPE_CHECKING:
    from installer.catalog import Release
    from installer.plan import Plan
    from installer.validate.report import Check

NAME = "device-plugin-sharing"


class DevicePluginSharing(Feature):
    name: ClassVar[str] = NAME

    def requested(self, site: Site) -> bool:
        method, _replicas, _rename = site.devicePlugin.sharing()
        return bool(method)

    def what(self, site: Site) -> str:
        method, _replicas, _rename = site.devicePlugin.sharing()
        return f"devicePlugin.{method}"

    def operator_values(self, site: Site, release: Release, values: dict[str, Any]) -> None:
        """The device plugin's config (a ConfigMap the chart creates): time-slicing, or CUDA MPS (device plugin
        v0.15.0+: GPU Operator v24.3.0+, whose chart sets the plugin's MPS root, devicePlugin.mps.root)."""
        import yaml

        from installer.render.values import (
            MPS_CONFIGMAP,
            TIME_SLICING_CONFIGMAP,
            TIME_SLICING_KEY,
            _require,
            _set,
        )

        method, replicas, rename = site.devicePlugin.sharing()
        if not method:
            return
        field_name = f"devicePlugin.{method}"
        _require(release, "devicePlugin.config.create", field_name,
                 "a chart-created device plugin config needs v22.9.1 or newer")
        if method == "mps":
            _require(release, "devicePlugin.mps.root", field_name,
                     "MPS sharing needs device plugin v0.15.0, first pinned by v24.3.0")
            if site.mig.strategy == "mixed":
                raise ConfigError("devicePlugin.mps: the device plugin refuses MPS with mig.strategy mixed (MPS shares "
                                  "full GPUs only)", hint="use mig.strategy single or none, or devicePlugin.timeSlicing")
        config = {
            "version": "v1",
            "flags": {"migStrategy": site.mig.strategy},
            "sharing": {
                method: {
                    "renameByDefault": rename,
                    "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
                }
            },
        }
        _set(values, "devicePlugin.config.create", True)
        _set(values, "devicePlugin.config.name", TIME_SLICING_CONFIGMAP if method == "timeSlicing" else MPS_CONFIGMAP)
        _set(values, "devicePlugin.config.default", TIME_SLICING_KEY)
        _set(values, "devicePlugin.config.data", {TIME_SLICING_KEY: yaml.safe_dump(config, sort_keys=False)})

    def cluster_counts(self, plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
        """nvidia.com/gpu (or .shared, renamed) x the replicas; one per GPU without sharing."""
        from installer.validate import cluster

        method, replicas, rename = plan.site.devicePlugin.sharing()
        return cluster.count_checks(objs, facts, replicas, rename,
                                    "MPS replicas" if method == "mps" else "time-slicing replicas")


FEATURE = DevicePluginSharing()
