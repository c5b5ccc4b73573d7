"""The lab control plane for real: kube-apiserver + etcd + scheduler + controller-manager built from
Debian's kubernetes 1.20.2 source, kubemark hollow kubelets as GPU nodes. No mocks."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_install_lab import kube, proc

from .conftest import NODES

pytestmark = pytest.mark.kubernetes


def pod(name: str, resources: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "cuda", "image": "lab.invalid/cuda-smoke:1", "command": ["nvidia-smi"],
                 "resources": {"limits": resources}}
            ],
        },
    }


def wait_for(what: str, fn, timeout: float = 60, interval: float = 0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def test_apiserver_ready_and_status(control_plane, kubectl):
    assert kubectl.run("get", "--raw", "/readyz").stdout.strip() == "ok"
    st = control_plane.status()
    for comp in kube.COMPONENTS:
        assert st["components"][comp]["running"], st
        assert st["components"][comp]["healthy"], st
        assert isinstance(st["components"][comp]["pid"], int)
    assert st["kubeconfig"] == str(control_plane.kubeconfig)
    assert st["server"].startswith("https://127.0.0.1:")
    assert set(st["nodes"]) >= {n["name"] for n in NODES}
    assert all(n["running"] and n["healthy"] for n in st["nodes"].values()), st["nodes"]
    version = kubectl.json("version")
    assert version["serverVersion"]["gitVersion"] == f"v{kube.KUBE_VERSION}"


def test_up_is_idempotent(control_plane):
    before = {k: v["pid"] for k, v in control_plane.status()["components"].items()}
    control_plane.up()
    after = {k: v["pid"] for k, v in control_plane.status()["components"].items()}
    assert before == after


def test_get_nodes_lists_ready_gpu_nodes(kubectl):
    out = kubectl.run("get", "nodes").stdout
    for n in NODES:
        assert n["name"] in out
    nodes = {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}
    for spec in NODES:
        node = nodes[spec["name"]]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["status"]["conditions"]
        assert not node["spec"].get("unschedulable")
        taints = [t["key"] for t in node["spec"].get("taints", [])]
        assert "node.kubernetes.io/not-ready" not in taints
        alloc, cap = node["status"]["allocatable"], node["status"]["capacity"]
        labels = node["metadata"]["labels"]
        if spec["gpus"]:
            assert cap["nvidia.com/gpu"] == str(spec["gpus"])
            assert alloc["nvidia.com/gpu"] == str(spec["gpus"])
            assert labels["nvidia.com/gpu.present"] == "true"
            assert labels["nvidia.com/gpu.count"] == str(spec["gpus"])
            assert labels["nvidia.com/gpu.product"]
        else:
            assert "nvidia.com/gpu" not in alloc
            assert "nvidia.com/gpu.present" not in labels
        # hollow nodes report a fake address from TEST-NET-2, never a real one
        ips = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert ips and all(ipaddress.ip_address(ip) in kube.FAKE_NODE_NET for ip in ips), ips
        assert node["metadata"]["annotations"]["gpu-install.lab/node-ip"] == spec["ip"]
        assert node["status"]["nodeInfo"]["kubeletVersion"] == f"v{kube.KUBE_VERSION}"
    assert nodes["gpu-a"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert nodes["gpu-b"]["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "7"
    # the custom-columns view a user would type
    cols = kubectl.run("get", "nodes", "-o", "custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu").stdout
    assert any(line.split() == ["gpu-a", "2"] for line in cols.splitlines()), cols


def test_gpu_pod_is_scheduled_onto_a_gpu_node_and_runs(kubectl, namespace):
    kubectl.apply({**pod("one-gpu", {"nvidia.com/gpu": "1"}), "metadata": {"name": "one-gpu", "namespace": namespace}})
    p = wait_for("the pod to be bound", lambda: (lambda o: o if o["spec"].get("nodeName") else None)(
        kubectl.json("get", "pod", "one-gpu", "-n", namespace)))
    assert p["spec"]["nodeName"] in {n["name"] for n in NODES if n["gpus"] >= 1}
    # a hollow kubelet admits it against the node's allocatable and reports it Running (fake runtime)
    wait_for("the pod to run", lambda: kubectl.json("get", "pod", "one-gpu", "-n", namespace)["status"].get("phase") == "Running")


def test_pod_wanting_more_gpus_than_any_node_stays_pending(kubectl, namespace):
    most = max(n["gpus"] for n in NODES)
    kubectl.apply({**pod("too-many", {"nvidia.com/gpu": str(most + 1)}),
                   "metadata": {"name": "too-many", "namespace": namespace}})

    def unschedulable():
        p = kubectl.json("get", "pod", "too-many", "-n", namespace)
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        c = conds.get("PodScheduled")
        return p if c and c["status"] == "False" and c.get("reason") == "Unschedulable" else None

    p = wait_for("the scheduler to reject the pod", unschedulable)
    assert not p["spec"].get("nodeName")
    assert p["status"]["phase"] == "Pending"
    msg = [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"][0]["message"]
    assert "Insufficient nvidia.com/gpu" in msg, msg
    time.sleep(3)  # and it stays so
    assert not kubectl.json("get", "pod", "too-many", "-n", namespace)["spec"].get("nodeName")


def test_mig_resource_pod_lands_on_the_mig_node(kubectl, namespace):
    kubectl.apply({**pod("mig", {"nvidia.com/mig-1g.5gb": "1"}), "metadata": {"name": "mig", "namespace": namespace}})
    p = wait_for("the MIG pod to be bound", lambda: (lambda o: o if o["spec"].get("nodeName") else None)(
        kubectl.json("get", "pod", "mig", "-n", namespace)))
    assert p["spec"]["nodeName"] == "gpu-b"


def test_apiserver_never_connects_to_hollow_node_ips(kubectl, namespace):
    """kubectl logs/exec would make the apiserver dial the node's (fake) IP: the egress selector
    sends that to a dead Unix socket, so it fails at once instead of leaving loopback."""
    kubectl.apply({**pod("logs", {"nvidia.com/gpu": "1"}), "metadata": {"name": "logs", "namespace": namespace}})
    wait_for("the pod to run", lambda: kubectl.json("get", "pod", "logs", "-n", namespace)["status"].get("phase") == "Running")
    t0 = time.monotonic()
    proc = kubectl.run("logs", "logs", "-n", namespace, check=False, timeout=30)
    assert proc.returncode != 0
    assert "no-egress.sock" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 10


def _listeners(netns: str | None = None) -> list[tuple[str, int]]:
    """(local address, pid) of every listening TCP socket, in the host's or a namespace's view."""
    cmd = ["ss", "-Hltnp"] if netns is None else ["ip", "netns", "exec", netns, "ss", "-Hltnp"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        for pid in re.findall(r"pid=(\d+)", line):
            rows.append((parts[3], int(pid)))
    return rows


def test_everything_listens_on_loopback_only(control_plane):
    state = json.loads(control_plane.state_path.read_text())
    ours = {r["pid"] for r in state["processes"].values()}
    ours |= {r["pid"] for r in control_plane.static_pods().values() if "pid" in r}  # kube-scheduler (static pod)
    host = [(addr, pid) for addr, pid in _listeners() if pid in ours]
    assert host, "no listening socket of the control plane found"
    assert all(addr.startswith("127.0.0.1:") for addr, _ in host), host
    ns = state["netns"]
    inside = _listeners(ns)
    assert {pid for _, pid in inside} >= {state["processes"][f"node-{n['name']}"]["pid"] for n in NODES}
    assert all(addr.startswith("127.0.0.1:") for addr, _ in inside), inside
    # the nodes' namespace has no route anywhere: the fake IPs sit on lo
    routes = subprocess.run(["ip", "-n", ns, "-4", "route", "show"], capture_output=True, text=True).stdout
    assert routes.strip() == "", routes
    links = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout
    assert [ln.split(":")[1].strip() for ln in links.splitlines()] == ["lo"]


def test_node_registration_is_validated(control_plane):
    from installer.errors import ConfigError

    with pytest.raises(ConfigError):
        control_plane.register_nodes([{"name": "Bad_Name", "ip": "", "gpus": 1, "labels": {}}])
    with pytest.raises(ConfigError):
        control_plane.register_nodes([{"name": "ok", "ip": "", "gpus": 1, "labels": {"nvidia.com/gpu.product": "no spaces allowed"}}])


def test_reregistering_a_node_updates_its_gpus(control_plane, kubectl):
    control_plane.register_nodes([{"name": "flex", "ip": "10.250.0.20", "gpus": 2,
                                   "labels": {"nvidia.com/mig-2g.10gb.count": "3"}}])
    node = kubectl.json("get", "node", "flex")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["status"]["allocatable"]["nvidia.com/mig-2g.10gb"] == "3"
    assert node["metadata"]["labels"]["nvidia.com/mig.capable"] == "true"
    control_plane.register_nodes([{"name": "flex", "ip": "10.250.0.20", "gpus": 1, "labels": {}}])
    node = kubectl.json("get", "node", "flex")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/mig-2g.10gb" not in node["status"]["allocatable"]
    assert "nvidia.com/mig-2g.10gb" not in node["status"]["capacity"]
    assert "nvidia.com/mig-2g.10gb.count" not in node["metadata"]["labels"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "1"
    time.sleep(12)  # a kubelet status update (every 10 s) keeps what the lab set
    node = kubectl.json("get", "node", "flex")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/mig-2g.10gb" not in node["status"]["allocatable"]


def test_down_leaves_nothing(kube_bin, tmp_path):
    """A second control plane, torn down by a *fresh* ControlPlane object (as after a crash)."""
    lab = tmp_path / "lab"
    cp = kube.ControlPlane(lab, progress=print)
    try:
        cp.up()
        cp.register_nodes([{"name": "solo", "ip": "10.250.0.99", "gpus": 1, "labels": {}}])
        state = json.loads((lab / "kube" / "state.json").read_text())
        records = list(state["processes"].values())
        assert {"etcd", "kube-apiserver", kube.STANDIN, "kube-controller-manager", "node-solo",
                "apiserver-forwarder"} <= set(state["processes"])
        pods = cp.static_pods()
        assert set(pods) == {"kube-scheduler"}  # run by the kubelet stand-in from its static-pod manifest
        records += list(pods.values())
        assert all(proc.alive(r) for r in records)
        netns = state["netns"]
    finally:
        kube.ControlPlane(lab, progress=print).down()
    assert not any(proc.alive(r) for r in records)
    for r in records:  # not even a zombie under that pid with that start time
        st = proc.proc_stat(r["pid"])
        assert st is None or st[1] != r["start"], r["argv"]
    assert not (lab / "kube").exists()
    assert not os.path.exists(f"/run/netns/{netns}")
    # down again is a no-op
    kube.ControlPlane(lab, progress=print).down()


def test_down_after_a_crashed_up(kube_bin, tmp_path):
    """`up` killed with SIGKILL half-way: down() from the state file alone stops what it started."""
    lab = tmp_path / "lab"
    repo = Path(kube.__file__).resolve().parents[2]
    up = subprocess.Popen([sys.executable, "-m", "gpu_install_lab.kube", "up", "--lab-dir", str(lab), "--nodes", "1"],
                          cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_path = lab / "kube" / "state.json"

    def started():
        try:
            return kube.STANDIN in json.loads(state_path.read_text())["processes"]
        except (OSError, ValueError):
            return False

    try:
        wait_for("up to start the scheduler", started, timeout=120, interval=0.1)
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait()
    records = list(json.loads(state_path.read_text())["processes"].values())
    assert any(proc.alive(r) for r in records)  # the crash left processes behind
    kube.ControlPlane(lab, progress=print).down()
    assert not any(proc.alive(r) for r in records)
    assert not (lab / "kube").exists()
