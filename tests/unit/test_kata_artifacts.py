"""The Kata manager's runtime-class artifacts (kataManager.config.runtimeClasses[].artifacts.url, from v23.6): OCI
artifacts the manager pulls by URL, not component images. They are rendered into the private registry with the
site's pull secret, and `images` lists them when the Kata manager is deployed.

Found with the real v23.9.2 chart in the lab (tests/integration/test_real_chart.py): its ClusterPolicy named
nvcr.io for them, which an air-gapped site with sandbox workloads cannot pull.
"""

from __future__ import annotations

import pytest
import yaml

from installer.catalog import Catalog
from installer.config import parse_site
from installer.facts import Node
from installer.render.values import destination_ref
from tests.conftest import UPSTREAM, needs_upstream, plan_of

CATALOG = Catalog.default()
KATA = [r for r in CATALOG.releases() if CATALOG.get(r).kata_runtime_classes]


def site(release: str, **over):
    data = {"operator": {"version": release},
            "registry": {"host": "registry.lab:5000", "prefix": "mirror", "pullSecret": {"name": "gpu-registry"}},
            "driver": {"mode": "host"}}
    data.update(over)
    return parse_site(data)


def test_releases_with_kata_runtime_classes():
    assert KATA[0] == "v23.6.0" and "v25.10.1" in KATA and len(KATA) == 20, KATA


@pytest.mark.parametrize("release", KATA)
def test_artifacts_rendered_into_the_private_registry(release):
    plan = plan_of(site(release))
    classes = plan.values["kataManager"]["config"]["runtimeClasses"]
    chart = CATALOG.get(release).kata_runtime_classes
    assert [c["name"] for c in classes] == [c["name"] for c in chart]
    assert [c["nodeSelector"] for c in classes] == [c["nodeSelector"] for c in chart]
    for got, src in zip(classes, chart, strict=True):
        url = src["artifacts"]["url"]
        assert url.startswith("nvcr.io/nvidia/cloud-native/kata-gpu-artifacts:"), url
        assert got["artifacts"] == {"url": "registry.lab:5000/mirror/" + url.removeprefix("nvcr.io/"),
                                    "pullSecret": "gpu-registry"}


def test_no_pull_secret_keeps_the_chart_default():
    s = parse_site({"operator": {"version": "v23.9.2"}, "registry": {"host": "registry.lab:5000"}})
    classes = plan_of(s).values["kataManager"]["config"]["runtimeClasses"]
    assert {c["artifacts"]["pullSecret"] for c in classes} == {""}


def test_images_list_the_artifacts_only_when_the_kata_manager_is_deployed():
    nodes = [Node("a", "ubuntu", "22.04")]
    off = {i.source for i in plan_of(site("v23.9.2"), nodes).images}
    assert not any("kata" in i for i in off), off
    on = plan_of(site("v23.9.2", sandboxWorkloads={"enabled": True}, components={"kataManager": {"enabled": True}}),
                 nodes).images
    kata = {i.source: i.destination for i in on if "kata-gpu-artifacts" in i.source}
    assert kata == {
        "nvcr.io/nvidia/cloud-native/kata-gpu-artifacts:ubuntu22.04-535.54.03":
            "registry.lab:5000/mirror/nvidia/cloud-native/kata-gpu-artifacts:ubuntu22.04-535.54.03",
        "nvcr.io/nvidia/cloud-native/kata-gpu-artifacts:ubuntu22.04-535.86.10-snp":
            "registry.lab:5000/mirror/nvidia/cloud-native/kata-gpu-artifacts:ubuntu22.04-535.86.10-snp",
    }


@pytest.mark.parametrize("ref, layout, want", [
    ("nvcr.io/nvidia/a:1.0", "strip-host", "reg:5000/nvidia/a:1.0"),
    ("nvcr.io/nvidia/a:1.0", "keep-host", "reg:5000/nvcr.io/nvidia/a:1.0"),
    ("nvcr.io:443/nvidia/a", "keep-host", "reg:5000/nvcr.io:443/nvidia/a"),
    ("nvcr.io/nvidia/a@sha256:" + "0" * 64, "strip-host", "reg:5000/nvidia/a@sha256:" + "0" * 64),
    ("reg:5000/own/a:2", "strip-host", "reg:5000/own/a:2"),
])
def test_destination_ref(ref, layout, want):
    registry = parse_site({"operator": {"version": "v23.9.2"},
                           "registry": {"host": "reg:5000", "layout": layout}}).registry
    assert destination_ref(ref, registry) == want


@needs_upstream
@pytest.mark.parametrize("release", CATALOG.releases())
def test_catalog_holds_the_charts_runtime_classes(release):
    values = yaml.safe_load((UPSTREAM / "values" / f"{release}.yaml").read_text())
    chart = ((values.get("kataManager") or {}).get("config") or {}).get("runtimeClasses") or []
    assert CATALOG.get(release).kata_runtime_classes == chart
