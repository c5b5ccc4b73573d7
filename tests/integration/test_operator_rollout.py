"""installer.upgrade.operator_rollout (`upgrade apply` with driver.mode operator) against the lab's real
kube-apiserver: hold_all, release_batch batch by batch, lift_all, and the failures.

The GPU Operator's driver upgrade controller is not on the lab, so a STAND-IN plays its label protocol here
(UpgradeControllerStandIn, a thread of this test), as NVIDIA's k8s-operator-libs does it: `publish()` is a new
driver DaemonSet revision (what `helm upgrade` makes the operator write): every node goes to upgrade-required; a node
in upgrade-required WITHOUT `nvidia.com/gpu-driver-upgrade.skip=true` is walked through cordon-required (the node
cordoned) ... uncordon-required (uncordoned) to upgrade-done; a node with the skip label is left in
upgrade-required. Per-node modes: `fail` ends in upgrade-failed with a Warning event on the Node, `flap` goes on
from upgrade-failed to upgrade-done (NVIDIA/gpu-operator#2549), `stuck` stops in drain-required. A driver pod
(label app=nvidia-driver-daemonset) is bound to each node; the lab's hollow kubelets serve no logs, so the failure
detail says why the log is not available.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]

NODES = ("node1", "node2")
NS = "operator-rollout-test"
STATE, SKIP, HOLD = ("nvidia.com/gpu-driver-upgrade-state", "nvidia.com/gpu-driver-upgrade.skip",
                     "gpu-install.io/upgrade-hold")
WALK = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
        "pod-restart-required", "validation-required", "uncordon-required", "upgrade-done")
EVENTS: list[str] = []  # the stand-in's events in namespace default, deleted at the end
FAIL_MESSAGE = "Failed to restart driver pod: Could not unload NVIDIA driver kernel modules, password=hunter2"


class UpgradeControllerStandIn:
    """STAND-IN for the operator's driver upgrade controller's label protocol (see the module doc)."""

    def __init__(self, api, modes: dict[str, str] | None = None):
        self.api, self.modes = api, modes or {}
        self.steps: dict[str, list[str]] = {}  # per node: what is left to walk
        self.started: list[str] = []  # nodes whose upgrade it started, in order
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.error: BaseException | None = None

    def publish(self) -> None:
        for n in NODES:
            self.api.patch_node(n, {"metadata": {"labels": {STATE: "upgrade-required"}}})

    def walk(self, node: str) -> list[str]:
        mode = self.modes.get(node, "ok")
        if mode == "fail":
            return [*WALK[:5], "!upgrade-failed"]
        if mode == "flap":
            return [*WALK[:5], "!upgrade-failed", "uncordon-required", "upgrade-done"]
        if mode == "stuck":
            return list(WALK[:4])
        return list(WALK)

    def step(self, node: str) -> None:
        labels = self.api.read_node(node).metadata.labels or {}
        if node not in self.steps:
            if labels.get(STATE) != "upgrade-required" or labels.get(SKIP) == "true":
                return
            self.steps[node] = self.walk(node)
            self.started.append(node)
        if not self.steps[node]:
            del self.steps[node]
            return
        state = self.steps[node].pop(0)
        if state.startswith("!"):
            state = state[1:]
            made = self.api.create_namespaced_event("default", {  # a cluster-scoped object's events: "default"
                "metadata": {"generateName": f"{node}.gpu-driver-upgrade."},
                "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
                "reason": "GPUDriverUpgrade", "type": "Warning", "message": FAIL_MESSAGE,
                "source": {"component": "upgrade-controller-stand-in"}})
            EVENTS.append(made.metadata.name)
        spec = {"unschedulable": True} if state == "cordon-required" else \
            {"unschedulable": None} if state == "upgrade-done" else None
        self.api.patch_node(node, {"metadata": {"labels": {STATE: state}}, **({"spec": spec} if spec else {})})

    def loop(self) -> None:
        try:
            while not self.stop.wait(0.05):
                for n in NODES:
                    self.step(n)
        except BaseException as exc:  # noqa: BLE001 - surfaced by __exit__
            self.error = exc

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)
        if self.error is not None and exc[0] is None:
            raise self.error


@pytest.fixture(scope="module")
def k(lab_kubernetes):
    from kubernetes import client, config

    from installer import kube

    kubeconfig = lab_kubernetes.status["kubernetes"]["kubeconfig"]
    api_client = kube.api_client(Path(kubeconfig))
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    saved = {n: api.read_node(n) for n in NODES}
    api.create_namespace({"metadata": {"name": NS}})
    for n in NODES:  # the driver pod the failure detail names (bound directly: no scheduler, no service account)
        api.create_namespaced_pod(NS, {
            "metadata": {"name": f"nvidia-driver-daemonset-{n}", "labels": {"app": "nvidia-driver-daemonset"}},
            "spec": {"nodeName": n, "automountServiceAccountToken": False, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "nvidia-driver-ctr",
                                     "image": "registry.lab:5000/gpu-install-lab/pause:3.6"}]}})
    try:
        yield {"client": api_client, "api": api}
    finally:
        api.delete_namespace(NS)
        for name in EVENTS:
            api.delete_namespaced_event(name, "default")
        for n, node in saved.items():  # the three keys this module changes, as they were
            before = {**(node.metadata.labels or {}), **(node.metadata.annotations or {})}
            restore = {key: before.get(key) for key in (STATE, SKIP, HOLD)}
            api.patch_node(n, {"metadata": {"labels": {STATE: restore[STATE], SKIP: restore[SKIP]},
                                            "annotations": {HOLD: restore[HOLD]}}})
            api.patch_node(n, {"spec": {"unschedulable": node.spec.unschedulable or None}})


def labels(k, n: str) -> dict[str, str]:
    return k["api"].read_node(n).metadata.labels or {}


def annotations(k, n: str) -> dict[str, str]:
    return k["api"].read_node(n).metadata.annotations or {}


def test_hold_release_batch_by_batch_then_lift(k):
    from installer.errors import EXIT_PREFLIGHT, PreflightError
    from installer.upgrade import operator_rollout as r

    api = k["api"]
    # an admin's skip label on node2: refused before any node is labelled
    api.patch_node("node2", {"metadata": {"labels": {SKIP: "true"}}})
    with pytest.raises(PreflightError) as refused:
        r.hold_all(k["client"], list(NODES))
    assert refused.value.exit_code == EXIT_PREFLIGHT and "node node2 carries" in refused.value.message
    assert SKIP not in labels(k, "node1") and HOLD not in annotations(k, "node1")
    with pytest.raises(PreflightError, match="set outside gpu-install; nothing was lifted"):
        r.release_batch(k["client"], ["node2"], timeout=10, progress=lambda n, s: None)
    assert labels(k, "node2")[SKIP] == "true"
    api.patch_node("node2", {"metadata": {"labels": {SKIP: None}}})

    r.hold_all(k["client"], list(NODES))
    r.hold_all(k["client"], list(NODES))  # again (a --resume): nothing changes
    for n in NODES:
        assert labels(k, n)[SKIP] == "true" and annotations(k, n)[HOLD] == "true"

    seen: list[tuple[str, str]] = []
    with UpgradeControllerStandIn(api) as controller:
        controller.publish()  # the new driver DaemonSet revision: every node needs the upgrade, none may start
        t0 = time.monotonic()
        r.release_batch(k["client"], ["node1"], timeout=60, progress=lambda n, s: seen.append((n, s)))
        first = time.monotonic() - t0
        assert [s for n, s in seen if n == "node1"] == ["upgrade-required", *WALK], seen
        assert controller.started == ["node1"]  # node2 was held all along
        n2 = labels(k, "node2")
        assert n2[STATE] == "upgrade-required" and n2[SKIP] == "true" and not api.read_node("node2").spec.unschedulable
        n1 = api.read_node("node1")
        assert SKIP not in (n1.metadata.labels or {}) and HOLD not in (n1.metadata.annotations or {})
        assert n1.metadata.labels[STATE] == "upgrade-done" and not n1.spec.unschedulable

        seen.clear()
        r.release_batch(k["client"], ["node2"], timeout=60, progress=lambda n, s: seen.append((n, s)))
        assert [s for n, s in seen if n == "node2"] == ["upgrade-required", *WALK], seen
        assert controller.started == ["node1", "node2"]
    print(f"release_batch of one node through the stand-in's 9 states: {first:.2f} s")

    # lift_all: our holds go, an admin's skip stays
    r.hold_all(k["client"], ["node2"])
    api.patch_node("node1", {"metadata": {"labels": {SKIP: "true"}}})
    r.lift_all(k["client"], list(NODES))
    assert SKIP not in labels(k, "node2") and HOLD not in annotations(k, "node2")
    assert labels(k, "node1")[SKIP] == "true" and HOLD not in annotations(k, "node1")
    api.patch_node("node1", {"metadata": {"labels": {SKIP: None}}})


@pytest.mark.parametrize("mode", ["fail", "flap"])
def test_upgrade_failed_stops_the_batch_with_events_and_the_driver_pod(k, mode):
    from installer.upgrade import operator_rollout as r

    api = k["api"]
    r.hold_all(k["client"], list(NODES))
    seen: list[tuple[str, str]] = []
    with UpgradeControllerStandIn(api, {"node1": mode}) as controller:
        controller.publish()
        with pytest.raises(r.BatchFailed) as failed:
            r.release_batch(k["client"], ["node1"], timeout=60, progress=lambda n, s: seen.append((n, s)))
        if mode == "flap":  # the controller moves on to upgrade-done: still a failure
            deadline = time.monotonic() + 10
            while labels(k, "node1")[STATE] != "upgrade-done":
                assert time.monotonic() < deadline, labels(k, "node1")
                controller.stop.wait(0.1)
    exc = failed.value
    assert exc.exit_code == 4 and exc.node == "node1" and not exc.timed_out
    assert ("node1", "upgrade-failed") in seen, seen
    assert "GPUDriverUpgrade: Failed to restart driver pod: Could not unload NVIDIA driver kernel modules" in exc.detail
    assert "hunter2" not in exc.message and "password=***" in exc.detail
    assert f"driver pod {NS}/nvidia-driver-daemonset-node1" in exc.detail, exc.detail
    assert f"log of {NS}/nvidia-driver-daemonset-node1" in exc.detail, exc.detail
    assert labels(k, "node2")[SKIP] == "true" and labels(k, "node2")[STATE] == "upgrade-required"  # untouched
    r.lift_all(k["client"], list(NODES))
    assert SKIP not in labels(k, "node2")


def test_a_node_that_does_not_finish_in_time(k):
    from installer.upgrade import operator_rollout as r

    r.hold_all(k["client"], ["node1"])
    with UpgradeControllerStandIn(k["api"], {"node1": "stuck"}) as controller:
        controller.publish()
        t0 = time.monotonic()
        with pytest.raises(r.BatchFailed) as late:
            r.release_batch(k["client"], ["node1"], timeout=4, progress=lambda n, s: None)
        assert time.monotonic() - t0 < 30
    assert late.value.timed_out and "still drain-required after 4 s" in late.value.detail, late.value.detail
    assert "did not finish the driver upgrade in time" in late.value.message
