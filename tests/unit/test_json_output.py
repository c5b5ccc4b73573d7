"""`--json FILE` of preflight, apply, operator status and catalog show|diff (installer/jsonout.py, docs/json.md), and
the messages of issue 28's item 9 (validate without an API server, catalog show of an unknown release, --set into a
list, --kube-version suggestions, mirror verify -j).

Every written document is checked against the JSON Schema exported from its TypedDict with jsonschema (a validator
independent of the pydantic check the writer makes), and docs/json.md against the same schema. Real inputs: the real
catalog data, real ansible-playbook runs against a closed SSH port, real closed TCP ports for the API server.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import jsonschema
import pytest
import yaml

from installer import jsonout
from installer.errors import ClusterError
from tests.conftest import ROOT

CATALOG = ROOT / "values" / "catalog"
DOC = ROOT / "docs" / "json.md"


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load(path: Path, schema: str) -> dict:
    """The written document, checked against its documented schema."""
    doc = json.loads(path.read_text())
    assert doc["schema"] == schema
    jsonschema.Draft202012Validator(jsonout.json_schema(schema)).validate(doc)
    return doc


@pytest.fixture
def kubeconfig(tmp_path) -> tuple[Path, str]:
    """A kubeconfig whose API server is a closed port: (path, server URL)."""
    server = f"https://127.0.0.1:{closed_port()}"
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}]}))
    return kc, server


@pytest.fixture
def unreachable_inventory(tmp_path) -> Path:
    """One GPU node whose SSH port is closed."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": {
        "ansible_host": "127.0.0.1", "ansible_port": closed_port(), "ansible_user": "nobody",
        "gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic"}}}}}}))
    return inv


# ---------------------------------------------------------------- the schemas and their page


def test_every_schema_is_a_valid_json_schema_with_the_envelope():
    for sid in jsonout.SHAPES:
        schema = jsonout.json_schema(sid)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert {"schema", "version", "command", "started", "seconds", "exitCode", "error"} <= set(schema["required"])
        assert schema["properties"]["schema"]["const"] == sid
        assert schema["additionalProperties"] is False  # a misspelt field fails the writer's check


def _paths(schema: dict) -> set[str]:
    """Every field path of a JSON Schema: a.b, list[].c (anyOf/nullable and $refs followed)."""
    defs, out = schema.get("$defs", {}), set()

    def walk(s: dict, prefix: str) -> None:
        if "$ref" in s:
            s = defs[s["$ref"].split("/")[-1]]
        for alt in s.get("anyOf", []):
            walk(alt, prefix)
        if s.get("type") == "array":
            walk(s.get("items", {}), prefix + "[]")
        for k, v in (s.get("properties") or {}).items():
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            walk(v, path)

    walk(schema, "")
    return out


def _sections() -> dict[str, str]:
    text = DOC.read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    return {p.split("\n", 1)[0].strip(): p for p in parts[1:]}


ENVELOPE = {"schema", "version", "command", "started", "seconds", "exitCode", "error", "error.type", "error.message",
            "error.hint", "error.exitCode"}


@pytest.mark.parametrize("sid", list(jsonout.SHAPES))
def test_the_page_documents_every_field_and_no_other(sid):
    """docs/json.md: the common table holds the envelope, each schema's section every other field path (the apply
    document's `validate` is validate/v1, documented in docs/validate.md), and no field the schema lacks."""
    sections = _sections()
    paths = {p for p in _paths(jsonout.json_schema(sid)) if not p.startswith("validate.")}
    rows = re.findall(r"^\| `([^`]+)` \|", sections["Common fields"], flags=re.M)
    assert set(rows) == ENVELOPE
    section = sections[sid]
    first_column = set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))
    mentioned = set(re.findall(r"`([A-Za-z][\w.\[\]]*)`", section))
    assert first_column <= paths, f"{sid}: documented but not in the schema: {first_column - paths}"
    assert paths - ENVELOPE <= mentioned, f"{sid}: not documented: {sorted(paths - ENVELOPE - mentioned)}"
    examples = re.findall(r"```json\n(.*?)```", section, flags=re.S)
    assert examples, f"{sid}: no example"
    for text in examples:  # the page's examples are documents of the schema too
        jsonschema.Draft202012Validator(jsonout.json_schema(sid)).validate(json.loads(text))


def test_the_writer_refuses_a_document_off_its_schema(tmp_path):
    rec = jsonout.Recorder(jsonout.CATALOG_SHOW, "catalog show")
    rec.doc.update(release="v24.9.2", nfdChart="0.16.6", components=[], platforms=None, colour="blue")
    with pytest.raises(ValueError, match="colour"):
        jsonout.write(tmp_path / "x.json", rec.doc)
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------- catalog show / diff over the real catalog


@pytest.mark.parametrize("release", sorted(p.stem for p in CATALOG.glob("v*.yaml")))
def test_catalog_show_json_of_every_release(cli, tmp_path, release):
    out = tmp_path / "show.json"
    rc, text, _ = cli("catalog", "show", release, "--json", out)
    assert rc == 0
    doc = load(out, jsonout.CATALOG_SHOW)
    assert (doc["exitCode"], doc["error"], doc["release"]) == (0, None, release)
    data = yaml.safe_load((CATALOG / f"{release}.yaml").read_text())
    assert doc["nfdChart"] == str(data["nfdChart"]["version"])
    assert [c["name"] for c in doc["components"]] == list(data["components"])
    for c in doc["components"]:
        raw = data["components"][c["name"]]
        if raw.get("repository") and raw.get("version") is not None:
            base = f"{raw['repository']}/{raw['image']}" if raw.get("image") else raw["repository"]
            sep = "@" if str(raw["version"]).startswith("sha256:") else ":"
            assert c["image"] == f"{base}{sep}{raw['version']}"
            assert c["image"] in text  # the table shows the same
        assert c["enabled"] == raw.get("enabled")
    series = yaml.safe_load((CATALOG / "platforms.yaml").read_text())["series"][".".join(release.split(".")[:2])]
    kube = doc["platforms"]["kubernetes"]
    assert (kube["min"], kube["validated"]) == (series["kubernetes"]["min"], series["kubernetes"]["validated"])
    assert doc["platforms"]["driverOs"] == {k: v for k, v in series["driverOs"].items() if k != "source"}


def test_catalog_diff_reports_the_kubernetes_range_and_driver_os_changes(cli, tmp_path):
    """v23.9.2 → v24.3.0: NFD 0.15's gRPC probes raise the minimum from 1.16 to 1.24; RHEL 8.4-8.9 lose their
    driver images (values/catalog/platforms.yaml, from NVIDIA's platform-support pages of the two series)."""
    out = tmp_path / "diff.json"
    rc, text, _ = cli("catalog", "diff", "v23.9.2", "v24.3.0", "--json", out)
    assert rc == 0
    assert "~ Kubernetes: runs on ≥ 1.16, NVIDIA validated 1.22–1.29 → runs on ≥ 1.24, NVIDIA validated 1.22–1.30" \
           " (node-feature-discovery 0.15.4 subchart" in text
    assert "- driver images for rhel 8.4, 8.6, 8.7, 8.9" in text and "+ driver images for rhel 8.10" in text
    doc = load(out, jsonout.CATALOG_DIFF)
    k = doc["kubernetes"]
    assert k["changed"] and (k["rangeFrom"]["min"], k["rangeTo"]["min"]) == ("1.16", "1.24")
    assert doc["driverOs"] == {"added": {"rhcos": ["4.16"], "rhel": ["8.10"]},
                               "removed": {"rhel": ["8.4", "8.6", "8.7", "8.9"]}}
    nfd = next(c for c in doc["components"] if c["name"] == "node-feature-discovery")
    assert (nfd["imageFrom"], nfd["imageTo"]) == ("registry.k8s.io/nfd/node-feature-discovery:v0.14.2",
                                                  "registry.k8s.io/nfd/node-feature-discovery:v0.15.4")
    assert "gdrcopy.enabled" in doc["valuesKeys"]["added"]
    # each component line of the text is in the document
    for c in doc["components"]:
        if c["change"] == "changed" and c["imageFrom"] != c["imageTo"]:
            assert f"~ {c['name']}: {c['imageFrom']} → {c['imageTo']}" in text


def test_catalog_diff_of_one_series_says_the_range_is_unchanged(cli, tmp_path):
    out = tmp_path / "diff.json"
    rc, text, _ = cli("catalog", "diff", "v24.9.1", "v24.9.2", "--json", out)
    assert rc == 0 and "Kubernetes: unchanged (runs on ≥ 1.24, NVIDIA validated 1.24–1.31)" in text
    assert "driver image OS: unchanged" in text
    doc = load(out, jsonout.CATALOG_DIFF)
    assert doc["kubernetes"]["changed"] is False and doc["driverOs"] == {"added": {}, "removed": {}}


def test_catalog_show_of_an_unknown_release_names_the_argument_and_writes_the_failure(cli, tmp_path):
    out = tmp_path / "show.json"
    rc, text, err = cli("catalog", "show", "v24.9.9", "--json", out)
    assert rc == 2 and not text
    assert "operator.version" not in err  # it came from the command line, not the site file
    assert "catalog show RELEASE (given on the command line): v24.9.9 is not in the catalog; the nearest known " \
           "releases: v24.9.1, v24.9.2, v25.3.0, v25.3.1" in err
    doc = load(out, jsonout.CATALOG_SHOW)
    assert doc["exitCode"] == 2 and doc["error"]["type"] == "ConfigError" and doc["error"]["exitCode"] == 2
    assert "v24.9.9 is not in the catalog" in doc["error"]["message"] and doc["release"] is None
    rc, _, err = cli("catalog", "diff", "v23.9.2", "v99.1.0", "--json", out)
    assert rc == 2 and "catalog diff B (given on the command line): v99.1.0 is not in the catalog; the nearest " \
                       "known releases: v26.3.3, v26.7.0" in err
    assert load(out, jsonout.CATALOG_DIFF)["error"]["exitCode"] == 2


def test_an_unwritable_json_path_is_refused_before_anything(cli, tmp_path):
    rc, text, err = cli("catalog", "show", "v24.9.2", "--json", tmp_path / "missing" / "x.json")
    assert rc == 2 and not text and "--json" in err and "does not exist" in err
    rc, _, err = cli("catalog", "show", "v24.9.2", "--json", tmp_path)
    assert rc == 2 and "is a directory" in err


# ---------------------------------------------------------------- preflight


def test_preflight_json_when_an_offline_check_refuses(cli, tmp_path, write_site, unreachable_inventory):
    """A HAMi site that keeps the operator's device plugin and turns CDI on: exit 3 before any host is contacted."""
    site = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "cdi": {"enabled": True}, "sharing": {"mode": "hami", "hami": {"kubernetesVersion": "v1.29.4"}}})
    out = tmp_path / "preflight.json"
    rc, _, err = cli("preflight", "-s", site, "-i", unreachable_inventory, "--json", out, "-q")
    assert rc == 3, err
    doc = load(out, jsonout.PREFLIGHT)
    assert doc["exitCode"] == 3 and doc["error"]["type"] == "PreflightError" and doc["release"] == "v24.9.2"
    assert "sharing.mode hami conflicts with the site" in doc["error"]["message"]
    assert doc["runs"] == [] and doc["failures"] == []  # no host was contacted


def test_preflight_json_with_an_unreachable_node(cli, tmp_path, write_site, site_data, unreachable_inventory):
    """A real ansible-playbook run against a closed SSH port: exit 5, the host's result and its failure."""
    out = tmp_path / "preflight.json"
    rc, _, err = cli("preflight", "-s", write_site(site_data), "-i", unreachable_inventory, "--json", out, "-q")
    assert rc == 5, err
    doc = load(out, jsonout.PREFLIGHT)
    assert doc["exitCode"] == 5 and doc["error"]["type"] == "HostsUnreachable"
    [run] = doc["runs"]
    assert run["playbook"] == "preflight.yml" and [h["host"] for h in run["hosts"]] == ["gpu1"]
    assert run["hosts"][0]["unreachable"] == 1
    [failure] = doc["failures"]
    assert failure["host"] == "gpu1" and failure["unreachable"] is True and "Connection refused" in failure["message"]


# ---------------------------------------------------------------- apply


@pytest.fixture
def staged_files(tmp_path, write_site):
    """The site and inventory of tests/unit/test_stages.py's staged_plan, as files for the CLI (no MIG layout: a
    sharing feature that shares whole GPUs refuses one)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": {"gpu1": {"gpu_install_os": "ubuntu22.04"}}},
        "kube_control_plane": {"hosts": {"cp": {}}}}}}))
    site = write_site({"operator": {"version": "v24.9.2"}, "registry": {
        "host": "registry.example.com:5000",
        "pullSecret": {"name": "gpu-registry", "usernameEnv": "JSON_TEST_USER", "passwordEnv": "JSON_TEST_PASSWORD"}},
        "toolkit": {"mode": "host"}, "components": {"devicePlugin": {"enabled": False}},
        "sharing": {"mode": "gpumanager"}, "monitoring": {"enabled": True}})
    return site, inv


def _real_report():
    from installer.validate.report import Check, Report

    report = Report("v24.9.2", ("node", "cluster"))
    report.add(Check("node", "node.driver", "gpu1", "pass", "driver 550.144.03", seconds=0.5),
               Check("cluster", "cluster.node-ready", "gpu1", "pass", "Ready"))
    report.seconds = 1.25
    return report


def test_apply_json_all_stages(cli, tmp_path, monkeypatch, staged_files):
    from installer import validate
    from tests.unit.test_stages import APPLY, Stubs

    site, inv = staged_files
    monkeypatch.setenv("JSON_TEST_USER", "robot")
    monkeypatch.setenv("JSON_TEST_PASSWORD", "s3cr3t-pa55word")
    Stubs(monkeypatch, None)
    report = _real_report()
    monkeypatch.setattr(validate, "run", lambda *a, **k: report)
    out = tmp_path / "apply.json"
    rc, text, err = cli("apply", "-s", site, "-i", inv, "--skip-mirror-check", "--json", out, "-q")
    assert rc == 0, err
    doc = load(out, jsonout.APPLY)
    assert (doc["exitCode"], doc["error"], doc["release"], doc["checkMode"]) == (0, None, "v24.9.2", False)
    assert [s["name"] for s in doc["stages"]] == APPLY
    assert [s["outcome"] for s in doc["stages"]] == ["ok", "changed", "changed", "changed", "unchanged", "skipped",
                                                     "passed"]
    for s in doc["stages"]:  # the table printed is the table written
        assert re.search(rf"^{s['name']}\s+{re.escape(s['outcome'])}\s+{re.escape(s['reason'])}$", text, re.M)
    assert doc["nodesChanged"] == 3
    assert doc["validate"] == report.to_json()
    assert "s3cr3t-pa55word" not in out.read_text()


def test_apply_json_when_the_operator_stage_fails_keeps_the_table_and_hides_the_credential(cli, tmp_path, monkeypatch,
                                                                                         staged_files):
    """helm failing (exit 7) with a message that carries the registry password (as a chart's rendered value
    could): the document has the failure, the whole stage table, and *** instead of the password."""
    from tests.unit.test_stages import APPLY, Stubs

    site, inv = staged_files
    monkeypatch.setenv("JSON_TEST_USER", "robot")
    monkeypatch.setenv("JSON_TEST_PASSWORD", "s3cr3t-pa55word")
    stubs = Stubs(monkeypatch, "operator")
    stubs.error = ClusterError("helm upgrade --install gpu-operator failed: timed out waiting for the condition "
                               "(pulling https://robot:s3cr3t-pa55word@registry.example.com:5000/v2/)",
                               hint="the release's workloads did not become ready in time")
    out = tmp_path / "apply.json"
    rc, _, err = cli("apply", "-s", site, "-i", inv, "--skip-mirror-check", "--json", out, "-q")
    assert rc == 7, err
    raw = out.read_text()
    assert "s3cr3t-pa55word" not in raw and "robot:" not in raw
    doc = load(out, jsonout.APPLY)
    assert doc["exitCode"] == 7 and doc["error"]["type"] == "ClusterError" and doc["error"]["exitCode"] == 7
    assert "https://***@registry.example.com:5000" in doc["error"]["message"]
    assert [(s["name"], s["outcome"]) for s in doc["stages"]] == [
        ("preflight", "ok"), ("nodes", "changed"), ("operator", "failed"),
        *((name, "not run") for name in APPLY[3:])]
    assert doc["validate"] is None


def test_uninstall_json_has_uninstalls_stages_and_without_yes_no_stage(cli, tmp_path, monkeypatch, staged_files):
    """uninstall --json: the apply/v1 document with uninstall's stages in uninstall's order; without --yes it says
    exit 2 and has no stage (nothing ran)."""
    from tests.unit.test_stages import UNINSTALL, Stubs

    site, inv = staged_files
    monkeypatch.setenv("JSON_TEST_USER", "robot")
    monkeypatch.setenv("JSON_TEST_PASSWORD", "s3cr3t-pa55word")
    stubs = Stubs(monkeypatch, None)
    out = tmp_path / "uninstall.json"
    rc, _, err = cli("uninstall", "-s", site, "-i", inv, "--json", out, "-q")
    assert rc == 2, err
    doc = load(out, jsonout.APPLY)
    assert (doc["command"], doc["exitCode"], doc["stages"], doc["validate"]) == ("uninstall", 2, [], None)
    assert "--yes" in (doc["error"]["hint"] or "") and stubs.calls == []
    rc, text, err = cli("uninstall", "-s", site, "-i", inv, "--yes", "--json", out, "-q")
    assert rc == 0, err
    doc = load(out, jsonout.APPLY)
    assert (doc["command"], doc["exitCode"], doc["error"], doc["checkMode"]) == ("uninstall", 0, None, False)
    assert [s["name"] for s in doc["stages"]] == UNINSTALL
    assert "failed" not in {s["outcome"] for s in doc["stages"]} and doc["nodesChanged"] == 2
    assert "s3cr3t-pa55word" not in out.read_text()


def test_apply_json_with_an_unreachable_node(cli, tmp_path, write_site, site_data, unreachable_inventory):
    """Real ansible-playbook against a closed SSH port: the preflight stage fails (exit 5), every later stage is
    `not run`, and the host's result and failure are in the document."""
    out = tmp_path / "apply.json"
    rc, _, err = cli("apply", "-s", write_site(site_data), "-i", unreachable_inventory, "--skip-operator",
                     "--json", out, "-q")
    assert rc == 5, err
    doc = load(out, jsonout.APPLY)
    assert doc["stages"][0]["name"] == "preflight" and doc["stages"][0]["outcome"] == "failed"
    assert {s["outcome"] for s in doc["stages"][1:]} == {"not run"}
    assert doc["runs"][0]["hosts"][0]["unreachable"] == 1 and doc["failures"][0]["unreachable"] is True


# ---------------------------------------------------------------- operator status


def test_operator_status_json_without_an_api_server(cli, tmp_path, write_site, site_data, kubeconfig):
    kc, server = kubeconfig
    out = tmp_path / "status.json"
    rc, _, err = cli("operator", "status", "-s", write_site(site_data), "--kubeconfig", kc, "--json", out)
    assert rc == 5, err
    doc = load(out, jsonout.OPERATOR_STATUS)
    assert doc["exitCode"] == 5 and doc["error"]["type"] == "ClusterUnreachable" and server in doc["error"]["message"]
    assert doc["release"] == "v24.9.2" and doc["namespace"] is None and doc["deployed"] is False


def test_operator_status_document_of_a_deployed_release():
    """StatusReport.to_json: what the cluster answered (its dataclasses as installer.operator.status fills them)."""
    from installer.helm import ReleaseState
    from installer.operator import StatusReport

    rel = ReleaseState("gpu-operator", "gpu-operator", 3, "deployed", "gpu-operator-v24.9.2")
    info = {"type": "kubernetes.io/dockerconfigjson", "labels": {"app.kubernetes.io/managed-by": "gpu-install"},
            "registries": ["registry.lab:5000"]}
    rep = StatusReport("gpu-operator", "Active", "gpu-registry", info, rel, "gpu-operator")
    doc = jsonout.envelope(jsonout.OPERATOR_STATUS, "operator status") | {"release": "v24.9.2"} | rep.to_json()
    jsonout.check(doc)
    assert doc["pullSecret"] == {"name": "gpu-registry", "present": True, "type": "kubernetes.io/dockerconfigjson",
                                 "registries": ["registry.lab:5000"], "managedByGpuInstall": True}
    assert doc["helmRelease"] == {"name": "gpu-operator", "installed": True, "revision": 3, "status": "deployed",
                                  "chart": "gpu-operator-v24.9.2"}
    gone = StatusReport("gpu-operator", None, "gpu-registry", None, None, "gpu-operator").to_json()
    assert gone["pullSecret"]["present"] is False and gone["helmRelease"]["installed"] is False
    assert gone["deployed"] is False


# ---------------------------------------------------------------- validate without an API server


def test_validate_that_stops_before_checking_still_writes_json_with_the_error(cli, tmp_path, write_site, site_data):
    out = tmp_path / "validate.json"
    rc, _text, err = cli("validate", "-s", write_site(site_data), "-i", tmp_path / "missing", "--json", out)
    assert rc == 2 and "inventory" in err and "missing" in err, err
    doc = json.loads(out.read_text())
    jsonschema.Draft202012Validator(jsonout.json_schema(jsonout.VALIDATE)).validate(doc)
    assert (doc["exitCode"], doc["error"]["type"], doc["checks"]) == (2, "ConfigError", [])
    assert str(tmp_path / "missing") in doc["error"]["message"]
    assert doc["summary"] == {"pass": 0, "fail": 0, "warn": 0, "skip": 0, "unreachable": 0}
    assert doc["layers"] == ["node", "runtime", "cluster", "smoke", "mig", "metrics"]
    # and an unwritable --json path is refused before anything: exit 2, no file
    rc, _text, err = cli("validate", "-s", write_site(site_data), "-i", tmp_path / "missing", "--json",
                         tmp_path / "no-such-dir" / "v.json")
    assert rc == 2 and "no-such-dir" in err and not (tmp_path / "no-such-dir").exists()


def test_validate_with_an_unreachable_api_server_keeps_the_node_results_and_writes_json(
        cli, tmp_path, write_site, site_data, unreachable_inventory, kubeconfig):
    kc, server = kubeconfig
    out, junit = tmp_path / "validate.json", tmp_path / "validate.xml"
    rc, text, err = cli("validate", "-s", write_site(site_data), "-i", unreachable_inventory, "--kubeconfig", kc,
                        "--ssh-timeout", "5", "--json", out, "--junit", junit)
    assert rc == 5, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "gpu-install.validate/v1" and doc["exitCode"] == 5
    from pydantic import TypeAdapter

    from installer.jsonout import ValidateDoc

    TypeAdapter(ValidateDoc).validate_python(doc)
    by = {(c["layer"], c["check"]): c for c in doc["checks"]}
    assert by[("node", "node.reachable")]["node"] == "gpu1"  # the node layer's result stays
    api = by[("cluster", "cluster.api-server")]
    assert api["status"] == "unreachable" and server in api["message"] and api["node"] == "(cluster)"
    assert server in text and "cluster.api-server" in junit.read_text()


# ---------------------------------------------------------------- messages


def test_kube_version_suggests_only_a_release_validated_on_it(cli, write_site, site_data):
    """Real catalog: no release is validated on 1.20 (NVIDIA's lowest is 1.21): v26.7.0 runs there but is validated
    on 1.32-1.36 only, so no operator.version is offered; 1.23 gets v23.9.2 (runs on >= 1.16, validated 1.22-1.29;
    v24.x needs 1.24)."""
    site = write_site(site_data)
    rc, out, err = cli("render", "-s", site, "--kube-version", "1.20")
    assert rc == 3 and not out
    assert "no catalog release is validated by NVIDIA on Kubernetes 1.20 (v26.7.0 would start on it, but is " \
           "validated on 1.32–1.36 only): upgrade the cluster to Kubernetes 1.21 or newer" in err
    assert "set operator.version" not in err
    rc, _, err = cli("render", "-s", site, "--kube-version", "1.23")
    assert rc == 3 and "that NVIDIA validated on it is v23.9.2: set operator.version: v23.9.2" in err


def test_set_into_a_list_says_so_and_how(cli, write_site, site_data):
    site = write_site(site_data)
    rc, out, err = cli("render", "-s", site, "--set", "scheduler.extenders.0.weight=0")
    assert rc == 2 and not out
    assert "--set scheduler.extenders.0.weight: scheduler.extenders is a list, and --set cannot address one entry " \
           "of a list" in err
    assert "edit scheduler.extenders in the site file, or give the whole list as YAML: --set " \
           "'scheduler.extenders=[...]'" in err
    # what the hint says works: the whole list as YAML
    rc, out, err = cli("render", "-s", site, "--set",
                       'scheduler.extenders=[{urlPrefix: "http://127.0.0.1:12345", filterVerb: filter, weight: 1}]')
    assert rc == 0, err
    rc, _, err = cli("render", "-s", site, "--set", "registry.host.port=5000")
    assert rc == 2 and "registry.host is a str value, not a mapping" in err and "--set registry.host=VALUE" in err


def test_mirror_verify_jobs_help_says_what_verify_does(cli):
    from installer.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["mirror"]
    verify = next(a for a in sub._actions if a.dest == "mirror_command").choices["verify"]
    jobs = next(a for a in verify._actions if a.dest == "jobs")
    assert "look up N images in registry.host at a time" in jobs.help and "copy" not in jobs.help


def test_a_helm_wait_timeout_is_exit_7():
    """helm's own words for a --wait that ran out (helm 3: 'context deadline exceeded', older: 'timed out waiting for
    the condition') are a ClusterError (exit 7), not an unreachable API server (5) -- docs/operator.md."""
    from pyhelm3 import errors as herr

    from installer import helm

    for stderr in (b"Error: UPGRADE FAILED: context deadline exceeded\n",
                   b"Error: INSTALLATION FAILED: timed out waiting for the condition\n"):
        err = helm._helm_error("helm upgrade --install gpu-operator", herr.Error(1, b"", stderr), "hint")
        assert type(err) is ClusterError and err.exit_code == 7
    assert "exits 7" in (ROOT / "docs" / "operator.md").read_text()
