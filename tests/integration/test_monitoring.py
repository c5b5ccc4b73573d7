"""monitoring on real lab nodes (`lab up --kubernetes --kubelet real`, 2 debian12 nodes), end to end.

`gpu-install apply` with monitoring.enabled: the metrics ConfigMap written before the release (v23.9.2 only names it),
the STAND-IN operator chart deploying what the operator would for the exporter (tests/fixtures/charts: the
nvidia-dcgm-exporter Service and DaemonSet with the ConfigMap mounted), and the monitoring stage (scrape auto: the lab
has no Prometheus Operator, so the plain scrape config, rules and dashboard ConfigMaps, and the files). The exporter
image at the site-registry path is the lab's STAND-IN dcgm-exporter (labtools/: recorded values per STAND-IN GPU,
the fields of the mounted CSV, per-pod attribution from the real kubelet's pod-resources API).

Then a real Prometheus (Debian's) runs with the scrape job gpu-install wrote and its rules file. Debian builds it
without kubernetes_sd, so the discovery is a STAND-IN: the test writes the lab API server's Endpoints in the
namespace the job names as file_sd targets with the labels kubernetes SD (role endpoints) gives; gpu-install's
relabel_configs keep the exporter's and drop another Service's. Prometheus scrapes both exporters, attributes a GPU
pod, evaluates the rules; the dashboard's queries run against it. `gpu-install validate --only
metrics` reads the exporters through the API server and sees a workload pod on one node and its own probe pod on the
other attributed. Uninstall removes what the stage made. Tests run in file order.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import need
from tests.integration.conftest import VENV_BIN
from tests.integration.test_lab_real_nodes import kubectl, real_lab
from tests.integration.test_runtime_roles import _ok, apply_inventory

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
NODES = ("node1", "node2")
OPNS = "gpu-operator"
CHART = Path(__file__).resolve().parents[1] / "fixtures" / "charts" / "gpu-operator-fixture"


@pytest.fixture(scope="module")
def mon(tmp_path_factory):
    yield from real_lab(tmp_path_factory, "mon", len(NODES))


def _site(mon) -> Path:
    h, work = mon["h"], mon["work"]
    doc = {"operator": {"version": "v23.9.2"},  # the newest line the lab's Kubernetes 1.20 runs
           "registry": {"host": h.status["registry"], "ca": str(h.ca)}, "runtime": "containerd",
           "driver": {"mode": "operator", "customImageOs": ["debian12"]},
           "monitoring": {"enabled": True, "files": str(work / "prometheus-files")}}
    path = work / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _env(mon) -> dict[str, str]:
    state = mon["work"] / "state"
    return {**os.environ, "GPU_INSTALL_STATE": str(state), "ANSIBLE_LOCAL_TEMP": str(state / "tmp")}


def _cli(mon, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "gpu-install"), *args], capture_output=True, text=True, env=_env(mon),
                          timeout=900)


def _stages(out: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(preflight|nodes|operator|sharing|monitoring|mig|validate) +(would change|not run|\S+) *(.*)$",
                     line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def _kc(mon) -> Path:
    return mon["h"].dir / "kube" / "kubeconfig"


def _wait(what, check, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_apply_installs_the_exporter_config_and_the_monitoring_objects(mon):
    from gpu_install_lab import images
    from installer.config import load_site
    from tests.conftest import plan_of

    h, work = mon["h"], mon["work"]
    site = _site(mon)
    plan = plan_of(load_site(site), inventory=str(apply_inventory(h, work)))
    (exporter,) = [i.destination for i in plan.images if i.component == "dcgmExporter"]
    images.push_dcgm_exporter_standin(exporter, h.ca, work)
    t0 = time.monotonic()
    out = _ok(_cli(mon, "apply", "-s", str(site), "-i", str(apply_inventory(h, work)), "--chart", str(CHART),
                   "--kubeconfig", str(_kc(mon)), "--no-wait", "--skip-mirror-check", "--skip-validate"))
    print(f"BENCHMARK apply with monitoring, {len(NODES)} real nodes: {time.monotonic() - t0:.1f}s")
    stages = _stages(out)
    assert stages["monitoring"][0] == "changed", stages
    assert "scrape config" in stages["monitoring"][1], stages
    cm = json.loads(kubectl(mon, "-n", OPNS, "get", "configmap", "gpu-install-dcgm-metrics", "-o", "json").stdout)
    assert cm["data"]["dcgm-metrics.csv"] == (Path(__file__).resolve().parents[2] / "values" / "monitoring" /
                                              "dcgm-metrics.csv").read_text()
    names = set(kubectl(mon, "-n", "monitoring", "get", "configmaps", "-o", "name").stdout.split())
    assert {"configmap/gpu-install-dcgm-scrape", "configmap/gpu-install-gpu-alerts",
            "configmap/gpu-install-gpu-dashboard"} <= names, names
    dash = json.loads(kubectl(mon, "-n", "monitoring", "get", "configmap", "gpu-install-gpu-dashboard",
                              "-o", "json").stdout)
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(p.name for p in (work / "prometheus-files").iterdir()) == ["gpu-install-dcgm-scrape.yaml",
                                                                            "gpu-install-gpu-alerts.yaml"]

    def exporters():
        pods = json.loads(kubectl(mon, "-n", OPNS, "get", "pods", "-l", "app=nvidia-dcgm-exporter",
                                  "-o", "json").stdout)["items"]
        ok = {p["spec"]["nodeName"]: p for p in pods if p["status"]["phase"] == "Running"}
        return ok if sorted(ok) == list(NODES) else None

    running = _wait("the exporter on both nodes", exporters)
    for p in running.values():
        assert p["status"]["containerStatuses"][0]["image"] == exporter  # pulled from the site registry
    # a second apply changes nothing in the stage
    stages = _stages(_ok(_cli(mon, "apply", "-s", str(site), "-i", str(apply_inventory(h, work)), "--chart",
                              str(CHART), "--kubeconfig", str(_kc(mon)), "--no-wait", "--skip-mirror-check",
                              "--skip-validate")))
    assert stages["monitoring"][0] == "unchanged", stages


def _gpu_pod(mon, name: str, node: str) -> None:
    reg = mon["h"].status["registry"]
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [{
                "name": "train", "image": f"{reg}/gpu-install-lab/hello:v1", "command": ["sleep", "3600"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    kubectl(mon, "apply", "-f", "-", input=json.dumps(body))
    _wait(f"pod {name} running", lambda: json.loads(kubectl(mon, "get", "pod", name, "-o", "json").stdout)
          ["status"].get("phase") == "Running")


def endpoints_sd(mon, sd_file: Path, namespaces: list[str]) -> int:
    """STAND-IN for Prometheus' kubernetes SD, role endpoints: one target per Endpoints address x port in the given
    namespaces, labelled as that SD labels them (the subset gpu-install's relabelling reads, and more), written as a
    file_sd file. Returns the number of targets."""
    targets = []
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in
            json.loads(kubectl(mon, "get", "pods", "-A", "-o", "json").stdout)["items"]}
    services = {(x["metadata"]["namespace"], x["metadata"]["name"]): x for x in
                json.loads(kubectl(mon, "get", "services", "-A", "-o", "json").stdout)["items"]}
    for ep in json.loads(kubectl(mon, "get", "endpoints", "-A", "-o", "json").stdout)["items"]:
        ns, name = ep["metadata"]["namespace"], ep["metadata"]["name"]
        if ns not in namespaces:
            continue
        svc = services.get((ns, name), {})
        for subset in ep.get("subsets") or []:
            for ready, addrs in (("true", subset.get("addresses") or []), ("false", subset.get("notReadyAddresses") or [])):
                for addr in addrs:
                    for port in subset.get("ports") or []:
                        labels = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_service_name": name,
                                  "__meta_kubernetes_endpoints_name": name,
                                  "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                                  "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                                  "__meta_kubernetes_endpoint_ready": ready,
                                  **{f"__meta_kubernetes_service_label_{re.sub(r'[^A-Za-z0-9_]', '_', k)}": v
                                     for k, v in (svc.get("metadata", {}).get("labels") or {}).items()}}
                        if addr.get("nodeName"):
                            labels["__meta_kubernetes_endpoint_node_name"] = addr["nodeName"]
                        ref = addr.get("targetRef") or {}
                        pod = pods.get((ns, ref.get("name", ""))) if ref.get("kind") == "Pod" else None
                        if pod:
                            labels["__meta_kubernetes_pod_name"] = pod["metadata"]["name"]
                            labels["__meta_kubernetes_pod_node_name"] = pod["spec"].get("nodeName", "")
                        targets.append({"targets": [f"{addr['ip']}:{port['port']}"], "labels": labels})
    tmp = sd_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets))
    tmp.replace(sd_file)
    return len(targets)


@pytest.fixture(scope="module")
def prometheus(mon, tmp_path_factory):
    """Debian's Prometheus with the scrape job gpu-install wrote (+ api_server, CA and token of the lab's API server,
    which an in-cluster Prometheus gets from its service account) and the rules file."""
    binary = shutil.which("prometheus")
    need(binary, "prometheus not installed (Debian package prometheus, scripts/apt-packages.txt)")
    from tests.unit.test_monitoring_content import Prometheus, free_port

    work = tmp_path_factory.mktemp("prom")
    kc = yaml.safe_load(_kc(mon).read_text())
    cluster, user = kc["clusters"][0]["cluster"], kc["users"][0]["user"]
    del cluster, user
    job = yaml.safe_load((mon["work"] / "prometheus-files" / "gpu-install-dcgm-scrape.yaml").read_text())[
        "scrape_configs"][0]
    # Debian's Prometheus is built without kubernetes_sd (client-go is not packaged): the discovery is stood in by
    # a file_sd target file the test writes from the lab API server's Endpoints, with the __meta_kubernetes_* labels
    # Prometheus' kubernetes SD (role endpoints) gives; gpu-install's relabel_configs then decide for real
    sd_file = work / "endpoints.json"
    namespaces = [n for sd in job.pop("kubernetes_sd_configs") for n in sd["namespaces"]["names"]]
    assert namespaces == [OPNS], namespaces
    job["file_sd_configs"] = [{"files": [str(sd_file)], "refresh_interval": "1s"}]
    prom_state = {"sd_file": sd_file, "namespaces": namespaces}
    job["scrape_interval"] = "1s"
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(mon["work"] / "prometheus-files" / "gpu-install-gpu-alerts.yaml")],
              "scrape_configs": [job]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}")
    prom.log_tail = lambda: (work / "prometheus.log").read_text()[-3000:]  # type: ignore[attr-defined]
    prom.discover = lambda: endpoints_sd(mon, **prom_state)  # type: ignore[attr-defined]
    try:
        yield prom
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_prometheus_finds_scrapes_and_attributes_through_the_generated_scrape_config(mon, prometheus):
    _gpu_pod(mon, "trainer-0", "node1")
    # a second Service in the namespace, whose endpoints the scrape job's relabelling must drop
    kubectl(mon, "-n", OPNS, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "other-metrics", "namespace": OPNS},
        "spec": {"selector": {"app": "nvidia-dcgm-exporter"}, "ports": [{"name": "other", "port": 9401}]}}))
    _wait("the Endpoints of both Services", lambda: prometheus.discover() >= 2 * len(NODES))

    def up():
        try:
            active = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            return None
        ok = [t for t in active if t["health"] == "up"]
        return active if len(ok) == len(NODES) == len(active) else None

    try:
        active = _wait("both exporters up in Prometheus", up, timeout=60)
    except AssertionError:
        raise AssertionError(f"targets: {prometheus.get('/api/v1/targets')['data']}\nlog: {prometheus.log_tail()}") from None
    nodes = {t["labels"].get("kubernetes_node") for t in active}
    assert nodes == set(NODES) and {t["labels"]["job"] for t in active} == {"nvidia-dcgm-exporter"}, active

    def attributed():
        r = prometheus.query('DCGM_FI_DEV_GPU_UTIL{job="nvidia-dcgm-exporter", pod="trainer-0"}')
        return r["data"]["result"] if r.get("status") == "success" else None

    (series,) = _wait("the GPU pod on the GPU's series", attributed, timeout=60)
    assert series["metric"]["Hostname"] == "node1" and series["metric"]["namespace"] == "default", series
    # every GPU of both nodes reports, the exporter's own pod labels did not replace the workload's (honor_labels)
    gpus = prometheus.query('count(DCGM_FI_DEV_FB_USED{job="nvidia-dcgm-exporter"})')["data"]["result"]
    assert gpus and gpus[0]["value"][1] == str(len(NODES)), gpus
    assert not prometheus.query('{job="nvidia-dcgm-exporter", exported_pod!=""}')["data"]["result"]

    def evaluated():
        groups = prometheus.get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(not r["lastEvaluation"].startswith("0001-") for r in rules) else None

    rules = _wait("a first evaluation of every rule", evaluated, timeout=30)
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, bad
    # the dashboard against what Prometheus scraped through gpu-install's scrape config
    from tests.unit.test_monitoring_content import dashboard_targets, query_problem, substitute

    problems = {t: query_problem(prometheus, substitute(e)) for t, e in dashboard_targets()}
    errors = {t: p for t, p in problems.items() if p and p != "no data"}
    assert not errors, errors
    with_data = [t for t, p in problems.items() if p is None]
    print(f"dashboard: {len(with_data)} of {len(problems)} queries return data from the lab's STAND-IN exporters "
          f"(the others count events the recorded GPU had none of: {sorted(set(problems) - set(with_data))})")
    assert len(with_data) >= len(problems) * 2 // 3, problems


def test_validate_metrics_reads_the_exporters_and_sees_pods_attributed(mon):
    h, work = mon["h"], mon["work"]
    report = work / "metrics.json"
    proc = _cli(mon, "validate", "-s", str(_site(mon)), "-i", str(apply_inventory(h, work)),
                "--kubeconfig", str(_kc(mon)), "--only", "metrics", "--json", str(report))
    checks = {(c["node"], c["check"]): c for c in json.loads(report.read_text())["checks"]}
    assert proc.returncode == 0, [(c["node"], c["check"], c["message"]) for c in checks.values() if c["status"] != "pass"]
    for node in NODES:
        for name in ("metrics.exporter", "metrics.gpus", "metrics.core", "metrics.attribution"):
            assert checks[(node, name)]["status"] == "pass", checks[(node, name)]
    assert "default/trainer-0" in checks[("node1", "metrics.attribution")]["message"]
    probe = checks[("node2", "metrics.attribution")]["message"]  # node2 ran no GPU pod: validate's own probe
    assert probe.startswith(f"{OPNS}/gpu-install-metrics-"), probe
    left = kubectl(mon, "-n", OPNS, "get", "pods", "-l", "app.kubernetes.io/component=validate-metrics",
                   "-o", "name").stdout.strip()
    assert not left or all("Terminating" for _ in left.splitlines())


def test_validate_metrics_fails_a_node_whose_pod_is_not_attributed(mon):
    """The attribution check can fail: a pod that holds a GPU but is not on the exporter's series (here: the
    exporter told to stop attributing, as when the pod-resources socket is not mounted)."""
    h, work = mon["h"], mon["work"]
    kubectl(mon, "-n", OPNS, "set", "env", "daemonset/nvidia-dcgm-exporter", "DCGM_EXPORTER_KUBERNETES=false")
    try:
        def rolled():
            pods = json.loads(kubectl(mon, "-n", OPNS, "get", "pods", "-l", "app=nvidia-dcgm-exporter",
                                      "-o", "json").stdout)["items"]
            fresh = [p for p in pods if p["status"]["phase"] == "Running" and not p["metadata"].get("deletionTimestamp")
                     and any(e.get("value") == "false" for e in p["spec"]["containers"][0]["env"])]
            return len(fresh) == len(NODES) and len(pods) == len(NODES)

        _wait("the exporter without attribution", rolled)
        proc = _cli(mon, "validate", "-s", str(_site(mon)), "-i", str(apply_inventory(h, work)),
                    "--kubeconfig", str(_kc(mon)), "--only", "metrics", "--timeout", "15")
        assert proc.returncode == 6, (proc.returncode, proc.stdout, proc.stderr[-2000:])
        assert "default/trainer-0 hold(s) a GPU but no series carries the pod" in proc.stdout, proc.stdout
    finally:
        kubectl(mon, "-n", OPNS, "set", "env", "daemonset/nvidia-dcgm-exporter", "DCGM_EXPORTER_KUBERNETES=true")


def test_with_the_prometheus_operator_api_scrape_auto_makes_a_service_monitor_and_a_rule(mon):
    """scrape auto on a cluster that serves monitoring.coreos.com/v1 (STAND-IN CRDs, tests/fixtures/prometheus-
    operator): the ServiceMonitor and PrometheusRule with the site's labels; --check then shows the stage unchanged,
    and a changed label as a change it would make (server-side dry run, nothing stored)."""
    h, work = mon["h"], mon["work"]
    crds = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus-operator" / "crds-standin.yaml"
    kubectl(mon, "apply", "-f", str(crds))
    _wait("the CRDs established", lambda: kubectl(mon, "get", "servicemonitors", "-A", check=False).returncode == 0)
    doc = yaml.safe_load(_site(mon).read_text())
    doc["monitoring"]["labels"] = {"release": "kube-prometheus-stack"}
    site = work / "site-kps.yaml"
    site.write_text(yaml.safe_dump(doc))
    argv = ["apply", "-s", str(site), "-i", str(apply_inventory(h, work)), "--chart", str(CHART), "--kubeconfig",
            str(_kc(mon)), "--no-wait", "--skip-mirror-check", "--skip-validate"]
    proc = _cli(mon, *argv)
    stages = _stages(_ok(proc))
    assert stages["monitoring"][0] == "changed" and "scrape serviceMonitor" in stages["monitoring"][1], stages
    said = proc.stdout + proc.stderr
    assert "preflight: monitoring scrape serviceMonitor (the cluster serves monitoring.coreos.com/v1)" in said, said
    sm = json.loads(kubectl(mon, "-n", "monitoring", "get", "servicemonitor", "gpu-install-dcgm-exporter",
                            "-o", "json").stdout)
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True and sm["spec"]["jobLabel"] == "app"
    rule = json.loads(kubectl(mon, "-n", "monitoring", "get", "prometheusrule", "gpu-install-gpu-alerts",
                              "-o", "json").stdout)
    assert len(rule["spec"]["groups"][0]["rules"]) >= 10
    check = _stages(_ok(_cli(mon, *argv, "--check")))
    assert check["monitoring"][0] == "unchanged", check
    doc["monitoring"]["labels"] = {"release": "other"}
    site.write_text(yaml.safe_dump(doc))
    check = _stages(_ok(_cli(mon, *argv, "--check")))
    assert check["monitoring"][0] == "would change", check
    assert "ServiceMonitor monitoring/gpu-install-dcgm-exporter: would be updated" in check["monitoring"][1], check
    again = json.loads(kubectl(mon, "-n", "monitoring", "get", "servicemonitor", "gpu-install-dcgm-exporter",
                               "-o", "json").stdout)
    assert again["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # the dry run stored nothing


def test_uninstall_removes_the_monitoring_objects(mon):
    h, work = mon["h"], mon["work"]
    kubectl(mon, "delete", "pod", "trainer-0", "--wait=false", check=False)
    proc = _cli(mon, "uninstall", "-s", str(_site(mon)), "-i", str(apply_inventory(h, work)), "--yes",
                "--kubeconfig", str(_kc(mon)), "--chart", str(CHART))
    stages = _stages(_ok(proc))
    assert stages["monitoring"][0] == "removed", stages
    assert "ConfigMap monitoring/gpu-install-dcgm-scrape removed" in stages["monitoring"][1], stages
    assert "ServiceMonitor monitoring/gpu-install-dcgm-exporter removed" in stages["monitoring"][1], stages
    assert not kubectl(mon, "-n", "monitoring", "get", "servicemonitors,prometheusrules", "-o", "name").stdout.strip()
    left = kubectl(mon, "-n", "monitoring", "get", "configmaps", "-l", "app.kubernetes.io/part-of=gpu-install-monitoring",
                   "-o", "name").stdout.strip()
    assert not left, left
    # the files on the controller stay (the admin's Prometheus may load them)
    assert (work / "prometheus-files" / "gpu-install-dcgm-scrape.yaml").is_file()
