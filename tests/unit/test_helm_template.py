"""Rendered values through the real helm binary (pyhelm3) and a fixture chart (stand-in)."""

from __future__ import annotations

import pytest
import yaml

from installer.config import parse_site
from installer.tools import find_helm
from tests.conftest import ROOT, need, plan_of

CHART = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"
pytestmark = pytest.mark.helm


@pytest.fixture(autouse=True)
def helm_binary():
    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")


def images_and_secrets(resources):
    """(image, pull secret names) for every container and ClusterPolicy entry."""
    out = []
    for r in resources:
        if r["kind"] in ("Deployment", "DaemonSet"):
            spec = r["spec"]["template"]["spec"]
            names = [s["name"] for s in spec.get("imagePullSecrets", [])]
            for c in spec["containers"]:
                out.append((c["image"], names))
                for e in c.get("env", []):
                    if e["name"].endswith("_IMAGE"):
                        out.append((e["value"], names))
        elif r["kind"] == "ClusterPolicy":
            for entry in (r["spec"] or {}).values():
                out.append((entry["image"], entry["imagePullSecrets"]))
    return out


@pytest.mark.parametrize("release", ["v1.11.0", "v23.9.2", "v24.9.2", "v25.10.1", "v26.7.0"])
def test_helm_template_with_rendered_values(release):
    from installer.helm import template

    site = parse_site({
        "operator": {"version": release},
        "registry": {"host": "registry.lab:5000", "prefix": "gpu", "pullSecret": {"name": "gpu-registry"}},
        "devicePlugin": {"timeSlicing": {"replicas": 2}} if release != "v1.11.0" else {},
    })
    resources = template(CHART, plan_of(site).values)
    pairs = images_and_secrets(resources)
    assert len(pairs) >= 10
    for image, secrets in pairs:
        assert image.startswith("registry.lab:5000/gpu/"), image
        assert secrets == ["gpu-registry"], image
    kinds = {r["kind"] for r in resources}
    assert {"Deployment", "DaemonSet", "ClusterPolicy"} <= kinds
    if release != "v1.11.0":
        cm = next(r for r in resources if r["kind"] == "ConfigMap")
        assert yaml.safe_load(cm["data"]["any"])["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 2


def test_helm_template_catches_an_unrewritten_image():
    """The check above can fail: without our values the chart's defaults point at upstream."""
    from installer.helm import template

    pairs = images_and_secrets(template(CHART, {}))
    assert any(not img.startswith("registry.lab:5000/") for img, _ in pairs)


def test_real_chart_creates_the_mps_config():
    """NVIDIA's real v24.9.2 chart (../shared/upstream/charts) renders the device plugin ConfigMap our MPS values ask
    for and points the ClusterPolicy's device plugin at it (the MPS root is the operator's own default there)."""
    from installer.helm import template
    from tests.conftest import UPSTREAM

    chart = UPSTREAM.parent / "charts" / "gpu-operator-v24.9.2.tgz"
    need(chart.is_file(), f"the real chart is not at {chart}")
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "devicePlugin": {"mps": {"replicas": 3}}})
    resources = template(chart, plan_of(site).values)
    (cm,) = [r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "mps-config"]
    assert yaml.safe_load(cm["data"]["any"])["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu",
                                                                                   "replicas": 3}]
    (policy,) = [r for r in resources if r["kind"] == "ClusterPolicy"]
    plugin = policy["spec"]["devicePlugin"]
    assert plugin["config"] == {"name": "mps-config", "default": "any"}


def test_real_chart_ships_the_custom_mig_configs():
    """mig.customConfigs through NVIDIA's real v24.9.2 chart: its ConfigMap with all-disabled and the site's configs
    (mig-parted's format), named in the ClusterPolicy's migManager.config with the site's default."""
    from installer.helm import template
    from tests.conftest import UPSTREAM

    chart = UPSTREAM.parent / "charts" / "gpu-operator-v24.9.2.tgz"
    need(chart.is_file(), f"the real chart is not at {chart}")
    half = [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
            {"devices": [2, 3], "mig-enabled": False}]
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "mig": {"strategy": "mixed", "config": "half", "customConfigs": {"half": half}}})
    resources = template(chart, plan_of(site).values)
    (cm,) = [r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "gpu-install-mig-parted-config"]
    doc = yaml.safe_load(cm["data"]["config.yaml"])
    assert doc["version"] == "v1" and list(doc["mig-configs"]) == ["all-disabled", "half"]
    assert doc["mig-configs"]["half"][0] == half[0]
    assert doc["mig-configs"]["half"][1]["mig-enabled"] is False
    (policy,) = [r for r in resources if r["kind"] == "ClusterPolicy"]
    assert policy["spec"]["migManager"]["config"] == {"name": "gpu-install-mig-parted-config", "default": "half"}
