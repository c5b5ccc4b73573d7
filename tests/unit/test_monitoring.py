"""monitoring without a cluster: the site block, the operator values (through NVIDIA's real charts where
../shared/upstream/charts has them), the monitoring stage's objects, and validate's metrics checks on recorded
dcgm-exporter output (tests/fixtures/dcgm-exporter, provenance in its README)."""

from __future__ import annotations

import pytest
import yaml

from installer.config import load_site, parse_site
from installer.errors import ConfigError
from installer.facts import Node
from installer.features import monitoring
from installer.validate import metrics
from tests.conftest import ROOT, UPSTREAM, need, plan_of

NODES = [Node("gpu1", "ubuntu", "22.04", None, "gpu1")]
FIXTURES = ROOT / "tests" / "fixtures" / "dcgm-exporter"
CSV = (ROOT / "values" / "monitoring" / "dcgm-metrics.csv").read_text()


def site(version="v24.9.2", **mon):
    return parse_site({"operator": {"version": version}, "registry": {"host": "registry.lab:5000"},
                       "monitoring": {"enabled": True, **mon}})


@pytest.mark.parametrize("mon,expect", [
    ({"interval": "15"}, "monitoring.interval"),
    ({"scrape": "pushgateway"}, "monitoring.scrape"),
    ({"labels": {"release name": "x"}}, "is not a Kubernetes label key"),
    ({"labels": {"release": "a b"}}, "is not a Kubernetes label value"),
    ({"namespace": "Monitoring"}, "monitoring.namespace"),
    ({"enabled": "yes"}, "monitoring.enabled"),
])
def test_bad_monitoring_block_is_exit_2_naming_the_field(mon, expect):
    with pytest.raises(ConfigError) as exc:
        site(**mon)
    assert exc.value.exit_code == 2 and expect in exc.value.message, exc.value.message


def test_values_per_release_line():
    new = plan_of(site("v24.9.2"), NODES)
    assert new.values["dcgmExporter"]["enabled"] is True
    assert new.values["dcgmExporter"]["config"] == {"name": "gpu-install-dcgm-metrics", "create": True, "data": CSV}
    assert monitoring.configmaps_before_operator(new) == []
    old = plan_of(site("v23.9.2"), NODES)  # the chart only names the ConfigMap: gpu-install writes it
    assert old.values["dcgmExporter"]["config"] == {"name": "gpu-install-dcgm-metrics"}
    (cm,) = monitoring.configmaps_before_operator(old)
    assert (cm["metadata"]["namespace"], cm["data"]) == ("gpu-operator", {"dcgm-metrics.csv": CSV})
    v111 = plan_of(site("v1.11.0"), NODES)  # no switch: the exporter always runs
    assert "enabled" not in v111.values["dcgmExporter"]
    off = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}}), NODES)
    assert "config" not in off.values.get("dcgmExporter", {})
    with pytest.raises(ConfigError, match="components.dcgmExporter.enabled: false contradicts monitoring.enabled"):
        plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                            "monitoring": {"enabled": True}, "components": {"dcgmExporter": {"enabled": False}}}),
                NODES)


def test_site_metrics_file_is_relative_to_the_site_and_checked(tmp_path):
    (tmp_path / "mine.csv").write_text("# ours\nDCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization\n")
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"},
                                                        "registry": {"host": "registry.lab:5000"},
                                                        "monitoring": {"enabled": True, "metrics": "mine.csv"}}))
    s = load_site(tmp_path / "site.yaml")
    assert s.monitoring.metrics == tmp_path / "mine.csv"
    assert plan_of(s, NODES).values["dcgmExporter"]["config"]["data"].endswith("GPU utilization\n")
    for bad, expect in (("DCGM_FI_DEV_GPU_UTIL, gauge, util, in %\n", "line 1: dcgm-exporter needs exactly 3 fields"),
                        ("GPU_UTIL, gauge, x\n", "'GPU_UTIL' is not a DCGM field name"),
                        ("DCGM_FI_DEV_GPU_UTIL, number, x\n", "type 'number'"),
                        ("# only comments\n", "no metric in it")):
        (tmp_path / "mine.csv").write_text(bad)
        with pytest.raises(ConfigError) as exc:
            plan_of(load_site(tmp_path / "site.yaml"), NODES)
        assert expect in exc.value.message and "mine.csv" in exc.value.message, exc.value.message
    doc = yaml.safe_load((tmp_path / "site.yaml").read_text())
    doc["operator"]["version"] = "v23.9.2"  # the chart only names the ConfigMap there: still checked at render
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="no metric in it"):
        plan_of(load_site(tmp_path / "old.yaml"), NODES)
    (tmp_path / "mine.csv").unlink()
    with pytest.raises(ConfigError, match="monitoring.metrics"):
        plan_of(load_site(tmp_path / "site.yaml"), NODES)


def test_service_monitor_objects():
    s = site(labels={"release": "kube-prometheus-stack"}, interval="30s", namespace="obs")
    sm, rule, dash = monitoring.objects(s, "serviceMonitor")
    assert (sm["kind"], sm["metadata"]["namespace"]) == ("ServiceMonitor", "obs")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["jobLabel"] == "app"  # job nvidia-dcgm-exporter, as the operator's own ServiceMonitor
    assert sm["spec"]["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    assert sm["spec"]["endpoints"] == [{"port": "gpu-metrics", "path": "/metrics", "interval": "30s",
                                        "honorLabels": True}]
    assert rule["kind"] == "PrometheusRule" and rule["spec"] == yaml.safe_load(
        (ROOT / "values" / "monitoring" / "alerts.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert dash["kind"] == "ConfigMap" and dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["data"]["gpu-install-gpus.json"] == (ROOT / "values" / "monitoring" / "dashboard.json").read_text()
    every = [o["metadata"]["labels"]["app.kubernetes.io/managed-by"] for o in (sm, rule, dash)]
    assert every == ["gpu-install"] * 3  # uninstall removes only what carries it


def test_plain_scrape_config_objects_and_files(tmp_path):
    s = site(files=str(tmp_path / "prom"))
    scrape, rules, _dash = monitoring.objects(s, "config")
    job = yaml.safe_load(scrape["data"]["gpu-install-dcgm-scrape.yaml"])["scrape_configs"][0]
    assert job["job_name"] == "nvidia-dcgm-exporter" and job["honor_labels"] is True
    assert job["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": ["gpu-operator"]}}]
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keeps == {("__meta_kubernetes_service_name",): "nvidia-dcgm-exporter",
                     ("__meta_kubernetes_endpoint_port_name",): "gpu-metrics"}
    assert yaml.safe_load(rules["data"]["gpu-install-gpu-alerts.yaml"])["groups"]
    written = monitoring.write_files(s)
    assert sorted(p.name for p in written) == ["gpu-install-dcgm-scrape.yaml", "gpu-install-gpu-alerts.yaml"]
    assert monitoring.write_files(s) == []  # unchanged: not rewritten


def test_every_alert_names_the_scrape_job_the_objects_make():
    rules = monitoring.alert_rules()
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert exprs and all(f'job="{monitoring.JOB}"' in e for e in exprs), [e for e in exprs if monitoring.JOB not in e]
    assert all(f'job=\\"{monitoring.JOB}\\"' in q or f'job="{monitoring.JOB}"' in q
               for q in monitoring.dashboard_queries()), "a dashboard query selects another job"


@pytest.mark.helm
@pytest.mark.parametrize("version", ["v23.9.2", "v24.9.2", "v25.10.1"])
def test_real_chart_points_the_exporter_at_the_metrics(version):
    """NVIDIA's real charts: from v24.9.0 the chart makes the ConfigMap from our CSV (key dcgm-metrics.csv, which
    the operator mounts); below it passes dcgmExporter.config on to the ClusterPolicy, naming the one gpu-install
    writes before the release."""
    from installer.helm import template
    from installer.tools import find_helm

    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")
    chart = UPSTREAM.parent / "charts" / f"gpu-operator-{version}.tgz"
    need(chart.is_file(), f"the real chart is not at {chart}")
    plan = plan_of(site(version), NODES)
    resources = template(chart, plan.values)
    (policy,) = [r for r in resources if r["kind"] == "ClusterPolicy"]
    assert policy["spec"]["dcgmExporter"]["config"]["name"] == "gpu-install-dcgm-metrics"
    assert policy["spec"]["dcgmExporter"]["enabled"] is True
    cms = [r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "gpu-install-dcgm-metrics"]
    if monitoring.creates_configmap(plan.release):
        assert [cm["data"]["dcgm-metrics.csv"].strip() for cm in cms] == [CSV.strip()]
    else:
        assert cms == [] and monitoring.configmaps_before_operator(plan)


# ---------------------------------------------------------------- validate's metrics checks on recorded output


def scrape(name: str) -> metrics.Scrape:
    return metrics.parse((FIXTURES / name).read_text())


# facts of the recorded output (tests/fixtures/dcgm-exporter/README.md): node-a.prom is the LKE RTX 4000 Ada recording
# (GPU 0, its series attributed to pod default/cuda-75454ffb9f-8ljq7) plus a second GPU made from it
NODE_A_GPUS = ["GPU-00000000-0000-0000-0000-00000000a001", "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c"]
NODE_A_POD = ("default", "cuda-75454ffb9f-8ljq7")


def test_recorded_output_passes_gpus_core_and_attribution():
    a = scrape("node-a.prom")
    assert sorted(a.gpus) == NODE_A_GPUS and a.pods == {NODE_A_POD}, (a.gpus, a.pods)
    checks = {c.check: c for c in metrics.node_checks("node-a", a, NODE_A_GPUS, None, [NODE_A_POD])}
    assert {k: c.status for k, c in checks.items()} == {"metrics.gpus": "pass", "metrics.core": "pass",
                                                         "metrics.attribution": "pass"}, checks


def test_missing_gpu_missing_core_metric_and_unattributed_pod_fail():
    a = scrape("node-a.prom")
    uuids = NODE_A_GPUS
    got = {c.check: c for c in metrics.node_checks("n", a, [*uuids, "GPU-gone"], None, [("ml", "not-there")])}
    assert got["metrics.gpus"].status == "fail" and "GPU-gone" in got["metrics.gpus"].message
    assert got["metrics.attribution"].status == "fail" and "ml/not-there" in got["metrics.attribution"].message
    text = "\n".join(line for line in (FIXTURES / "node-a.prom").read_text().splitlines()
                     if not line.startswith("DCGM_FI_DEV_FB_FREE"))
    got = {c.check: c for c in metrics.node_checks("n", metrics.parse(text), uuids, None, [])}
    assert got["metrics.core"].status == "fail" and "framebuffer free" in got["metrics.core"].message
    assert "metrics.attribution" not in got
    # GFD's count when nvidia-smi was not read
    assert metrics.node_checks("n", a, None, 3, [])[0].status == "fail"
    assert metrics.node_checks("n", a, None, 2, [])[0].status == "pass"


def test_vgpu_guest_without_temperature_and_power_only_warns():
    c = scrape("node-c.prom")
    got = {x.check: x for x in metrics.node_checks("node-c", c, None, None, [])}
    assert got["metrics.core"].status == "warn" and "temperature" in got["metrics.core"].message, got
