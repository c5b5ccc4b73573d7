"""The GPU monitoring content in values/monitoring, checked against upstream facts and a real Prometheus.

- dcgm-metrics.csv parses the way dcgm-exporter reads it (Go encoding/csv, '#' comments, three fields) and names
  only DCGM fields dcgm-exporter knows (tests/fixtures/dcgm-exporter/fields.txt, from go-dcgm; see its README).
- alerts.yaml passes `promtool check rules`, alerts.test.yaml passes `promtool test rules`, and every alert has a
  firing and a silent case there, a severity, and summary/description/runbook annotations.
- A real Prometheus (module-scoped, one per run of this file) scrapes the recorded dcgm-exporter output in
  tests/fixtures/dcgm-exporter (served by local HTTP servers) as job nvidia-dcgm-exporter, evaluates
  alerts.yaml, and answers every query of dashboard.json: each must return data.

Dashboard queries are run as Grafana would send them with every template variable on "All": $Hostname, $gpu,
$namespace and $pod become the variables' allValue `.*`, $__rate_interval becomes 1m (Grafana's floor is four
scrape intervals; the test scrapes every second), $__interval 15s and $__range 5m.

prometheus/promtool come from Debian's `prometheus` package (scripts/apt-packages.txt). Without them these tests
skip, or fail where tools are required (CI, GPU_INSTALL_REQUIRE_TOOLS): see tests/conftest.need().
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, need

MONITORING = ROOT / "values" / "monitoring"
CSV_FILE = MONITORING / "dcgm-metrics.csv"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = MONITORING / "alerts.test.yaml"
DASHBOARD = MONITORING / "dashboard.json"
FIXTURES = ROOT / "tests" / "fixtures" / "dcgm-exporter"
NODE_FILES = sorted(FIXTURES.glob("node-*.prom"))
JOB = "nvidia-dcgm-exporter"
PROM_TYPES = {"gauge", "counter", "label"}  # ours; dcgm-exporter also takes histogram, summary (counters/variables.go)
SEVERITIES = {"critical", "warning", "info"}
# Grafana's values for its built-in variables, and our template variables on "All" (their allValue)
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
ALL_VALUE = ".*"
READY_TIMEOUT = 30.0


def promtool() -> str:
    path = shutil.which("promtool")
    need(path, "promtool not installed (Debian package prometheus, scripts/apt-packages.txt)")
    assert path
    return path


# ---------------------------------------------------------------------------------------------- metric CSV


def csv_problems(text: str, known: set[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Parse a counters CSV as dcgm-exporter 4.4.2-4.7.0 does; return (records, problems).

    internal/pkg/counters/counter_config.go: encoding/csv with Comment='#' (a comment starts at column 0), default
    FieldsPerRecord (every record as long as the first, which must be 3), no LazyQuotes, fields trimmed of spaces
    only; column 1 through dcgm.GetFieldID, column 2 a Prometheus type.
    """
    records: list[tuple[str, str, str]] = []
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if '"' in line:
            problems.append(f"line {n}: a double quote breaks dcgm-exporter's CSV reader")
        if "\t" in line:
            problems.append(f"line {n}: tab (dcgm-exporter trims spaces only)")
        fields = [f.strip(" ") for f in line.split(",")]
        if len(fields) != 3:
            problems.append(
                f"line {n}: {len(fields)} fields, dcgm-exporter needs exactly 3 (a comma in the help text?)"
            )
            continue
        name, prom_type, help_text = fields
        if name not in known:
            problems.append(f"line {n}: {name} is not a DCGM field name dcgm-exporter knows")
        if prom_type not in PROM_TYPES:
            problems.append(f"line {n}: type {prom_type!r} is not one of {sorted(PROM_TYPES)}")
        if not help_text:
            problems.append(f"line {n}: empty help text")
        if name in {r[0] for r in records}:
            problems.append(f"line {n}: {name} listed twice")
        records.append((name, prom_type, help_text))
    return records, problems


def known_fields() -> dict[str, int]:
    fields = {}
    for line in (FIXTURES / "fields.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, field_id = line.split()
            fields[name] = int(field_id)
    return fields


def csv_records() -> list[tuple[str, str, str]]:
    records, problems = csv_problems(CSV_FILE.read_text(), set(known_fields()))
    assert not problems, problems
    return records


def csv_metrics() -> set[str]:
    """Names that become Prometheus series (label-type fields become labels instead)."""
    return {name for name, prom_type, _ in csv_records() if prom_type != "label"}


def test_fields_list_is_go_dcgm_map():
    fields = known_fields()
    header = (FIXTURES / "fields.txt").read_text().split("\n# name id\n")[0]
    assert "0b1e78b1ccea39f7b44d07d0740f11584a5e52a7" in header, "fields.txt must say which go-dcgm commit it is from"
    assert len(fields) > 500
    # spot checks against go-dcgm's dcgm_fields.h
    assert fields["DCGM_FI_DEV_XID_ERRORS"] == 230
    assert fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == fields["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] == 112
    assert fields["DCGM_FI_PROF_NVLINK_TX_BYTES"] == 1011


def test_metric_csv_parses_and_names_real_fields():
    records = csv_records()
    assert len(records) >= 30
    assert all(t in PROM_TYPES for _, t, _ in records)


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("DCGM_FI_DEV_GPU_UTILISATION, gauge, GPU utilisation (in %).", "not a DCGM field name"),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilisation, in %.", "needs exactly 3"),
        ("DCGM_FI_DEV_GPU_UTIL, histogram, GPU utilisation (in %).", "is not one of"),
        ('DCGM_FI_DEV_GPU_UTIL, gauge, "GPU utilisation".', "double quote"),
    ],
)
def test_metric_csv_check_catches(line, complaint):
    _, problems = csv_problems(line + "\n", set(known_fields()))
    assert any(complaint in p for p in problems), problems


def test_metric_csv_covers_the_monitoring_we_promise():
    names = {name for name, _, _ in csv_records()}
    wanted = {
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
    }  # fmt: skip
    assert wanted <= names, sorted(wanted - names)
    # the deprecated name of field 112 would rename the series if upstream drops the alias
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in names


# ---------------------------------------------------------------------------------------------- alert rules


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_check_rules():
    result = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules_catches_a_broken_rule(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(ALERTS.read_text().replace("up{job=", "up{{job=", 1))
    result = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True, text=True)
    assert result.returncode != 0, result.stdout


def test_promtool_test_rules():
    result = subprocess.run(
        [promtool(), "test", "rules", ALERT_TESTS.name], cwd=MONITORING, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules_catches_a_wrong_threshold(tmp_path):
    (tmp_path / "alerts.yaml").write_text(ALERTS.read_text().replace(") > 85", ") > 95"))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = subprocess.run(
        [promtool(), "test", "rules", ALERT_TESTS.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0 and "GPUHighTemperature" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_test():
    alerts = {r["alert"] for r in alert_rules()}
    fired: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            assert check["alertname"] in alerts, f"alerts.test.yaml tests unknown alert {check['alertname']}"
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert not alerts - fired, f"alerts never seen firing in alerts.test.yaml: {sorted(alerts - fired)}"
    assert not alerts - silent, f"alerts never seen staying silent in alerts.test.yaml: {sorted(alerts - silent)}"


def test_alerts_have_severity_and_annotations():
    rules = alert_rules()
    assert len({r["alert"] for r in rules}) == len(rules), "alert names must be unique"
    for rule in rules:
        name = rule["alert"]
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            assert str(annotations.get(key, "")).strip(), f"{name}: annotation {key} missing"
        assert "\n" not in annotations["runbook"].strip(), f"{name}: runbook is one line"
        assert f'job="{JOB}"' in rule["expr"], f"{name}: must select the {JOB} scrape job"


def dcgm_names(expr: str) -> set[str]:
    return set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+\b", expr))


def test_alerts_use_only_collected_fields():
    collected = csv_metrics()
    for rule in alert_rules():
        assert dcgm_names(rule["expr"]) <= collected, (rule["alert"], dcgm_names(rule["expr"]) - collected)


# ---------------------------------------------------------------------------------------------- dashboard


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(items: list[dict]) -> Iterator[dict]:
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def dashboard_targets() -> list[tuple[str, str]]:
    """(id, expr) for every query of every panel."""
    out = []
    for p in panels(dashboard()["panels"]):
        for t in p.get("targets", []):
            out.append((f"{p['title']} [{t['refId']}]", t["expr"]))
    return out


def template_variables() -> dict[str, dict]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def substitute(expr: str) -> str:
    """The query Grafana sends with every template variable on All (see the module docstring)."""
    values = dict(GRAFANA_BUILTINS)
    for name, var in template_variables().items():
        if var["type"] == "query":
            values[name] = var.get("allValue") or ALL_VALUE

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def label_values_query(definition: str) -> str:
    """Grafana's label_values(selector, label) as the equivalent PromQL."""
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", definition.strip())
    assert m, definition
    return f"group by ({m.group(2)}) ({m.group(1)})"


def test_dashboard_structure():
    board = dashboard()
    assert board["schemaVersion"] >= 36
    variables = template_variables()
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name in ("Hostname", "gpu", "namespace", "pod"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name].get("includeAll") and variables[name].get("allValue") == ALL_VALUE
    ids = [p["id"] for p in panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(board["panels"]):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            # a query padded with `or vector(0)` always "has data": use the panel's noValue instead
            assert "vector(" not in t["expr"], p["title"]
            assert f'job="{JOB}"' in t["expr"], p["title"]
    titles = " ".join(p["title"].lower() for p in panels(board["panels"]))
    for section in ("cluster", "nodes", "gpus", "pods"):
        assert section in titles


def test_dashboard_uses_only_collected_fields():
    collected = csv_metrics() | {"DCGM_FI_DRIVER_VERSION"}  # a label, used in by()
    for target_id, expr in dashboard_targets():
        assert dcgm_names(expr) <= collected, (target_id, dcgm_names(expr) - collected)


# ---------------------------------------------------------------------------------------------- fixtures


def parse_exposition(path: Path) -> list[tuple[str, dict[str, str]]]:
    samples = []
    for line in path.read_text().splitlines():
        if line.startswith("DCGM_"):
            name, rest = line.split("{", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', rest.rsplit("}", 1)[0]))
            samples.append((name, labels))
    return samples


def test_fixtures_cover_nodes_pods_and_a_gpu_without_profiling():
    gpus: dict[str, set[str]] = {}
    with_pod: set[str] = set()
    prof: set[str] = set()
    for path in NODE_FILES:
        for name, labels in parse_exposition(path):
            gpus.setdefault(labels["Hostname"], set()).add(labels["UUID"])
            if labels.get("pod"):
                with_pod.add(labels["UUID"])
            if name.startswith("DCGM_FI_PROF_"):
                prof.add(labels["UUID"])
    assert sum(1 for uuids in gpus.values() if len(uuids) >= 2) >= 2, gpus
    assert with_pod
    assert set().union(*gpus.values()) - prof, "no GPU without profiling fields"


def test_recorded_output_is_served_verbatim():
    served = {line for path in NODE_FILES for line in path.read_text().splitlines()}
    recorded = sorted((FIXTURES / "recorded").glob("*.prom"))
    assert len(recorded) >= 2
    for path in recorded:
        missing = [line for line in path.read_text().splitlines() if line and line not in served]
        assert not missing, f"{path.name}: lines changed or dropped in the served files: {missing[:3]}"


# ---------------------------------------------------------------------------------------------- live Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(path: Path) -> ThreadingHTTPServer:
    """An HTTP server answering GET /metrics with the file, as dcgm-exporter does on :9400."""
    body = path.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params: str) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:  # 400/422 carry the PromQL error as JSON
            return json.load(e)

    def query(self, expr: str) -> dict:
        return self.get("/api/v1/query", query=expr)


def _wait(what: str, check, deadline: float, proc: subprocess.Popen, log: Path):
    while True:
        if proc.poll() is not None:
            raise AssertionError(
                f"prometheus exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}"
            )
        try:
            if check():
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    need(binary, "prometheus not installed (Debian package prometheus, scripts/apt-packages.txt)")
    assert binary
    work = tmp_path_factory.mktemp("prometheus")
    servers = [serve(path) for path in NODE_FILES]
    targets = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            # honor_labels keeps dcgm-exporter's pod/namespace/container (per-pod attribution) as they are
            {"job_name": JOB, "honor_labels": True, "static_configs": [{"targets": targets}]}
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = work / "prometheus.log"
    port = free_port()
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + READY_TIMEOUT

        def ready() -> bool:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                return resp.status == 200

        def scraped() -> bool:
            active = prom.get("/api/v1/targets")["data"]["activeTargets"]
            if len(active) != len(targets) or any(t["health"] != "up" for t in active):
                return False
            # three samples per target: enough for rate() over $__rate_interval
            counts = prom.query(f'count_over_time(up{{job="{JOB}"}}[1m]) >= 3')["data"]["result"]
            return len(counts) == len(targets)

        def rules_evaluated() -> bool:
            groups = prom.get("/api/v1/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return bool(rules) and all(not r["lastEvaluation"].startswith("0001-") for r in rules)

        _wait("/-/ready", ready, deadline, proc, log)
        _wait("every target up with samples", scraped, deadline, proc, log)
        _wait("a first evaluation of every rule", rules_evaluated, deadline, proc, log)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for server in servers:
            server.shutdown()
            server.server_close()


def test_targets_scraped_with_exporter_labels(prometheus):
    active = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
    assert len(active) == len(NODE_FILES) >= 2
    assert all(t["health"] == "up" and not t["lastError"] for t in active), active
    result = prometheus.query(f'DCGM_FI_DEV_GPU_UTIL{{job="{JOB}", pod!="", namespace!=""}}')["data"]["result"]
    assert result, "per-pod labels of the fixtures lost (honor_labels?)"
    renamed = prometheus.query(f'{{job="{JOB}", exported_pod!=""}}')["data"]["result"]
    assert not renamed


@pytest.mark.parametrize("name", sorted(csv_metrics()))
def test_csv_metric_is_scraped(prometheus, name):
    result = prometheus.query(f'count({{__name__="{name}", job="{JOB}"}})')["data"]["result"]
    assert result, f"{name} is in dcgm-metrics.csv but not in the scraped fixtures"


def test_csv_label_fields_are_scraped(prometheus):
    for name, prom_type, _ in csv_records():
        if prom_type == "label":
            result = prometheus.query(f'count({{job="{JOB}", {name}!=""}})')["data"]["result"]
            assert result, f"no series carries the {name} label"


def test_alert_rules_evaluate_cleanly_on_scraped_data(prometheus):
    rules = [r for g in prometheus.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, bad


def test_alerts_fire_on_scraped_data(prometheus):
    """End to end on exporter-shaped data: of the alerts without `for:`, only the application XID of the fixtures
    (node B gpu 1, XID 31, pod ml/trainer-0) fires - new to a Prometheus that has just started - and nothing else."""
    expected = [("GPUXidApplicationError", "i-030791dc5a37cd257", "1", "31", "ml", "trainer-0")]
    deadline = time.monotonic() + 10
    while True:
        alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
        firing = sorted(
            tuple(a["labels"].get(k, "") for k in ("alertname", "Hostname", "gpu", "err_code", "namespace", "pod"))
            for a in alerts
            if a["state"] == "firing"
        )
        if firing == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert firing == expected


def query_problem(prometheus: Prometheus, expr: str) -> str | None:
    """None when the query succeeds with data, else what is wrong."""
    answer = prometheus.query(expr)
    if answer.get("status") != "success":
        return f"{answer.get('errorType')}: {answer.get('error')}"
    if not answer["data"]["result"]:
        return "no data"
    return None


@pytest.mark.parametrize(("target_id", "expr"), dashboard_targets(), ids=[t for t, _ in dashboard_targets()])
def test_dashboard_query_returns_data(prometheus, target_id, expr):
    problem = query_problem(prometheus, substitute(expr))
    assert problem is None, f"{target_id}: {problem}\n{substitute(expr)}"


@pytest.mark.parametrize("name", ["Hostname", "gpu", "namespace", "pod"])
def test_dashboard_variable_has_values(prometheus, name):
    expr = substitute(label_values_query(template_variables()[name]["definition"]))
    problem = query_problem(prometheus, expr)
    assert problem is None, f"${name}: {problem}\n{expr}"


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        (f'max by (Hostname) (DCGM_FI_DEV_GPU_UTILISATION{{job="{JOB}"}})', "no data"),
        (f'max by (Hostname) (DCGM_FI_DEV_GPU_UTIL{{job="{JOB}"}}', "bad_data"),
        (f'DCGM_FI_DEV_GPU_UTIL{{job="{JOB}", Hostname=~"$Hostname"}} * on (gpu) DCGM_FI_DEV_FB_USED', "execution"),
    ],
)
def test_dashboard_query_check_catches(prometheus, expr, problem):
    found = query_problem(prometheus, substitute(expr))
    assert found and problem in found, found
