"""`upgrade plan`, the release side (installer.upgrade.release) with NVIDIA's REAL charts (../shared/upstream/charts)
rendered by helm, the catalog, and kubernetes-validate's shipped API schemas. Expected values are the catalog's and
the charts' own facts, written out here."""

from __future__ import annotations

import copy
import time

import pytest

from installer import helm
from installer.catalog import Catalog
from installer.config import parse_site
from installer.tools import find_helm
from installer.upgrade import release as up
from installer.upgrade.model import CurrentRelease
from tests.conftest import BASE_SITE, UPSTREAM, need, plan_of

CHARTS = UPSTREAM.parent / "charts"


def chart(version: str) -> str:
    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")
    tgz = CHARTS / f"gpu-operator-{version}.tgz"
    need(tgz.is_file(), f"real chart {tgz} not found")
    return str(tgz)


def plan(version: str, **extra):
    data = copy.deepcopy(BASE_SITE)
    data["operator"]["version"] = version
    data.update(extra)
    return plan_of(parse_site(data))


def deployed(version: str, **extra) -> CurrentRelease:
    """A release as `gpu-install apply` deploys it: the rendered values, the chart's CRDs."""
    p = plan(version, **extra)
    crds = {c["metadata"]["name"]: c for c in helm.chart_crds(chart(version), p.values)}
    return CurrentRelease("gpu-operator", "gpu-operator", 2, version, p.values, crds)


def rows(report) -> dict[str, tuple[str | None, str | None]]:
    return {c.component: (c.current, c.target) for c in report.changes}


# ---------------------------------------------------------------- real charts, end to end


@pytest.mark.helm
def test_v22_9_2_to_v23_9_2_components_values_and_crds():
    t0 = time.monotonic()
    r = up.release_report(plan("v23.9.2"), deployed("v22.9.2"), "v1.27.3", None, chart=chart("v23.9.2"))
    seconds = time.monotonic() - t0
    t = rows(r)
    assert t["chart"] == ("gpu-operator-v22.9.2", "gpu-operator-v23.9.2")
    assert t["driver"] == ("operator 525.60.13", "operator 550.54.14")
    assert t["toolkit"] == ("v1.11.0-ubuntu20.04", "v1.14.6-ubuntu20.04")
    assert t["image operator"] == ("registry.lab:5000/nvidia/gpu-operator:v22.9.2",
                                   "registry.lab:5000/nvidia/gpu-operator:v23.9.2")
    assert t["image node-feature-discovery"] == ("registry.lab:5000/nfd/node-feature-discovery:v0.10.1",
                                                 "registry.lab:5000/nfd/node-feature-discovery:v0.14.2")
    assert r.driver_changes and r.toolkit_changes
    assert "~ driver.version: 525.60.13 -> 550.54.14 (release default)" in r.values_diff
    assert "~ operator.version: v22.9.2 -> v23.9.2 (release default)" in r.values_diff
    assert not [line for line in r.values_diff if line.endswith("(site)")]  # the same site on both sides
    # CRDs: v23.9.2 brings the NVIDIADriver CRD and NFD's own; ClusterPolicy gains ccManager and cdi
    assert "+ CRD nvidiadrivers.nvidia.com: new (v1alpha1)" in r.crd_changes
    assert "+ CRD nodefeatures.nfd.k8s-sigs.io: new (v1alpha1)" in r.crd_changes
    cp = [line for line in r.crd_changes if line.startswith("~ CRD clusterpolicies.nvidia.com")]
    assert any("fields added" in x and "spec.ccManager" in x and "spec.cdi" in x for x in cp), cp
    assert any("fields removed" in x and "spec.driver.env[].valueFrom" in x for x in cp), cp
    # v22.9 → v23.9 skips the v23.3 and v23.6 majors (NVIDIA: YY.MM is the major version)
    [hop] = [b for b in r.blockers if "skips" in b.what]
    assert "v23.3, v23.6" in hop.what and "v23.3.2 → v23.6.2" in hop.fix
    assert any("rendered objects checked against the Kubernetes 1.27 API schemas" in f for f in r.findings)
    assert seconds < 30


@pytest.mark.helm
def test_v23_9_2_to_v24_9_2_on_kubernetes_1_20_is_blocked_by_range_and_grpc_probes():
    r = up.release_report(plan("v24.9.2"), deployed("v23.9.2"), "v1.20.15", None, chart=chart("v24.9.2"),
                          allow_skip=True)
    what = [b.what for b in r.blockers]
    assert any(w.startswith("cluster (Kubernetes v1.20.15): Kubernetes 1.20 cannot run GPU Operator v24.9.2: it "
                            "needs Kubernetes ≥ 1.24") for w in what), what
    grpc = [w for w in what if "gRPC probes need Kubernetes 1.24" in w]
    assert ("Deployment gpu-operator/gpu-operator-node-feature-discovery-master: spec.template.spec.containers[master]"
            ".livenessProbe.grpc: gRPC probes need Kubernetes 1.24 or newer (the cluster runs 1.20)") in grpc
    assert any(w.startswith("DaemonSet gpu-operator/gpu-operator-node-feature-discovery-worker") for w in grpc)
    # allow_skip: the skipped majors are named as a finding, not a blocker
    assert not [w for w in what if "skips" in w]
    assert any("skips the major releases v24.3, v24.6" in f for f in r.findings)
    assert any("the oldest shipped; the cluster's 1.20 is older" in f for f in r.findings)


PSP = {"apiVersion": "policy/v1beta1", "kind": "PodSecurityPolicy", "metadata": {"name": "gpu-operator-restricted"},
       "spec": {}}


def test_psp_on_kubernetes_1_25_is_a_blocker_naming_the_object():
    [b], _ = up.schema_blockers([PSP], "1.25.2")
    assert b.what == "PodSecurityPolicy gpu-operator-restricted: policy/v1beta1 PodSecurityPolicy is not served by " \
                     "Kubernetes 1.25"
    # below the oldest shipped schema set (1.25) the API is served: not checked, said so, not a blocker
    blockers, findings = up.schema_blockers([PSP], "1.24.9")
    assert blockers == [] and findings[-1] == "not checked (no schema below Kubernetes 1.25): policy/v1beta1 " \
                                              "PodSecurityPolicy"


@pytest.mark.helm
def test_real_chart_rendered_for_the_cluster_version_psp_only_below_1_25():
    """The chart renders its PodSecurityPolicy by .Capabilities.KubeVersion: rendered for the cluster's version, a
    v22.9.2 release with psp.enabled has one on 1.24 and none on 1.25 -- neither is a blocker."""
    p = plan("v22.9.2", values={"psp": {"enabled": True}})
    on_124 = up.render(chart("v22.9.2"), p.values, "gpu-operator", "gpu-operator", "v1.24.3")
    on_125 = up.render(chart("v22.9.2"), p.values, "gpu-operator", "gpu-operator", "v1.25.0")
    assert [o["kind"] for o in on_124].count("PodSecurityPolicy") >= 1
    assert [o["kind"] for o in on_125].count("PodSecurityPolicy") == 0
    assert up.schema_blockers(on_125, "1.25.0")[0] == []
    assert up.schema_blockers(on_124, "1.24.3")[0] == []


@pytest.mark.helm
def test_real_v25_10_1_chart_on_kubernetes_1_30_pod_level_resources_in_a_post_delete_hook():
    """NFD 0.18.2 (in v25.10.1) puts `resources` on its prune Job's pod spec, a field Kubernetes 1.30 does not have
    (pod-level resources came in 1.32): a post-delete hook, which helm validates only when it fires -- a finding for
    the upgrade; the same object as a pre-upgrade hook is a blocker."""
    p = plan("v25.10.1")
    objects = up.render(chart("v25.10.1"), p.values, "gpu-operator", "gpu-operator", "v1.30.2")
    blockers, findings = up.schema_blockers(objects, "v1.30.2")
    assert blockers == [], blockers
    [prune] = [f for f in findings if "node-feature-discovery-prune" in f]
    assert prune.startswith("Job gpu-operator/gpu-operator-node-feature-discovery-prune: spec.template.spec: "
                            "Additional properties are not allowed ('resources' was unexpected)")
    assert "a post-delete hook" in prune
    job = copy.deepcopy(next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].endswith("-prune")))
    job["metadata"]["annotations"]["helm.sh/hook"] = "pre-upgrade"
    [b] = up.schema_blockers([job], "v1.30.2")[0]
    assert "'resources' was unexpected" in b.what
    assert up.schema_blockers([job], "v1.34.1")[0] == []  # the 1.34 schema has pod-level resources


def test_schema_version_picks_the_nearest_shipped_at_or_below():
    assert up.schema_version("v1.30.4")[0] == "1.30.0"
    assert up.schema_version("1.25.0")[0] == "1.25.0"
    v, note = up.schema_version("1.22.1")
    assert v is None and "oldest shipped" in note
    v, note = up.schema_version("1.99.0")
    assert v is not None and "newest shipped" in note


def test_schema_blockers_name_object_and_field():
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": "n"},
           "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}]}}}}
    cr = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cp"}, "spec": {"x": 1}}
    blockers, findings = up.schema_blockers([dep, cr], "1.28.0")
    [b] = blockers
    assert b.what.startswith("Deployment n/x: spec.template.spec.containers.0: Additional properties are not allowed "
                             "('bogus' was unexpected)")
    assert findings == ["1 rendered objects checked against the Kubernetes 1.28 API schemas"]


# ---------------------------------------------------------------- the hop


RELEASES = Catalog.default().releases()


@pytest.mark.parametrize(("cur", "tgt", "blocked", "said"), [
    ("v24.9.0", "v24.9.2", False, "a patch release"),
    ("v24.6.2", "v24.9.2", False, "the next major release"),
    ("v25.3.4", "v25.10.1", False, "the next major release"),
])
def test_hop_within_or_to_the_next_major_is_supported(cur, tgt, blocked, said):
    blockers, findings = up.hop_blockers(cur, tgt, RELEASES)
    assert blockers == [] and said in findings[0]


def test_hop_over_majors_names_them_and_the_releases_to_go_through():
    [b], _ = up.hop_blockers("v1.11.0", "v24.9.2", RELEASES)
    assert b.what == ("v1.11.0 → v24.9.2 skips the major releases v22.9, v23.3, v23.6, v23.9, v24.3, v24.6: NVIDIA "
                      "supports upgrades within a major release or to the next one only")
    assert b.fix.startswith("upgrade through v22.9.2 → v23.3.2 → v23.6.2 → v23.9.2 → v24.3.0 → v24.6.2 first")
    assert "set operator.version to v22.9.2" in b.fix


def test_a_downgrade_is_not_an_upgrade():
    [b], _ = up.hop_blockers("v24.9.2", "v23.9.2", RELEASES)
    assert "older than the deployed v24.9.2" in b.what and "CRDs are never downgraded" in b.what


# ---------------------------------------------------------------- values diff: site vs release, secrets


def test_values_diff_splits_site_and_release_defaults_and_redacts_secrets(monkeypatch):
    monkeypatch.setenv("LAB_REG_PASSWORD", "hunter2-very-secret")
    cur_site = {"values": {"devicePlugin": {"env": [{"name": "LOG_LEVEL", "value": "a"}]}}}
    cur = plan("v24.6.2", **cur_site)
    tgt_site = {
        "registry": {"host": "registry.lab:5000", "pullSecret": {
            "name": "gpu-registry", "usernameEnv": "LAB_REG_USER", "passwordEnv": "LAB_REG_PASSWORD"}},
        "values": {"devicePlugin": {"env": [{"name": "API_TOKEN", "value": "tok-123"}]},
                   "dcgmExporter": {"config": {"name": "hunter2-very-secret"}}}}
    tgt = plan("v24.9.2", **tgt_site)
    r = up.release_report(tgt, CurrentRelease("gpu-operator", "gpu-operator", 1, "v24.6.2", cur.values), "1.29.0",
                          None, chart="")
    diff = list(r.values_diff)
    text = "\n".join(diff)
    assert "~ driver.version: 550.90.07 -> 550.144.03 (release default)" in diff
    assert "~ devicePlugin.version: v0.16.2-ubi8 -> v0.17.0 (release default)" in diff
    assert '~ devicePlugin.env: [{"name":"LOG_LEVEL","value":"a"}] -> [{"name":"API_TOKEN","value":"***"}] (site)' \
        in diff
    assert '+ dcgmExporter.config: (unset) -> {"name":"***"} (site)' in diff  # a free-form map: compared whole
    assert "tok-123" not in text and "hunter2" not in text


def test_redact_value_keeps_secret_names_and_hides_contents():
    v = {"imagePullSecrets": ["gpu-registry"], "password": "p", "env": [{"name": "MY_TOKEN", "value": "t"}],
         "url": "https://u:pw@host/x"}
    assert up.redact_value(v) == {"imagePullSecrets": ["gpu-registry"], "password": "***",
                                  "env": [{"name": "MY_TOKEN", "value": "***"}], "url": "https://***@host/x"}


# ---------------------------------------------------------------- CRDs: fields existing custom resources would lose


@pytest.mark.helm
def test_fields_a_cluster_policy_uses_that_the_new_crd_drops_are_blockers():
    new = helm.chart_crds(chart("v23.9.2"), plan("v23.9.2").values)
    cp = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
          "spec": {"driver": {"enabled": True, "env": [{"name": "NODE", "valueFrom": {"fieldRef": {
              "fieldPath": "spec.nodeName"}}}]}, "operator": {"defaultRuntime": "containerd"}}}
    [b] = up.pruned_fields(new, {"clusterpolicies.nvidia.com": [cp]})
    assert b.what.startswith("ClusterPolicy cluster-policy: the target CRD clusterpolicies.nvidia.com drops field "
                             "spec.driver.env[].valueFrom that it sets")
    kept = copy.deepcopy(cp)
    kept["spec"]["driver"]["env"] = [{"name": "A", "value": "b"}]
    assert up.pruned_fields(new, {"clusterpolicies.nvidia.com": [kept]}) == []


def test_crd_diff_versions_and_storage():
    def crd(*versions, storage):
        return {"metadata": {"name": "x.example.com"}, "spec": {"versions": [
            {"name": v, "storage": v == storage, "schema": {"openAPIV3Schema": {"properties": {
                "spec": {"properties": {"a": {}, v: {}}}}}}} for v in versions]}}

    lines = up.crd_diff({"x.example.com": crd("v1alpha1", storage="v1alpha1")}, [crd("v1", storage="v1")])
    assert lines == ["+ CRD x.example.com: version v1", "- CRD x.example.com: version v1alpha1 removed",
                     "~ CRD x.example.com: storage version v1alpha1 -> v1",
                     "~ CRD x.example.com: 1 schema field added (spec.v1)",
                     "~ CRD x.example.com: 1 schema field removed (spec.v1alpha1)"]


# ---------------------------------------------------------------- apply --check


def test_apply_check_prints_the_values_diff_under_would_upgrade():
    from installer import operator

    rp = helm.ReleasePlan("upgrade", "gpu-operator-v24.9.2",
                          helm.ReleaseState("gpu-operator", "gpu-operator", 3, "deployed", "gpu-operator-v24.6.2"))
    rep = operator.PlanReport("gpu-operator", "Active", None, False, "gpu-operator", rp,
                              values_diff=["~ driver.version: 550.90.07 -> 550.144.03 (release default)"])
    lines = rep.lines()
    assert lines[-2].endswith("to chart gpu-operator-v24.9.2 with the rendered values; values deployed → rendered (1):")
    assert lines[-1] == "  ~ driver.version: 550.90.07 -> 550.144.03 (release default)"
