"""Render decisions that change across releases, and golden values for a few releases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from installer.config import parse_site
from installer.errors import ConfigError
from installer.render.values import values_to_yaml
from tests.conftest import plan_of

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("GPU_INSTALL_UPDATE_GOLDEN"))


def values_of(s):
    return plan_of(s).values


def site(release="v24.9.2", **over):
    data = {
        "operator": {"version": release},
        "registry": {"host": "registry.lab:5000", "pullSecret": {"name": "gpu-registry"}},
    }
    data.update(over)
    return parse_site(data)


@pytest.mark.parametrize(
    "name, release, over",
    [
        ("v1.11.0-docker-host-driver", "v1.11.0", {"runtime": "docker", "driver": {"mode": "host"}}),
        ("v23.9.1-precompiled", "v23.9.1", {"driver": {"mode": "precompiled"}, "toolkit": {"mode": "host"}}),
        ("v24.9.2-timeslicing-mig", "v24.9.2", {"devicePlugin": {"timeSlicing": {"replicas": 4}},
                                                 "mig": {"strategy": "mixed", "config": "all-1g.10gb"}}),
        ("v26.7.0-keep-host-cdi", "v26.7.0", {"registry": {"host": "reg.example:443", "layout": "keep-host",
                                                            "prefix": "mirror", "pullSecret": {"name": "pull"}},
                                               "cdi": {"enabled": False}, "driver": {"kernelModuleType": "open"}}),
    ],
)
def test_golden(name, release, over):
    s = site(release, **over)
    text = values_to_yaml(values_of(s), s)
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:  # an explicit, reviewed update: GPU_INSTALL_UPDATE_GOLDEN=1
        path.write_text(text)
    assert path.exists(), f"golden file {path.name} missing (run with GPU_INSTALL_UPDATE_GOLDEN=1 and review it)"
    assert text == path.read_text(), f"rendered values differ from {path} (GPU_INSTALL_UPDATE_GOLDEN=1 to accept)"


def test_driver_modes():
    assert values_of(site(driver={"mode": "operator"}))["driver"]["enabled"] is True
    for mode in ("host", "preinstalled"):
        assert values_of(site(driver={"mode": mode}))["driver"]["enabled"] is False
    v = values_of(site(driver={"mode": "precompiled"}))
    assert v["driver"]["usePrecompiled"] is True and v["driver"]["version"] == "550"
    assert values_of(site(toolkit={"mode": "host"}))["toolkit"]["enabled"] is False


def test_precompiled_needs_branch_and_a_release_that_has_it():
    with pytest.raises(ConfigError, match=r"(?s)driver.version: precompiled .* use driver.version: \"535\""):
        values_of(site(driver={"mode": "precompiled", "version": "535.104.05"}))
    with pytest.raises(ConfigError, match="precompiled drivers need v23.3.0"):
        values_of(site("v22.9.2", driver={"mode": "precompiled"}))


def test_default_runtime_only_where_the_release_has_it():
    assert values_of(site("v24.9.2", runtime="docker"))["operator"]["defaultRuntime"] == "docker"
    assert "defaultRuntime" not in values_of(site("v25.3.0"))["operator"]


def test_kernel_module_type_follows_the_rename():
    assert values_of(site("v25.3.0", driver={"kernelModuleType": "open"}))["driver"]["kernelModuleType"] == "open"
    v = values_of(site("v24.9.2", driver={"kernelModuleType": "proprietary"}))
    assert v["driver"]["useOpenKernelModules"] is False and "kernelModuleType" not in v["driver"]
    with pytest.raises(ConfigError, match="open kernel modules need v23.9.1"):
        values_of(site("v23.6.2", driver={"kernelModuleType": "open"}))


def test_time_slicing_config_map():
    v = values_of(site(devicePlugin={"timeSlicing": {"replicas": 4}}, mig={"strategy": "none"}))
    cfg = v["devicePlugin"]["config"]
    assert cfg["create"] is True and cfg["default"] == "any" and cfg["name"] == "time-slicing-config"
    inner = yaml.safe_load(cfg["data"]["any"])
    assert inner["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert inner["flags"]["migStrategy"] == "none"
    assert "config" not in values_of(site(devicePlugin={"timeSlicing": {"replicas": 1}})).get("devicePlugin", {})
    with pytest.raises(ConfigError, match="devicePlugin.timeSlicing: not available in GPU Operator v22.9.0"):
        values_of(site("v22.9.0", devicePlugin={"timeSlicing": {"replicas": 2}}))


def test_mps_config_map():
    """CUDA MPS through the same chart-created device plugin config (device plugin v0.15.0+, v24.3.0+)."""
    v = values_of(site(devicePlugin={"mps": {"replicas": 4, "renameByDefault": True}}, mig={"strategy": "single"}))
    cfg = v["devicePlugin"]["config"]
    assert cfg["create"] is True and cfg["default"] == "any" and cfg["name"] == "mps-config"
    inner = yaml.safe_load(cfg["data"]["any"])
    assert inner["sharing"] == {"mps": {"renameByDefault": True,
                                        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
    assert inner["flags"]["migStrategy"] == "single"
    assert "config" not in values_of(site(devicePlugin={"mps": {"replicas": 1}})).get("devicePlugin", {})
    # v23.9.2 pins device plugin v0.14.x: no MPS there
    with pytest.raises(ConfigError, match=r"devicePlugin.mps: not available in GPU Operator v23.9.2: MPS sharing "
                                          r"needs device plugin v0.15.0"):
        values_of(site("v23.9.2", devicePlugin={"mps": {"replicas": 2}}))
    # the device plugin refuses MPS with MIG mixed, and one sharing method at a time
    with pytest.raises(ConfigError, match="refuses MPS with mig.strategy mixed"):
        values_of(site(devicePlugin={"mps": {"replicas": 2}}, mig={"strategy": "mixed"}))
    with pytest.raises(ConfigError, match="timeSlicing and mps are both on"):
        site(devicePlugin={"mps": {"replicas": 2}, "timeSlicing": {"replicas": 2}})
    with pytest.raises(ConfigError, match="devicePlugin.mps.replicas"):
        site(devicePlugin={"mps": {"replicas": 49}})


def test_mig_config_is_checked_against_the_release():
    assert values_of(site(mig={"config": "all-1g.10gb"}))["migManager"]["config"]["default"] == "all-1g.10gb"
    with pytest.raises(ConfigError, match=r"mig.config: all-1g.11gb is not in .*nearest: .*all-1g.10gb"):
        values_of(site(mig={"config": "all-1g.11gb"}))
    v = values_of(site(mig={"config": "my-layout", "configMap": "site-mig"}))
    assert v["migManager"]["config"] == {"default": "my-layout", "name": "site-mig"}


def test_extra_values_are_merged_and_checked():
    v = values_of(site(values={"dcgmExporter": {"serviceMonitor": {"enabled": True}}, "operator": {"labels": {"a": "b"}}}))
    assert v["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    assert v["dcgmExporter"]["repository"].startswith("registry.lab:5000/")  # merge kept our keys
    with pytest.raises(ConfigError, match=r"does not accept these values keys: psp, psp.enabled"):
        values_of(site("v24.3.0", values={"psp": {"enabled": True}}))
    with pytest.raises(ConfigError, match=r"driver.useOpenKernelModules"):
        values_of(site("v25.3.0", values={"driver": {"useOpenKernelModules": True}}))


def test_component_overrides():
    v = values_of(site(components={"dcgm": {"enabled": True, "version": "3.3.9-1-ubuntu22.04"},
                                       "devicePlugin": {"repository": "nvcr.io/other"}}))
    assert v["dcgm"]["enabled"] is True
    assert v["devicePlugin"]["repository"] == "registry.lab:5000/other"
    with pytest.raises(ConfigError, match=r"components: nosuch not in GPU Operator v24.9.2"):
        values_of(site(components={"nosuch": {"enabled": True}}))
    with pytest.raises(ConfigError, match=r"components.driver.manager.enabled: .* no enabled switch"):
        values_of(site(components={"driver.manager": {"enabled": False}}))


def test_validator_moved_into_operator_image_in_v25_10():
    v = values_of(site("v25.10.0"))
    assert v["validator"]["image"] == "gpu-operator" and v["validator"]["repository"] == "registry.lab:5000/nvidia"
    assert values_of(site("v25.3.4"))["validator"]["image"] == "gpu-operator-validator"


def test_plan_effective_falls_back_to_chart_defaults():
    p = plan_of(site("v24.9.2"))
    assert p.effective("sandboxWorkloads.enabled") is False
    assert p.effective("driver.enabled") is True


@pytest.mark.parametrize("comps,modes,expect", [
    ({"toolkit": {"enabled": False}}, {"toolkit": {"mode": "operator"}}, "contradicts toolkit.mode: operator"),
    ({"toolkit": {"enabled": True}}, {"toolkit": {"mode": "host"}}, "contradicts toolkit.mode: host"),
    ({"driver": {"enabled": True}}, {"driver": {"mode": "host"}}, "contradicts driver.mode: host"),
])
def test_a_component_switch_that_the_mode_decides_is_not_silently_dropped(comps, modes, expect):
    """toolkit.mode / driver.mode decide toolkit.enabled / driver.enabled; an override saying otherwise used to be
    overwritten without a word."""
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"},
                       "components": comps, **modes})
    with pytest.raises(ConfigError) as exc:
        plan_of(site)
    assert expect in exc.value.message and "choose with" in (exc.value.hint or "")
    agree = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"},
                        "components": {"toolkit": {"enabled": True}}, "toolkit": {"mode": "operator"}})
    assert plan_of(agree).values["toolkit"]["enabled"] is True
