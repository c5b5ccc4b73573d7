"""validate's report (JSON schema, JUnit XML, exit codes, table) and the smoke layer's verdicts, from Kubernetes API
objects as the client returns them (kubernetes.client models) and a fake log reader."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Node,
    V1NodeCondition,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
)

from installer.errors import ConfigError
from installer.validate import cluster, parse_only, smoke
from installer.validate.report import CLUSTER, SCHEMA, Check, Report


def report(*statuses: str) -> Report:
    r = Report("v23.9.2", ("cluster", "smoke"))
    for i, s in enumerate(statuses):
        r.add(Check("cluster" if i % 2 == 0 else "smoke", f"x.check{i}", f"node{i % 3}", s, f"message {i}", f"fix {i}"))
    return r


@pytest.mark.parametrize(("statuses", "code"), [
    (("pass", "pass", "skip"), 0), (("pass", "warn"), 0), (("pass", "fail", "warn"), 6),
    (("fail", "unreachable"), 5), ((), 0),
])
def test_exit_codes(statuses, code):
    assert report(*statuses).exit_code() == code


def test_json_is_the_documented_schema():
    doc = report("pass", "fail", "warn").to_json()
    assert doc["schema"] == SCHEMA and doc["release"] == "v23.9.2" and doc["exitCode"] == 6
    assert doc["summary"] == {"pass": 1, "fail": 1, "warn": 1, "skip": 0, "unreachable": 0}
    assert set(doc["checks"][0]) == {"layer", "check", "node", "status", "message", "fix", "gpu", "seconds"}


def test_junit_one_testcase_per_check_failures_and_skips():
    r = report("pass", "fail", "skip", "unreachable")
    root = ET.fromstring(r.to_junit().split("\n", 1)[1])
    cases = root.findall(".//testcase")
    assert len(cases) == 4 and root.get("tests") == "4" and root.get("failures") == "2"
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["x.check1", "x.check3"]
    assert "fix 1" in failed[0].find("failure").text
    assert next(c for c in cases if c.get("name") == "x.check2").find("skipped") is not None
    assert {s.get("name") for s in root.findall("testsuite")} == {"cluster", "smoke"}


def test_table_lists_each_finding_with_its_fix():
    from rich.console import Console

    buf = io.StringIO()
    report("pass", "fail").render(Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "FAIL node1 x.check1: message 1" in text and "fix: fix 1" in text and "1 passed, 1 failed" in text


def test_only_parses_and_refuses():
    assert parse_only(None) == ("node", "runtime", "cluster", "smoke", "mig", "metrics")
    assert parse_only("metrics,node") == ("node", "metrics")
    assert parse_only("mig,smoke,cluster,runtime") == ("runtime", "cluster", "smoke", "mig")
    with pytest.raises(ConfigError, match="unknown layer"):
        parse_only("cluster,gpus")
    with pytest.raises(ConfigError, match="need the cluster"):
        parse_only("node,mig", local=True)


def _node(name, ready="True", alloc=None, cap=None, cordoned=False):
    return V1Node(metadata=V1ObjectMeta(name=name), spec=V1NodeSpec(unschedulable=cordoned), status=V1NodeStatus(
        conditions=[V1NodeCondition(type="Ready", status=ready, reason="KubeletReady" if ready == "True" else
                                    "KubeletNotReady", message="container runtime is down")],
        allocatable=alloc or {}, capacity=cap or alloc or {}))


def test_node_checks():
    checks = cluster.node_checks({
        "a": _node("a", alloc={"nvidia.com/gpu": "2"}),
        "b": _node("b", ready="False", alloc={"nvidia.com/gpu": "0"}, cap={"nvidia.com/gpu": "1"}),
        "c": _node("c", alloc={"nvidia.com/mig-1g.10gb": "7", "cpu": "4"}, cordoned=True),
        "d": _node("d", alloc={"cpu": "4"}),
    }, ["a", "b", "c", "d", "e"])
    got = {(c.node, c.check): c for c in checks}
    assert got[("a", "cluster.gpu-allocatable")].status == "pass"
    assert got[("b", "cluster.node-ready")].status == "fail" and "container runtime is down" in \
        got[("b", "cluster.node-ready")].message
    assert "unhealthy" in got[("b", "cluster.gpu-allocatable")].message
    assert got[("c", "cluster.gpu-allocatable")].message == "allocatable: 7 nvidia.com/mig-1g.10gb"
    assert got[("c", "cluster.node-schedulable")].status == "warn"
    assert got[("d", "cluster.gpu-allocatable")].status == "fail" and "device plugin" in \
        got[("d", "cluster.gpu-allocatable")].fix
    assert got[("e", "cluster.node-present")].status == "fail" and ("e", "cluster.node-ready") not in got
    assert all(c.fix == "" for c in checks if c.status == "pass")


class Logs:
    def __init__(self, logs):
        self.logs = logs

    def read_namespaced_pod_log(self, name, namespace, container, _request_timeout=None):
        return self.logs[container]


def _pod(phase, init=None, main=None, conditions=None):
    return V1Pod(metadata=V1ObjectMeta(name="p"), status=V1PodStatus(
        phase=phase, init_container_statuses=init, container_statuses=main, conditions=conditions))


def _status(name, waiting=None, message=None, exit_code=None):
    state = V1ContainerState(
        waiting=V1ContainerStateWaiting(reason=waiting, message=message) if waiting else None,
        terminated=V1ContainerStateTerminated(exit_code=exit_code) if exit_code is not None else None)
    return V1ContainerStatus(name=name, state=state, image="i", image_id="", ready=False, restart_count=0)


SMI = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n"


def test_smoke_verdicts():
    t = smoke.Target("node1", "nvidia.com/gpu", pod="p")
    ok = smoke.verdict(t, _pod("Succeeded"), Logs({"nvidia-smi": SMI, "vectoradd": "Test PASSED\nDone\n"}), "ns", 1e9)
    assert ok.status == "pass" and "listed 1 GPU(s)" in ok.message
    bad = smoke.verdict(t, _pod("Succeeded"), Logs({"nvidia-smi": "No devices were found\n", "vectoradd": "hi"}),
                        "ns", 1e9)
    assert bad.status == "fail"
    failed = smoke.verdict(t, _pod("Failed", init=[_status("nvidia-smi", exit_code=9)]),
                           Logs({"nvidia-smi": "NVIDIA-SMI has failed because it couldn't communicate with the "
                                               "NVIDIA driver."}), "ns", 1e9)
    assert failed.status == "fail" and "nvidia-smi exited 9" in failed.message and "runtime" in failed.fix
    pull = smoke.verdict(t, _pod("Pending", init=[_status("nvidia-smi", "ErrImagePull", "manifest unknown")]),
                         Logs({}), "ns", 1e9)
    assert pull.status == "fail" and pull.message == "nvidia-smi: ErrImagePull: manifest unknown"
    assert "mirror push" in pull.fix
    running = smoke.verdict(t, _pod("Running"), Logs({}), "ns", 1e9)
    assert running is None


def test_an_empty_log_of_a_succeeded_pod_is_read_again_for_the_grace_only():
    """The kubelet may report a short-lived container terminated before the runtime's copy of its output reached the
    log file: an empty log is read again on the next polls (for LOG_GRACE), and only then is it what the container
    said."""
    t = smoke.Target("node1", "nvidia.com/gpu", pod="p")
    empty = Logs({"nvidia-smi": SMI, "vectoradd": ""})
    assert smoke.verdict(t, _pod("Succeeded"), empty, "ns", 100.0) is None
    assert smoke.verdict(t, _pod("Succeeded"), empty, "ns", 100.0 + smoke.LOG_GRACE - 1) is None
    ok = smoke.verdict(t, _pod("Succeeded"), Logs({"nvidia-smi": SMI, "vectoradd": "Test PASSED\n"}), "ns", 105.0)
    assert ok.status == "pass", ok.message
    t = smoke.Target("node2", "nvidia.com/gpu", pod="p")
    assert smoke.verdict(t, _pod("Succeeded"), empty, "ns", 100.0) is None
    late = smoke.verdict(t, _pod("Succeeded"), empty, "ns", 100.0 + smoke.LOG_GRACE)
    assert late.status == "fail" and "vectorAdd said ''" in late.message


def test_unschedulable_is_reported_after_the_grace_only():
    t = smoke.Target("node1", "nvidia.com/gpu", pod="p")
    cond = [V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                           message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")]
    assert smoke.verdict(t, _pod("Pending", conditions=cond), Logs({}), "ns", 100.0) is None
    late = smoke.verdict(t, _pod("Pending", conditions=cond), Logs({}), "ns", 100.0 + smoke.UNSCHEDULABLE_GRACE)
    assert late.status == "fail" and "Insufficient nvidia.com/gpu" in late.message and "in use" in late.fix


def test_smoke_pod_body():
    t = smoke.Target("gpu-07", "nvidia.com/mig-1g.10gb", pod="gpu-install-smoke-abc-0")
    body = smoke.pod_body(t, "gpu-operator", "abc", "reg/nvidia/cuda:12", "reg/validator:v1", "regcred", "nvidia")
    spec = body["spec"]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchFields"][0]["values"] == ["gpu-07"]
    assert spec["initContainers"][0]["command"] == ["nvidia-smi", "-L"]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["runtimeClassName"] == "nvidia"
    assert body["metadata"]["labels"][smoke.RUN_LABEL] == "abc"
    # a cordoned node (upgrade apply validates a batch before uncordoning it) still runs the smoke pod
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]
    assert CLUSTER == "(cluster)"


def test_an_api_refusal_is_a_cluster_error_naming_the_apiserver_message():
    """A 403 (the kubeconfig's user may not list nodes) is exit 7 with the API server's message, not a traceback."""
    from kubernetes.client import ApiClient
    from kubernetes.client.exceptions import ApiException

    from installer import validate
    from installer.config import load_site
    from installer.errors import ClusterError
    from installer.plan import Options, resolve

    root = Path(__file__).resolve().parents[2]
    plan = resolve(load_site(root / "inventories/sample/site.yaml"),
                   Options(inventory=str(root / "inventories/sample/hosts.yml")))

    class Refusing(ApiClient):
        def call_api(self, *a, **kw):
            raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ClusterError) as err:
        validate.run(plan, None, ("cluster",), client=Refusing())
    assert err.value.exit_code == 7 and "HTTP 403 Forbidden" in err.value.message


# ---------------------------------------------------------------- node layer x cluster layer: counts and GFD labels

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi" / "corpus"


def _gfd_node(name, capacity, labels=None):
    return V1Node(metadata=V1ObjectMeta(name=name, labels=labels or {}), spec=V1NodeSpec(),
                  status=V1NodeStatus(capacity=capacity, allocatable=capacity))


def test_gpu_count_and_gfd_labels_against_real_nvidia_smi_documents():
    from installer.validate.cluster import count_checks
    from installer.validate.nvsmi import parse_xml

    a10g = parse_xml((CORPUS / "a10g-v11.xml").read_text())  # one NVIDIA A10G
    mig = parse_xml((CORPUS / "a100-sxm4-40gb-mig-v11.xml").read_text())  # MIG on: the MIG layer's
    n = len(a10g.gpus)
    good = _gfd_node("g1", {"nvidia.com/gpu": str(n)},
                     {"nvidia.com/gpu.count": str(n), "nvidia.com/gpu.product": "NVIDIA-A10G"})
    (ok,) = count_checks({"g1": good}, {"g1": a10g})
    assert ok.check == "cluster.gpu-count" and ok.status == "pass", ok
    short = _gfd_node("g1", {"nvidia.com/gpu": str(n + 1)}, {"nvidia.com/gpu.product": "Tesla-T4"})
    count, gfd = count_checks({"g1": short}, {"g1": a10g})
    assert count.status == "fail" and f"{n + 1} nvidia.com/gpu in capacity, nvidia-smi counts {n}" in count.message
    assert gfd.check == "cluster.gfd-labels" and gfd.status == "warn" and "nvidia.com/gpu.product=Tesla-T4" in \
        gfd.message
    # time-slicing: replicas x GPUs, renamed to nvidia.com/gpu.shared
    shared = _gfd_node("g1", {"nvidia.com/gpu.shared": str(4 * n)}, {"nvidia.com/gpu.product": "NVIDIA-A10G-SHARED"})
    (ts,) = count_checks({"g1": shared}, {"g1": a10g}, replicas=4, rename=True)
    assert ts.status == "pass" and "x 4 time-slicing replicas" in ts.message
    (mps,) = count_checks({"g1": shared}, {"g1": a10g}, replicas=4, rename=True, method="MPS replicas")
    assert mps.status == "pass" and "x 4 MPS replicas" in mps.message
    # sharing.mode gpumanager: 100 tencent.com/vcuda-core per GPU nvidia-smi counts
    vcuda = "tencent.com/vcuda-core"
    (gm,) = count_checks({"g1": _gfd_node("g1", {vcuda: str(100 * n)})}, {"g1": a10g}, 100, False,
                         "vcuda-core (gpu-manager)", resource=vcuda)
    assert gm.status == "pass" and f"{100 * n} {vcuda} = {n} GPU(s) x 100 vcuda-core" in gm.message, gm.message
    (short,) = count_checks({"g1": _gfd_node("g1", {vcuda: "50"})}, {"g1": a10g}, 100, False, "vcuda-core",
                            resource=vcuda)
    assert short.status == "fail" and f"50 {vcuda} in capacity, nvidia-smi counts {n} GPU(s)" in short.message
    assert count_checks({"m1": _gfd_node("m1", {"nvidia.com/mig-1g.5gb": "7"})}, {"m1": mig}) == []
    assert count_checks({}, {"gone": a10g}) == []
