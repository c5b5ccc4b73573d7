"""The chart's CRDs: which ones helm would install (crds/ of the chart and of its enabled subcharts, read from
`helm template --include-crds`), and `operator uninstall --purge-crds` refusing while custom resources are left.
The API side runs against the lab (tests/integration/test_operator_crds.py); here kube and helm are stubbed."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer import helm, kube, operator
from installer.config import parse_site
from installer.errors import EXIT_PREFLIGHT, ConfigError, PreflightError
from installer.tools import find_helm
from tests.conftest import UPSTREAM, need, plan_of

CHARTS = UPSTREAM.parent / "charts"

RENDERED = """---
# Source: gpu-operator/crds/nvidia.com_clusterpolicies_crd.yaml
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: clusterpolicies.nvidia.com}
---
# Source: gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: nodefeatures.nfd.k8s-sigs.io}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: nodefeaturerules.nfd.k8s-sigs.io}
---
# Source: gpu-operator/charts/node-feature-discovery/templates/nodefeaturerule-crd.yaml
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: templated.nfd.k8s-sigs.io}
---
# Source: gpu-operator/templates/clusterpolicy.yaml
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
"""


def test_split_crds_takes_crds_dirs_of_chart_and_subcharts_with_every_document():
    names = [c["metadata"]["name"] for c in helm.split_crds(RENDERED)]
    assert names == ["clusterpolicies.nvidia.com", "nodefeatures.nfd.k8s-sigs.io", "nodefeaturerules.nfd.k8s-sigs.io"]


@pytest.mark.parametrize(("source", "want"), [
    ("gpu-operator/crds/a.yaml", True),
    ("gpu-operator/crds/sub/a.yaml", True),
    ("gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml", True),
    ("gpu-operator/charts/x/charts/y/crds/a.yaml", True),
    ("gpu-operator/templates/crds.yaml", False),
    ("gpu-operator/charts/node-feature-discovery/templates/topologyupdater-crds.yaml", False),
    ("gpu-operator/charts/crds/templates/a.yaml", False),
])
def test_crd_source(source, want):
    assert helm._crd_source(source) is want


@pytest.mark.helm
@pytest.mark.parametrize(("version", "nfd", "want"), [
    ("v1.11.0", True, ["clusterpolicies.nvidia.com"]),
    ("v22.9.2", True, ["clusterpolicies.nvidia.com"]),  # its NFD NodeFeatureRule CRD is a template (a release resource)
    ("v23.9.2", True, ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "nodefeatures.nfd.k8s-sigs.io",
                       "nodefeaturerules.nfd.k8s-sigs.io"]),
    ("v23.9.2", False, ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"]),
    ("v25.10.1", True, ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "nodefeatures.nfd.k8s-sigs.io",
                        "nodefeaturegroups.nfd.k8s-sigs.io", "nodefeaturerules.nfd.k8s-sigs.io"]),
])
def test_real_charts_crds(version, nfd, want):
    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")
    tgz = CHARTS / f"gpu-operator-{version}.tgz"
    need(tgz.is_file(), f"real chart {tgz} not found")
    assert [c["metadata"]["name"] for c in helm.chart_crds(tgz, {"nfd": {"enabled": nfd}})] == want


# ---------------------------------------------------------------- --purge-crds (kube and helm stubbed)


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text("x")
    calls: list[str] = []
    state = {"crs": [], "crds": ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"]}
    monkeypatch.setattr(kube, "resolve_kubeconfig", lambda _p: kc)
    monkeypatch.setattr(kube, "api_client", lambda _p: object())
    monkeypatch.setattr(kube, "namespace_phase", lambda _c, _n: "Active")
    monkeypatch.setattr(kube, "delete_secret_if_ours", lambda *_: False)
    monkeypatch.setattr(kube, "delete_object_if_ours", lambda *_: False)  # the driver package-source ConfigMaps
    monkeypatch.setattr(kube, "custom_resources", lambda _c, names: list(state["crs"]))
    monkeypatch.setattr(kube, "delete_crds", lambda _c, names, timeout: calls.append("delete_crds") or list(names))
    monkeypatch.setattr(helm, "chart_crds", lambda *_a: [{"metadata": {"name": n}} for n in state["crds"]])

    def uninstall(*_a, **_k):
        calls.append("helm uninstall")
        state["crs"] = [c for c in state["crs"] if "meta.helm.sh/release-name" not in c[1]]
        return True

    monkeypatch.setattr(helm, "uninstall", uninstall)
    chart = tmp_path / "chart.tgz"
    chart.write_bytes(b"")
    plan = plan_of(parse_site({"operator": {"version": "v23.9.2", "namespace": "gpu-operator"},
                                "registry": {"host": "registry.lab:5000"}}), nodes=[])
    return {"plan": plan, "calls": calls, "state": state, "chart": chart}


OWNED = {"meta.helm.sh/release-name": "gpu-operator", "meta.helm.sh/release-namespace": "gpu-operator"}


def test_purge_refused_before_anything_when_a_foreign_resource_is_left(stubbed):
    stubbed["state"]["crs"] = [("ClusterPolicy/cluster-policy", OWNED), ("NVIDIADriver/default", {}),
                               ("NodeFeature/nfd/node1", {})]
    with pytest.raises(PreflightError) as err:
        operator.uninstall(stubbed["plan"], None, yes=True, purge_crds=True, chart_ref=stubbed["chart"])
    assert err.value.exit_code == EXIT_PREFLIGHT
    assert "NVIDIADriver/default" in err.value.message and "NodeFeature/nfd/node1" in err.value.message
    assert "ClusterPolicy/cluster-policy" not in err.value.message  # the release's own: helm uninstall deletes it
    assert "nothing was changed" in err.value.message
    assert stubbed["calls"] == []


def test_purge_deletes_crds_after_the_release(stubbed):
    stubbed["state"]["crs"] = [("ClusterPolicy/cluster-policy", OWNED)]
    rep = operator.uninstall(stubbed["plan"], None, yes=True, purge_crds=True, chart_ref=stubbed["chart"])
    assert stubbed["calls"] == ["helm uninstall", "delete_crds"]
    assert "CRDs: deleted clusterpolicies.nvidia.com, nvidiadrivers.nvidia.com" in rep.lines()


def test_purge_refused_after_the_release_when_a_resource_stays(stubbed, monkeypatch):
    stubbed["state"]["crs"] = [("ClusterPolicy/cluster-policy", OWNED)]
    monkeypatch.setattr(helm, "uninstall", lambda *_a, **_k: stubbed["calls"].append("helm uninstall") or True)
    with pytest.raises(PreflightError) as err:  # e.g. a finalizer kept the release's own resource
        operator.uninstall(stubbed["plan"], None, yes=True, purge_crds=True, chart_ref=stubbed["chart"])
    assert "ClusterPolicy/cluster-policy" in err.value.message and "release is already uninstalled" in err.value.message
    assert stubbed["calls"] == ["helm uninstall"]


def test_without_purge_the_crds_stay_and_the_output_says_so(stubbed):
    stubbed["state"]["crs"] = [("NVIDIADriver/default", {})]
    rep = operator.uninstall(stubbed["plan"], None, yes=True)
    assert stubbed["calls"] == ["helm uninstall"]
    assert any(line.startswith("CRDs: kept") for line in rep.lines())


def test_purge_without_a_chart_is_exit_2_before_anything(stubbed):
    with pytest.raises(ConfigError):
        operator.uninstall(stubbed["plan"], None, yes=True, purge_crds=True, chart_ref=None)
    with pytest.raises(ConfigError):
        operator.uninstall(stubbed["plan"], None, yes=True, purge_crds=True, chart_ref=Path("/nonexistent.tgz"))
    assert stubbed["calls"] == []


def test_crd_lines():
    assert operator.crd_lines([("a", "created"), ("b", "unchanged")], would=True) == [
        "CRD a: would be created (server-side apply, field manager gpu-install, dry run)",
        "CRD b: unchanged (server-side apply, field manager gpu-install, dry run)"]
