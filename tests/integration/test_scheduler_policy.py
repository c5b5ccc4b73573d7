"""scheduler_policy against the lab's REAL kube-scheduler 1.20.2, run from its static-pod manifest by the lab's
kubelet stand-in (gpu_install_lab/staticpods.py).

A small test extender (HTTP on 127.0.0.1, in this process) records every call; its filter keeps only one chosen
node. The role is driven through the real CLI (`gpu-install apply --limit bastion --tags scheduler`), the broken
policy through installer.apply with role variables that bypass the site validation (a prioritizeVerb with weight 0,
which kube-scheduler 1.20 refuses). Order matters (one lab): legacy Policy, KubeSchedulerConfiguration v1beta1,
sharing.mode gpumanager's gpu-quota-admission extender in both formats, broken policy rolled back, removal.

For gpu-quota-admission the test extender plays a STAND-IN of its filter at the URL the site gives
(sharing.gpumanager.extenderUrl; the real one is a Service in the cluster): verb `predicates`, whole Node objects,
"no GPU device" for a node without tencent.com/vcuda-core, and it refuses a request gpu-manager cannot grant (150
cores) with gpu-manager's own words -- so that a pod the extender rejects is seen staying Pending with its reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
VENV_BIN = Path(sys.executable).parent
VCUDA_CORE, VCUDA_MEMORY = "tencent.com/vcuda-core", "tencent.com/vcuda-memory"


class Extender:
    """A scheduler extender: filter keeps only `chosen`, prioritize gives it the top score; calls recorded."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.chosen = ""
        outer = self

        def vcuda(args: dict, names: list[str]) -> dict:
            """STAND-IN of gpu-quota-admission's filter (verb predicates)."""
            limits = {}
            for c in (args.get("Pod") or {}).get("spec", {}).get("containers", []):
                limits.update((c.get("resources") or {}).get("limits") or {})
            core = int(limits.get(VCUDA_CORE, "0"))
            failed, keep = {}, []
            for node in (args.get("Nodes") or {}).get("items") or []:
                name = node["metadata"]["name"]
                if int((node.get("status", {}).get("capacity") or {}).get(VCUDA_CORE, "0")) <= 0:
                    failed[name] = "no GPU device"
                elif core > 100 and core % 100:
                    failed[name] = "cores are greater than 100, must be multiple of 100"
                else:
                    keep.append(node)
            return {"Nodes": {"items": keep}, "FailedNodes": failed, "Error": ""}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                args = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                verb = self.path.rsplit("/", 1)[-1]
                pod = (args.get("Pod") or {}).get("metadata", {}).get("name")
                if args.get("NodeNames") is not None:  # nodeCacheCapable: names only
                    names = list(args["NodeNames"])
                else:
                    names = [n["metadata"]["name"] for n in (args.get("Nodes") or {}).get("items") or []]
                outer.calls.append({"verb": verb, "pod": pod, "nodes": names, "cached": args.get("NodeNames") is not None})
                if verb == "predicates":
                    body = vcuda(args, names)
                elif verb == "filter":
                    keep = [n for n in names if n == outer.chosen]
                    body = {"FailedNodes": {n: "not the extender's choice" for n in names if n not in keep}, "Error": ""}
                    if args.get("NodeNames") is not None:
                        body["NodeNames"] = keep
                    else:
                        body["Nodes"] = {"items": [n for n in args["Nodes"]["items"] if n["metadata"]["name"] in keep]}
                else:  # prioritize
                    body = [{"Host": n, "Score": 10 if n == outer.chosen else 0} for n in names]
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/gpu"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Scheduling:
    def __init__(self, lab, work: Path, ext: Extender):
        from kubernetes import client, config

        self.lab, self.work, self.ext = lab, work, ext
        self.kube = lab.dir / "kube"
        self.manifest = self.kube / "manifests" / "kube-scheduler.yaml"
        self.etc = self.kube / "etc-kubernetes"
        self.original = self.manifest.read_bytes()
        self.state = work / "state"
        kubeconfig = lab.status["kubernetes"]["kubeconfig"]
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.pods: list[str] = []

    def env(self) -> dict[str, str]:
        return {**os.environ, "GPU_INSTALL_STATE": str(self.state), "ANSIBLE_LOCAL_TEMP": str(self.state / "tmp")}

    def site(self, extra: dict | None = None, **scheduler) -> Path:
        path = self.work / "site.yaml"
        path.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                                        "scheduler": scheduler, "driver": {"customImageOs": LAB_DRIVER_OS},
                                        **(extra or {})}))
        return path

    def cli(self, site: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "gpu-install"), "apply", "-s", str(site), "-i", str(self.lab.inventory),
                               "--limit", "bastion", "--tags", "scheduler"],
                              capture_output=True, text=True, env=self.env(), timeout=600)

    def site_stats(self) -> dict[str, int]:
        runs = sorted((self.state / "runs").glob("*-site*"), key=lambda p: p.stat().st_mtime)
        for ev in (runs[-1] / "artifacts" / "run" / "job_events").glob("*.json"):
            data = json.loads(ev.read_text())
            if data.get("event") == "playbook_on_stats":
                d = data["event_data"]
                return {k: int((d.get(k) or {}).get("bastion", 0)) for k in ("ok", "changed", "failures")}
        raise AssertionError(f"no stats in {runs[-1]}")

    def scheduler(self) -> dict:
        from gpu_install_lab.kube import ControlPlane

        return ControlPlane(self.lab.dir, progress=lambda m: None).status()["components"]["kube-scheduler"]

    def scheduler_cmdline(self) -> list[str]:
        pid = self.scheduler()["pid"]
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]

    def pod(self, name: str, gpus: int, limits: dict[str, str] | None = None, scheduled: bool = True) -> dict:
        limits = limits if limits is not None else {"nvidia.com/gpu": str(gpus)} if gpus else {}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "lab.invalid/cuda:1", "resources": {"limits": limits}}]}}
        from kubernetes.client.exceptions import ApiException

        for attempt in range(20):  # a fresh namespace's default service account may not be there yet (403 until then)
            try:
                self.api.create_namespaced_pod("default", body)
                break
            except ApiException as exc:
                if exc.status != 403 or "serviceaccount" not in str(exc.body) or attempt == 19:
                    raise
                time.sleep(1)
        self.pods.append(name)
        deadline = time.time() + 90
        while time.time() < deadline:
            p = self.api.read_namespaced_pod(name, "default")
            if p.spec.node_name:
                return {"node": p.spec.node_name}
            cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
            if not scheduled and cond is not None and cond.reason == "Unschedulable":
                return {"node": None, "message": cond.message}
            time.sleep(0.5)
        raise AssertionError(f"pod {name} was not scheduled: {self.api.read_namespaced_pod(name, 'default').status}")

    def delete_pods(self) -> None:
        for name in self.pods:
            try:
                self.api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            except Exception:  # noqa: BLE001
                pass
        self.pods.clear()


@pytest.fixture(scope="module")
def sched(lab_kubernetes, tmp_path_factory):
    ext = Extender()
    s = Scheduling(lab_kubernetes, tmp_path_factory.mktemp("sched"), ext)
    try:
        yield s
    finally:
        s.delete_pods()
        ext.stop()
        if s.manifest.read_bytes() != s.original:  # leave the lab's scheduler as it was found
            s.manifest.write_bytes(s.original)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _extender_case(sched: Scheduling, chosen: str, tag: str, **extender) -> None:
    sched.ext.chosen = chosen
    before = len(sched.ext.calls)
    gpu = sched.pod(f"gpu-{tag}", 1)
    sched.pod(f"cpu-{tag}", 0)  # scheduled too (pod() asserts it)
    assert gpu["node"] == chosen, (gpu, sched.ext.calls[before:])
    calls = sched.ext.calls[before:]
    assert any(c["verb"] == "filter" and c["pod"] == f"gpu-{tag}" for c in calls), calls
    assert all(c["pod"] != f"cpu-{tag}" for c in calls), calls  # managedResources: only GPU pods go there
    assert all(c["cached"] is bool(extender.get("nodeCacheCapable")) for c in calls), calls
    assert len(calls[0]["nodes"]) >= 2, calls  # it really had a choice to make
    sched.delete_pods()


def test_legacy_policy_extender_consulted_then_changed_0(sched):
    nodes = sorted(sched.lab.nodes)
    ext = {"urlPrefix": sched.ext.url, "filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 2,
           "managedResources": [{"name": "nvidia.com/gpu"}], "httpTimeout": "5s"}
    site = sched.site(extenders=[ext])  # format auto on 1.20: legacy Policy
    _ok(sched.cli(site))
    policy = json.loads((sched.etc / "gpu-install-scheduler-policy.json").read_text())
    assert policy["kind"] == "Policy" and policy["apiVersion"] == "v1"
    assert policy["extenders"][0]["httpTimeout"] == 5 * 10 ** 9  # the legacy Policy's time.Duration
    cmd = sched.scheduler_cmdline()
    assert "--policy-config-file=/etc/kubernetes/gpu-install-scheduler-policy.json" in cmd
    assert "--use-legacy-policy-config=true" in cmd
    doc = yaml.safe_load(sched.manifest.read_text())
    assert doc["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert sorted(p.name for p in (sched.kube / "manifests").iterdir()) == ["kube-scheduler.yaml"]  # no backup there
    _extender_case(sched, nodes[-1], "policy", **ext)
    assert sched.scheduler()["healthy"]
    _ok(sched.cli(site))
    stats = sched.site_stats()
    assert stats["changed"] == 0 and stats["ok"] > 0, stats


def test_config_format_v1beta1(sched):
    nodes = sorted(sched.lab.nodes)
    ext = {"urlPrefix": sched.ext.url, "filterVerb": "filter", "nodeCacheCapable": True,
           "managedResources": [{"name": "nvidia.com/gpu"}]}
    _ok(sched.cli(sched.site(extenders=[ext], format="config")))
    cfg = yaml.safe_load((sched.etc / "gpu-install-scheduler-config.yaml").read_text())
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1beta1"
    assert cfg["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"  # --kubeconfig is ignored with --config
    assert cfg["leaderElection"]["leaderElect"] is False
    assert not (sched.etc / "gpu-install-scheduler-policy.json").exists()  # the other format's file is gone
    assert "--config=/etc/kubernetes/gpu-install-scheduler-config.yaml" in sched.scheduler_cmdline()
    _extender_case(sched, nodes[0], "config", **ext)


def _vcuda_capacity(sched, node: str, cores: int | None) -> None:
    """What gpu-manager's device plugin would advertise (the lab's hollow kubelets keep extended resources they do
    not manage); None takes it away again."""
    value = None if cores is None else str(cores)
    mem = None if cores is None else str(cores // 100 * 64)
    patch = {"status": {"capacity": {VCUDA_CORE: value, VCUDA_MEMORY: mem},
                        "allocatable": {VCUDA_CORE: value, VCUDA_MEMORY: mem}}}
    sched.api.patch_node_status(node, patch)


@pytest.mark.parametrize("fmt", ["policy", "config"])
def test_gpu_quota_admission_extender(sched, fmt):
    """sharing.mode gpumanager wires gpu-quota-admission exactly as it is configured (POST <url>/predicates, whole
    Node objects, plain HTTP, managed resources tencent.com/vcuda-core and -memory), in the legacy Policy and as a
    KubeSchedulerConfiguration; kube-scheduler consults it for vcuda pods only, a share lands on the node with vGPU
    capacity, and a pod the extender rejects stays Pending with the extender's reason."""
    nodes = sorted(sched.lab.nodes)
    gpu_node, plain = nodes[0], nodes[1]
    extra = {"sharing": {"mode": "gpumanager", "gpumanager": {"extenderUrl": sched.ext.url}},
             "toolkit": {"mode": "host"}, "components": {"devicePlugin": {"enabled": False}}}
    _ok(sched.cli(sched.site(extra, format=fmt)))
    if fmt == "policy":
        ext = json.loads((sched.etc / "gpu-install-scheduler-policy.json").read_text())["extenders"]
    else:
        ext = yaml.safe_load((sched.etc / "gpu-install-scheduler-config.yaml").read_text())["extenders"]
    assert ext == [{"urlPrefix": sched.ext.url, "filterVerb": "predicates",
                    "managedResources": [{"name": VCUDA_CORE, "ignoredByScheduler": False},
                                         {"name": VCUDA_MEMORY, "ignoredByScheduler": False}]}], ext
    _vcuda_capacity(sched, gpu_node, 200)
    try:
        before = len(sched.ext.calls)
        share = sched.pod(f"vcuda-50-{fmt}", 0, {VCUDA_CORE: "50", VCUDA_MEMORY: "4"})
        assert share["node"] == gpu_node, (share, sched.ext.calls[before:])
        sched.pod(f"cpu-{fmt}", 0)
        calls = sched.ext.calls[before:]
        assert calls and all(c["verb"] == "predicates" and not c["cached"] for c in calls), calls
        assert {c["pod"] for c in calls} == {f"vcuda-50-{fmt}"}, calls  # the CPU pod never goes there
        bad = sched.pod(f"vcuda-150-{fmt}", 0, {VCUDA_CORE: "150", VCUDA_MEMORY: "4"}, scheduled=False)
        assert bad["node"] is None
        assert "cores are greater than 100, must be multiple of 100" in bad["message"], bad
        p = sched.api.read_namespaced_pod(f"vcuda-150-{fmt}", "default")
        assert p.status.phase == "Pending" and not p.spec.node_name
        print(f"{fmt}: vcuda-150 Pending: {bad['message']}")
    finally:
        sched.delete_pods()
        _vcuda_capacity(sched, gpu_node, None)
    assert plain != gpu_node and sched.scheduler()["healthy"]


def _apply_control_plane(sched, site, run):
    """apply's node stages (preflight, site.yml) on the resolved plan, limited to the control-plane host."""
    from installer import apply
    from tests.conftest import plan_of

    plan = plan_of(site, inventory=str(sched.lab.inventory), limit="bastion")
    apply.preflight(plan, run)
    return apply.run_nodes("site.yml", plan, run)


def test_broken_policy_is_rolled_back(sched, monkeypatch):
    from installer import apply
    from installer.config import parse_site
    from installer.errors import HostFailures

    before = sched.manifest.read_bytes()
    old_cmd = sched.scheduler_cmdline()
    monkeypatch.setenv("GPU_INSTALL_STATE", str(sched.state))
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}})
    broken = [{"urlPrefix": sched.ext.url, "filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 0}]
    run = apply.RunOptions(tags="scheduler",
                           extra={"scheduler_policy_extenders": broken, "scheduler_policy_format": "policy"})
    t0 = time.monotonic()
    with pytest.raises(HostFailures) as exc:
        _apply_control_plane(sched, site, run)
    print(f"broken policy: rollback reported after {time.monotonic() - t0:.1f}s")
    assert exc.value.exit_code == 4
    msg = exc.value.message
    assert "ROLLED BACK" in msg and "restored" in msg, msg
    assert "must have a positive weight" in msg, msg  # the scheduler's own complaint
    assert sched.manifest.read_bytes() == before
    st = sched.scheduler()
    assert st["running"] and st["healthy"], st
    assert sched.scheduler_cmdline()[1:] == old_cmd[1:]
    assert list((sched.kube / "backups").glob("gpu-install-scheduler-policy.json.*.rejected"))


def test_removal_restores_the_original_manifest(sched, monkeypatch):
    from installer import apply
    from installer.config import parse_site

    monkeypatch.setenv("GPU_INSTALL_STATE", str(sched.state))
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}})
    run = apply.RunOptions(tags="scheduler", extra={"gpu_install_action": "remove"})
    res = _apply_control_plane(sched, site, run)
    assert res.hosts["bastion"].changed >= 1
    assert sched.manifest.read_bytes() == sched.original
    assert not list(sched.etc.glob("gpu-install-scheduler-*"))
    cmd = sched.scheduler_cmdline()
    assert not any(a.startswith(("--config", "--policy-config-file")) for a in cmd), cmd
    assert sched.scheduler()["healthy"]
    again = _apply_control_plane(sched, site, run)
    assert again.hosts["bastion"].changed == 0
