"""mig.customConfigs: the site's own mig-parted configs, checked against the GPU models' profiles (from mig-parted
facts) and shipped as the operator's MIG ConfigMap."""

from __future__ import annotations

import pytest
import yaml

from installer import mig
from installer.config import MigDevices, parse_site
from installer.errors import ConfigError
from tests.conftest import UPSTREAM, need, plan_of

BASE = {"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"}}


def entries(*docs):
    return [MigDevices.model_validate(d) for d in docs]


def model(name):
    return next(m for m in mig.models() if m.name == name)


def test_every_default_layout_of_the_operator_fits_its_models():
    """The operator's own default configs (gpu-operator v26.7.0's ConfigMap) pass the same check for every model they
    are listed for: the check refuses nothing NVIDIA ships."""
    path = UPSTREAM.parent / "mig-parted" / "configs" / "gpu-operator_v26.7.0_0400_configmap.yaml"
    need(path.is_file(), f"no upstream MIG facts at {path}")
    configs = yaml.safe_load(yaml.safe_load(path.read_text())["data"]["config.yaml"])["mig-configs"]
    checked = 0
    for m in mig.models():
        for name in sorted(m.configs):
            problem = mig.misfit(m, entries(*configs[name]))
            assert problem is None, (m.name, name, problem)
            checked += 1
    assert checked > 80


@pytest.mark.parametrize("gpu,layout,expect", [
    ("A100-80GB", {"3g.40gb": 3}, "fits at most 2 x 3g.40gb, not 3"),
    ("A100-80GB", {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, "needs 8 compute slices, A100-80GB has 7"),
    ("A100-80GB", {"3g.40gb": 2, "1g.10gb": 1}, "needs 9 memory slices, A100-80GB has 8"),
    ("A100-40GB", {"1g.10gb": 4, "1g.5gb": 1}, "needs 9 memory slices"),
    ("A30-24GB", {"2g.12gb": 2, "1g.6gb": 1}, "needs 5 compute slices, A30-24GB has 4"),
    ("H100-80GB", {"1g.5gb": 1}, "has no MIG profile 1g.5gb"),
])
def test_layouts_that_do_not_fit_say_why(gpu, layout, expect):
    problem = mig.misfit(model(gpu), entries({"devices": "all", "mig-enabled": True, "mig-devices": layout}))
    assert problem is not None and expect in problem, problem


def test_device_filter_limits_an_entry_to_its_models():
    h100 = sorted(model("H100-80GB").device_ids)[0]
    e = entries({"devices": "all", "device-filter": h100, "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                {"devices": "all", "device-filter": ["0x20B010DE"], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}})
    assert mig.misfit(model("H100-80GB"), e) is None and mig.misfit(model("A100-40GB"), e) is None
    assert mig.misfit(model("A30-24GB"), e) is None  # neither entry names an A30: mig-parted leaves it alone


def test_site_configs_render_and_names_are_checked():
    half = [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
            {"devices": [2, 3], "mig-enabled": False}]
    site = parse_site({**BASE, "mig": {"strategy": "mixed", "config": "half", "customConfigs": {"half": half}}})
    cfg = plan_of(site).values["migManager"]["config"]
    assert cfg["name"] == mig.CUSTOM_CONFIGMAP and cfg["create"] is True and cfg["default"] == "half"
    doc = yaml.safe_load(cfg["data"]["config.yaml"])
    assert doc["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    with pytest.raises(ConfigError) as exc:  # the default configs are gone with a site ConfigMap
        plan_of(parse_site({**BASE, "mig": {"config": "all-1g.10gb", "customConfigs": {"half": half}}}))
    assert "all-1g.10gb is not in mig.customConfigs (half) nor all-disabled" in exc.value.message
    with pytest.raises(ConfigError) as exc:
        plan_of(parse_site({**BASE, "mig": {"customConfigs": {"x": [{"mig-enabled": True,
                                                                     "mig-devices": {"3g.20gb": 1, "3g.40gb": 1}}]}}}))
    assert "mig.customConfigs.x: no MIG-capable GPU model can take it: no model has all of its profiles" in \
        exc.value.message and "3g.40gb: A100-80GB, H100-80GB" in exc.value.message
    with pytest.raises(ConfigError) as exc:
        plan_of(parse_site({**BASE, "operator": {"version": "v23.9.2"}, "mig": {"customConfigs": {"half": half}}}))
    assert "mig.customConfigs: not available in GPU Operator v23.9.2" in exc.value.message
    assert "mig.configMap" in exc.value.message


@pytest.mark.parametrize("bad,expect", [
    ({"half": [{"mig-enabled": False, "mig-devices": {"1g.10gb": 1}}]}, "turn MIG on for these GPUs"),
    ({"half": [{"devices": [0, 0], "mig-enabled": True}]}, "distinct GPU indices"),
    ({"half": [{"mig-enabled": True, "mig-devices": {"1g.10": 1}}]}, "is not a MIG profile"),
    ({"half": [{"mig-enabled": True, "device-filter": "0x20B0"}]}, "is not a PCI device ID"),
    ({"bad name": [{"mig-enabled": True}]}, "is not a valid label value"),
    ({"half": []}, "no entries"),
])
def test_bad_custom_configs_are_exit_2_naming_the_field(bad, expect):
    with pytest.raises(ConfigError) as exc:
        parse_site({**BASE, "mig": {"customConfigs": bad}})
    assert exc.value.exit_code == 2 and "mig.customConfigs" in exc.value.message and expect in exc.value.message, \
        exc.value.message


def test_custom_config_checked_against_the_node_gpu():
    half = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]
    site = parse_site({**BASE, "mig": {"config": "half", "customConfigs": {"half": half}}})
    a = mig.Assignment("gpu1", "gpu1", "half", "site mig.config")
    rel = plan_of(site).release
    assert mig.check_node(site, rel, a, {mig.PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}) is None
    problem = mig.check_node(site, rel, a, {mig.PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"})
    assert problem and "mig.customConfigs.half entry 0: A100-40GB has no MIG profile 3g.40gb" in problem, problem
    off = mig.Assignment("gpu1", "gpu1", "all-disabled", "site mig.config")
    assert mig.check_node(site, rel, off, {mig.PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}) is None
