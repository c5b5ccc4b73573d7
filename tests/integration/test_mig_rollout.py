"""`gpu-install mig plan` / `mig apply` against the lab's real kube-apiserver (hollow GPU nodes, real scheduler and
controller-manager).

The GPU Operator's mig-manager is not on the lab, so a STAND-IN plays its label protocol here (MigManagerStandIn,
a thread of this test): when a node's `nvidia.com/mig.config` changes it sets `nvidia.com/mig.config.state=pending`,
then either `failed` (nodes told to fail) or the devices the layout yields -- patched into the Node's capacity as
the device plugin would advertise them under the mixed strategy -- and `success`. GFD's labels (product, count,
mig.capable) are set through the API as GFD would publish them for one A100-SXM4-80GB per node; everything is
restored afterwards. The pods are real pods on the hollow kubelets; evictions go through the real Eviction API with
a real PodDisruptionBudget.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
GPU_INSTALL = Path(sys.executable).parent / "gpu-install"
LABEL, STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
GFD = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "1", "nvidia.com/mig.capable": "true"}
NODES = ("node1", "node2")
NS = "mig-rollout-test"


class MigManagerStandIn:
    """STAND-IN for mig-manager's label protocol (see the module doc)."""

    def __init__(self, api, fail: set[str]):
        self.api, self.fail = api, fail
        self.seen = {n: (api.read_node(n).metadata.labels or {}).get(LABEL) for n in NODES}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.wait(0.2):
            for n in NODES:
                want = (self.api.read_node(n).metadata.labels or {}).get(LABEL)
                if want == self.seen[n]:
                    continue
                self.seen[n] = want
                self.api.patch_node(n, {"metadata": {"labels": {STATE: "pending"}}})
                time.sleep(0.5)
                if n in self.fail:
                    self.api.patch_node(n, {"metadata": {"labels": {STATE: "failed"}}})
                    continue
                res = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"} if want == "all-1g.10gb" else \
                    {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "0"}
                self.api.patch_node_status(n, {"status": {"capacity": res, "allocatable": res}})
                self.api.patch_node(n, {"metadata": {"labels": {STATE: "success"}}})

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)


def _has_token(api) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        return bool(api.read_namespaced_service_account("default", NS).secrets)
    except ApiException:
        return False


@pytest.fixture(scope="module")
def k(lab_kubernetes, tmp_path_factory):
    from kubernetes import client, config

    kubeconfig = lab_kubernetes.status["kubernetes"]["kubeconfig"]
    api_client = config.new_client_from_config(config_file=kubeconfig)
    api = client.CoreV1Api(api_client)
    saved = {n: api.read_node(n) for n in NODES}
    for n in NODES:
        api.patch_node(n, {"metadata": {"labels": {**GFD, LABEL: "all-disabled", STATE: "success"}}})
        # room for this test's GPU pods whatever other modules of the session left on the shared lab's nodes
        api.patch_node_status(n, {"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}}})
    api.create_namespace({"metadata": {"name": NS}})
    # pods can be created once the controller-manager gave the namespace's default service account its token
    deadline = time.monotonic() + 60
    while not _has_token(api):
        assert time.monotonic() < deadline, f"no token for the default service account of {NS}"
        time.sleep(0.5)
    work = tmp_path_factory.mktemp("migroll")
    site = work / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                                    "mig": {"strategy": "mixed", "config": "all-1g.10gb"},
                                    "driver": {"customImageOs": LAB_DRIVER_OS}}))
    try:
        yield {"api": api, "kubeconfig": kubeconfig, "site": site, "work": work, "lab": lab_kubernetes}
    finally:
        api.delete_namespace(NS)
        for n, node in saved.items():
            labels = node.metadata.labels or {}
            now = api.read_node(n).metadata.labels or {}
            api.patch_node(n, {"metadata": {"labels": {**{key: None for key in now if key not in labels}, **labels}},
                               "spec": {"unschedulable": node.spec.unschedulable or None}})
            cap = {key: v for key, v in (node.status.capacity or {}).items() if key.startswith("nvidia.com/")}
            gone = {key: None for key in (api.read_node(n).status.capacity or {}) if key.startswith("nvidia.com/")
                    and key not in cap}
            api.patch_node_status(n, {"status": {"capacity": {**gone, **cap}, "allocatable": {**gone, **cap}}})


def gi(k, command: str, *extra: str, inv: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPU_INSTALL), "mig", command, "-s", str(k["site"]), "-i", str(inv or k["inv"]),
                           "--kubeconfig", k["kubeconfig"], *extra], capture_output=True, text=True, timeout=300)


def gpu_pod(k, name: str, node: str, labels: dict[str, str]) -> None:
    k["api"].create_namespaced_pod(NS, {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "c", "image": "registry.lab:5000/gpu-install-lab/pause:3.6",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    deadline = time.monotonic() + 120
    while k["api"].read_namespaced_pod(name, NS).status.phase != "Running":
        if time.monotonic() > deadline:
            events = [(e.reason, e.message) for e in k["api"].list_namespaced_event(NS).items]
            raise AssertionError(f"{name}: {k['api'].read_namespaced_pod(name, NS).status}; events {events}")
        time.sleep(0.5)


def kubectl(k, *args: str, input: str | None = None) -> None:
    """The lab's kubectl (a policy/v1beta1 PodDisruptionBudget: what the 1.20 API server serves; the Python client
    only has policy/v1)."""
    from gpu_install_lab.kube import bin_dir

    proc = subprocess.run([str(bin_dir() / "kubectl"), "--kubeconfig", k["kubeconfig"], *args], input=input,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def node(k, n: str):
    return k["api"].read_node(n)


def test_plan_apply_with_a_pdb_then_a_failing_mig_manager(k):
    inv = k["work"] / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(k["lab"].inventory.read_text())
    # node2 stays all-disabled: only node1 changes
    (inv / "zz.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "node2": {"gpu_install_mig_config": "all-disabled"}}}}}}))
    k["inv"] = inv
    gpu_pod(k, "trainer", "node1", {"app": "trainer"})
    gpu_pod(k, "cpu-only-elsewhere", "node2", {"app": "other"})
    kubectl(k, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer", "namespace": NS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}}))

    # plan: read-only, names the pod a rollout would evict and the MIG mode change
    proc = gi(k, "plan", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    steps = {s["node"]: s for s in json.loads(proc.stdout)["nodes"]}
    assert steps["node1"]["action"] == "relabel" and steps["node1"]["migModeChange"] == "yes", steps
    assert steps["node1"]["evict"] == [f"{NS}/trainer"] and steps["node1"]["current"] == "all-disabled", steps
    assert steps["node2"]["action"] == "none" and steps["node2"]["evict"] == [], steps
    assert (node(k, "node1").metadata.labels or {})[LABEL] == "all-disabled" and not node(k, "node1").spec.unschedulable

    with MigManagerStandIn(k["api"], fail=set()):
        # 1. the PDB holds the pod: the drain stops, the node is given back unchanged
        t0 = time.monotonic()
        proc = gi(k, "apply", "--drain-timeout", "4")
        assert proc.returncode == 7, proc.stdout + proc.stderr
        assert f"{NS}/trainer" in proc.stderr and "disruption budget" in proc.stderr.lower(), proc.stderr
        assert "the node was uncordoned" in proc.stderr, proc.stderr
        assert time.monotonic() - t0 < 60
        n1 = node(k, "node1")
        assert not n1.spec.unschedulable and n1.metadata.labels[LABEL] == "all-disabled"
        assert k["api"].read_namespaced_pod("trainer", NS).status.phase == "Running"

        # 2. the PDB lifted: cordon, evict, label, mig-manager's success, 7 devices, uncordon
        kubectl(k, "delete", "poddisruptionbudget", "trainer", "-n", NS)
        proc = gi(k, "apply", "--drain-timeout", "60", "--state-timeout", "60")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        err = proc.stderr
        for line in ("node1: cordoned", f"node1: evicting {NS}/trainer", "node1: drained",
                     f"node1: {LABEL}=all-1g.10gb", f"node1: {STATE}=success",
                     "node1: 7 x nvidia.com/mig-1g.10gb (1 GPU(s) x 7)", "node1: uncordoned",
                     "node2: already all-disabled"):
            assert line in err, (line, err)
        assert err.index("node1: cordoned") < err.index("node1: drained") < err.index(f"node1: {LABEL}=") < \
            err.index("node1: uncordoned")
        assert "mig apply: 1 node(s) changed, 1 already at their layout" in proc.stdout
        n1 = node(k, "node1")
        assert not n1.spec.unschedulable and n1.metadata.labels[STATE] == "success"
        names = [p.metadata.name for p in k["api"].list_namespaced_pod(NS).items]
        assert "trainer" not in names and "cpu-only-elsewhere" in names, names
        # a second apply changes nothing
        again = gi(k, "apply")
        assert again.returncode == 0 and "0 node(s) changed, 2 already" in again.stdout, again.stdout + again.stderr

    # 3. mig-manager fails on node2: exit 7, node2 left cordoned and named so
    (inv / "zz.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "node2": {"gpu_install_mig_config": "all-1g.10gb"}}}}}}))
    with MigManagerStandIn(k["api"], fail={"node2"}):
        proc = gi(k, "apply", "--state-timeout", "60")
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert f"node2: mig-manager could not apply all-1g.10gb ({STATE}=failed); the node is left cordoned" in \
        proc.stderr, proc.stderr
    assert "nvidia-mig-manager pod's log" in proc.stderr
    assert node(k, "node2").spec.unschedulable is True
