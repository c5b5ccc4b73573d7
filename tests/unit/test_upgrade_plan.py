"""installer/upgrade/plan.py and `gpu-install upgrade plan`: the whole plan from a resolved target and the cluster
as read (ClusterState built from API-shaped objects; the release side is the real installer.upgrade.release over
the catalog, without a chart), its hash, exit code, text and JSON; the CLI's refusals and an unreachable cluster
(a closed port: exit 5, the -o document written with the error). The lab run is in
tests/integration/test_operator_rollback.py."""

from __future__ import annotations

import copy
import json
import socket
from dataclasses import replace

import jsonschema
import pytest
import yaml

from installer import jsonout
from installer.config import parse_site
from installer.facts import Node
from installer.upgrade import plan as up
from installer.upgrade.cluster import STATE_LABEL, ClusterState, NodeState
from installer.upgrade.model import CurrentRelease
from tests.conftest import BASE_SITE, plan_of

NODES = ("gpu-a", "gpu-b", "gpu-c")


@pytest.fixture(autouse=True)
def no_chart(monkeypatch):
    monkeypatch.delenv("GPU_INSTALL_CHART", raising=False)


def target(version: str = "v23.9.2", **extra):
    data = copy.deepcopy(BASE_SITE)
    data["operator"]["version"] = version
    data.update(extra)
    return plan_of(parse_site(data), nodes=[Node(n, "ubuntu", "22.04", "5.15.0-105-generic") for n in NODES])


def gpu_pod(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "labels": {"app": name},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u"}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cuda",
                                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def state(deployed_version: str | None = "v23.9.2", values: dict | None = None, *, revision: int = 4,
          status: str = "deployed", cordoned: tuple[str, ...] = (), labels: dict | None = None) -> ClusterState:
    rel = None
    if deployed_version is not None:
        vals = target(deployed_version).values if values is None else values
        rel = CurrentRelease("gpu-operator", "gpu-operator", revision, deployed_version, vals,
                             {"clusterpolicies.nvidia.com": {"metadata": {"resourceVersion": "900"}}})
    nodes = tuple(NodeState(n, n, True, True, n in cordoned, (labels or {}).get(n, {}), (gpu_pod(f"job-{n}", n),))
                  for n in NODES)
    return ClusterState("v1.29.4", rel, status, nodes, ())


def build(st: ClusterState, version: str = "v23.9.2", **kw):
    return up.build(target(version), st, None, site="site.yaml", inventory="hosts.yml", **kw)


def doc_of(p) -> dict:
    doc = {**jsonout.envelope(jsonout.UPGRADE_PLAN, "upgrade plan"), **up.to_doc_fields(p, "plan.json"),
           "exitCode": p.exit_code}
    jsonout.check(doc)
    jsonschema.Draft202012Validator(jsonout.json_schema(jsonout.UPGRADE_PLAN)).validate(doc)
    return doc


def test_the_same_release_and_values_is_nothing_to_do():
    p = build(state("v23.9.2"))
    assert p.exit_code == 0 and p.nothing_to_do and p.blockers == ()
    assert [n.action for n in p.nodes] == ["none"] * 3 and p.batches == ()
    text = up.to_text(p)
    assert "Nothing to do: the release is at v23.9.2 with these values and no node changes." in text
    assert doc_of(p)["nothingToDo"] is True
    same = replace(p, report=replace(p.report, crd_changes=("= CRD clusterpolicies.nvidia.com: schema unchanged",)))
    assert same.nothing_to_do
    moved = replace(p, report=replace(p.report, crd_changes=("~ CRD clusterpolicies.nvidia.com: field added",)))
    assert not moved.nothing_to_do


def test_the_next_major_reloads_the_drivers_canary_first():
    p = build(state("v23.6.2"), max_parallel=2, max_unavailable="100%")
    assert p.exit_code == 0, p.blockers
    assert p.report.driver_changes
    assert [(n.name, n.action, n.evicts) for n in p.nodes] == [
        (n, "driver-reload", (f"ml/job-{n}",)) for n in NODES]
    assert [(b.nodes, b.canary) for b in p.batches] == [(("gpu-a",), True), (("gpu-b", "gpu-c"), False)]
    text = up.to_text(p, "plan.json")
    assert "COMPONENT" in text and "CURRENT" in text and "TARGET" in text
    assert "gpu-operator-v23.6.2" in text and "gpu-operator-v23.9.2" in text
    assert "1 (canary): gpu-a" in text and "2: gpu-b, gpu-c" in text
    assert "gpu-install upgrade apply -s site.yaml -i hosts.yml --plan plan.json --yes" in text
    assert "apply re-reads the cluster and refuses the plan once it is stale" in text
    assert f"Plan hash: {p.plan_hash}" in text and "cannot undo: CRDs: never downgraded" in text
    doc = doc_of(p)
    assert doc["applyCommand"] == "gpu-install upgrade apply -s site.yaml -i hosts.yml --plan plan.json --yes"
    assert doc["batches"][0] == {"index": 1, "nodes": ["gpu-a"], "canary": True}


def test_blockers_are_exit_3_each_with_its_fix():
    st = state("v23.6.2", cordoned=("gpu-b",), labels={"gpu-c": {STATE_LABEL: "upgrade-failed"}})
    p = build(st)  # 25% of 3 nodes is 1, and gpu-b is cordoned already: no room
    assert [b.where for b in p.blockers] == ["gpu-b", "gpu-c", "(cluster)"] and p.batches == ()
    p = build(st, max_unavailable=2)
    assert p.exit_code == 3
    assert [b.where for b in p.blockers] == ["gpu-b", "gpu-c"]
    assert all(b.fix for b in p.blockers)
    assert [b.nodes for b in p.batches] == [("gpu-a",)]
    text = up.to_text(p)
    assert "Blockers (2):" in text and "gpu-b: the node was cordoned before the upgrade" in text
    assert "fix: kubectl describe node gpu-c" in text and "2 blocker(s): fix them and plan again (exit 3)." in text
    assert "gpu-install upgrade apply" not in text
    assert [b["where"] for b in doc_of(p)["blockers"]] == ["gpu-b", "gpu-c"]


def test_no_release_or_a_release_not_deployed_blocks():
    p = build(state(None))
    assert p.exit_code == 3 and "no Helm release gpu-operator in namespace gpu-operator" in p.blockers[0].what
    p = build(state("v23.9.2", status="pending-upgrade"))
    assert p.exit_code == 3 and "revision 4 is pending-upgrade, not deployed" in p.blockers[0].what


def test_the_plan_hash_covers_what_apply_rereads_and_nothing_else():
    base = build(state("v23.6.2")).plan_hash
    assert base.startswith("sha256:") and len(base) == 7 + 64
    assert build(state("v23.6.2")).plan_hash == base  # deterministic
    changed = {
        "revision": build(state("v23.6.2", revision=5)),
        "cordon": build(state("v23.6.2", cordoned=("gpu-c",))),
        "label": build(state("v23.6.2", labels={"gpu-a": {STATE_LABEL: "upgrade-required"}})),
        "values": build(state("v23.6.2", values={**target("v23.6.2").values, "extra": 1})),
        "max-parallel": build(state("v23.6.2"), max_parallel=2),
        "target": build(state("v23.6.2"), "v23.9.1"),
    }
    for what, p in changed.items():
        assert p.plan_hash != base, what
    st = state("v23.6.2")
    pods_elsewhere = replace(st, pdbs=({"metadata": {"name": "x", "namespace": "other"}},))
    assert build(pods_elsewhere).plan_hash == base  # a PDB that selects nothing of the plan


def test_hash_inputs_are_the_documented_ones():
    p = target("v23.6.2")
    st = state("v23.6.2")
    inputs = up.hash_inputs(st, p, [], 1, "25%")
    assert set(inputs) == {"kubernetes", "release", "target", "nodes", "maxParallel", "maxUnavailable"}
    assert set(inputs["release"]) == {"name", "namespace", "revision", "status", "chart", "values", "crds"}
    assert inputs["release"]["crds"] == {"clusterpolicies.nvidia.com": "900"}
    assert set(inputs["target"]) == {"release", "values", "chart"}  # chart: plan.chart_inputs (test_chart_pin)


# ---------------------------------------------------------------- the command line


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def files(tmp_path, write_site, site_data):
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{closed_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}]}))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": {
        "ansible_host": "127.0.0.1", "gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic"}}}}}}))
    return {"site": write_site(site_data), "inv": inv, "kc": kc, "tmp": tmp_path}


def test_an_unreachable_cluster_is_exit_5_and_the_plan_file_says_so(cli, files):
    out = files["tmp"] / "plan.json"
    rc, stdout, err = cli("upgrade", "plan", "-s", files["site"], "-i", files["inv"], "--kubeconfig", files["kc"],
                          "-o", out)
    assert rc == 5, err
    assert "cannot reach the Kubernetes API server" in err and stdout == ""
    doc = json.loads(out.read_text())
    jsonschema.Draft202012Validator(jsonout.json_schema(jsonout.UPGRADE_PLAN)).validate(doc)
    assert doc["exitCode"] == 5 and doc["error"]["type"] == "ClusterUnreachable" and doc["planHash"] is None
    assert doc["targetVersion"] == "v24.9.2"


def test_to_with_the_site_chart_and_no_target_chart_is_refused(cli, files, write_site, site_data, tmp_path):
    site_data["operator"]["chart"] = "gpu-operator-v24.9.2.tgz"
    site = write_site(site_data, "chart-site.yaml")
    rc, _, err = cli("upgrade", "plan", "-s", site, "-i", files["inv"], "--kubeconfig", files["kc"],
                     "--to", "v25.3.0")
    assert rc == 2 and "--to v25.3.0: operator.chart" in err and "--chart" in err


@pytest.mark.parametrize(("flag", "value", "said"), [("--max-unavailable", "0", "neither a node count"),
                                                      ("--max-parallel", "0", "must be at least 1"),
                                                      ("--format", "yaml", "invalid choice")])
def test_bad_flags_are_usage_errors(cli, files, capsys, flag, value, said):
    with pytest.raises(SystemExit) as exc:
        cli("upgrade", "plan", "-s", files["site"], "-i", files["inv"], flag, value)
    assert exc.value.code == 2 and said in capsys.readouterr().err


def test_an_inventory_is_required(cli, files, capsys, monkeypatch):
    monkeypatch.delenv("GPU_INSTALL_INVENTORY", raising=False)
    with pytest.raises(SystemExit) as exc:
        cli("upgrade", "plan", "-s", files["site"])
    assert exc.value.code == 2 and "-i/--inventory" in capsys.readouterr().err


# ---------------------------------------------------------------- reading lists: paged and bounded


@pytest.fixture
def list_server(tmp_path):
    """A real HTTP server on 127.0.0.1 answering list requests as the API server pages them (limit/continue); its
    `pages` decides what each request gets. Returns (ApiClient through installer.kube.api_client, the requests)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from installer import kube

    seen: list[dict] = []
    state: dict = {"endless": False, "total": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            seen.append({**q, "auth": self.headers.get("Authorization")})
            for word, code in (("missing", 404), ("forbidden", 403)):
                if word in self.path:
                    body = json.dumps({"kind": "Status", "message": f"{word} here", "code": code}).encode()
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
            start = int(q.get("continue", "0"))
            limit = int(q["limit"])
            end = min(start + limit, state["total"])
            items = [{"metadata": {"name": f"p{i}", "namespace": "ns"}} for i in range(start, end)]
            more = state["endless"] or end < state["total"]
            body = json.dumps({"kind": "PodList", "metadata": {"continue": str(end) if more else ""},
                               "items": items}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    try:
        yield kube.api_client(kc), seen, state
    finally:
        server.shutdown()


def test_lists_are_read_page_by_page_up_to_their_bound(list_server, monkeypatch):
    from installer.upgrade import cluster

    client, seen, state = list_server
    monkeypatch.setattr(cluster, "PAGE", 10)
    state["total"] = 25
    items, cut = cluster.list_all(client, "/api/v1/pods", "list pods", 100, [("fieldSelector", "spec.nodeName=a")])
    assert [i["metadata"]["name"] for i in items] == [f"p{i}" for i in range(25)] and not cut
    assert {q["auth"] for q in seen} == {"Bearer t"}
    assert [(q.get("continue"), q["limit"], q["fieldSelector"]) for q in seen] == [
        (None, "10", "spec.nodeName=a"), ("10", "10", "spec.nodeName=a"), ("20", "10", "spec.nodeName=a")]
    seen.clear()
    items, cut = cluster.list_all(client, "/api/v1/pods", "list pods", 15)
    assert len(items) == 15 and cut and [q["limit"] for q in seen] == ["10", "5"]


def test_a_server_that_never_stops_paging_is_cut(list_server, monkeypatch):
    from installer.upgrade import cluster

    client, seen, state = list_server
    monkeypatch.setattr(cluster, "PAGE", 10)
    state.update(total=0, endless=True)  # empty pages, a continue token every time
    items, cut = cluster.list_all(client, "/api/v1/pods", "list pods", 30)
    assert items == [] and cut and len(seen) == 30 // 10 + 2


def test_a_missing_list_is_none_and_a_refused_one_is_exit_7_with_the_servers_message(list_server):
    from installer.errors import ClusterError
    from installer.upgrade import cluster

    client, _, _ = list_server
    assert cluster.list_all(client, "/apis/policy/v1/missing", "list PodDisruptionBudgets", 10) is None
    with pytest.raises(ClusterError) as exc:
        cluster.list_all(client, "/api/v1/forbidden", "list pods", 10)
    assert exc.value.exit_code == 7 and "list pods: HTTP 403" in exc.value.message and "forbidden here" in \
        exc.value.message and "permission" in (exc.value.hint or "")


def test_limit_leaves_hosts_out_of_the_plan(files, tmp_path):
    from argparse import Namespace

    from installer.cli.common import resolve_plan

    inv = tmp_path / "two.yml"
    host = {"ansible_host": "127.0.0.1", "gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic"}
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": host, "gpu2": host}}}}}))
    from installer.cli import build_parser

    args = build_parser().parse_args(["upgrade", "plan", "-s", str(files["site"]), "-i", str(inv), "--limit", "gpu2",
                                      "-q"])
    assert isinstance(args, Namespace) and args.limit == "gpu2"
    assert [n.name for n in resolve_plan(args, need_inventory=True).nodes] == ["gpu2"]


def test_map_keys_with_dots_in_a_custom_resource_are_not_reported_as_pruned():
    """The lab's ClusterPolicy (as the v23.9.2 chart renders it) carries label keys with dots under
    spec.daemonsets.labels, a free-form map of the CRD: kept by the API server, so no blocker; a field the schema
    does not declare still is one, named with its dots."""
    from installer import helm
    from installer.tools import find_helm
    from installer.upgrade import release
    from tests.conftest import UPSTREAM, need

    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")
    tgz = UPSTREAM.parent / "charts" / "gpu-operator-v23.9.2.tgz"
    need(tgz.is_file(), f"real chart {tgz} not found")
    crds = helm.chart_crds(str(tgz), target("v23.9.2").values)
    cp = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
          "spec": {"daemonsets": {"labels": {"app.kubernetes.io/managed-by": "Helm",
                                             "helm.sh/chart": "gpu-operator-v23.9.2"}},
                   "driver": {"enabled": True}}}
    assert release.pruned_fields(crds, {"clusterpolicies.nvidia.com": [cp]}) == []
    cp["spec"]["driver"]["no.such.field"] = 1
    [b] = release.pruned_fields(crds, {"clusterpolicies.nvidia.com": [cp]})
    assert "drops field spec.driver.no.such.field that it sets" in b.what
