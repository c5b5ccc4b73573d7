"""installer/upgrade/nodes.py: per GPU node the action, the pods evicted and the blockers with their fixes, and the
batches -- from Kubernetes objects as the API server returns them (JSON: camelCase, ownerReferences, status), the
shapes `kubectl get -o json` prints."""

from __future__ import annotations

import pytest

from installer.config import load_site
from installer.errors import ConfigError
from installer.upgrade.cluster import SKIP_LABEL, STATE_LABEL, NodeState
from installer.upgrade.model import Change, ReleaseReport
from installer.upgrade.nodes import (
    batches,
    foreign_resources,
    max_unavailable_arg,
    node_action,
    plan_node,
    plan_nodes,
    selects,
    unavailable_budget,
)

OP_NS = "gpu-operator"


def pod(name: str, ns: str = "default", *, resources: dict | None = None, owner: str | None = "ReplicaSet",
        runtime_class: str | None = None, labels: dict | None = None, phase: str = "Running",
        mirror: bool = False, init: bool = False) -> dict:
    """A pod as GET /api/v1/pods returns it."""
    container = {"name": "main", "image": "registry.lab:5000/cuda:12.2", "resources": {}}
    if resources:
        container["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    meta: dict = {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": "101",
                  "creationTimestamp": "2026-11-26T10:00:00Z", "labels": labels or {"app": name}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner",
                                    "uid": f"owner-{name}", "controller": True, "blockOwnerDeletion": True}]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "0123abcd", "kubernetes.io/config.source": "file"}
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "gpu-a", "uid": "node-uid",
                                    "controller": True}]
    spec: dict = {"nodeName": "gpu-a", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                  "containers" if not init else "initContainers": [container]}
    if init:
        spec["containers"] = [{"name": "side", "image": "busybox", "resources": {}}]
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}}


def pdb(name: str, ns: str, selector: dict | None, allowed: int, version: str = "v1") -> dict:
    """A PodDisruptionBudget as GET /apis/policy/v1/poddisruptionbudgets returns it."""
    return {"apiVersion": f"policy/{version}", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "7", "generation": 1},
            "spec": {"minAvailable": 1, **({"selector": selector} if selector is not None else {})},
            "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": 1,
                       "desiredHealthy": 1, "expectedPods": 1}}


def node(name: str = "gpu-a", *, pods: tuple = (), ready: bool = True, cordoned: bool = False,
         labels: dict | None = None, present: bool = True) -> NodeState:
    return NodeState(name, name, present, ready, cordoned, labels or {}, tuple(pods))


GPU = {"nvidia.com/gpu": "1"}


def plan(state: NodeState, action="driver-reload", pdbs=(), site=None):
    return plan_node(state, action, list(pdbs), OP_NS, foreign_resources(site))


def whats(np) -> list[str]:
    return [b.what for b in np.blockers]


# ---------------------------------------------------------------- evictions


def test_driver_reload_evicts_the_gpu_pods_only_and_leaves_daemonsets_operands_and_finished_pods():
    pods = [pod("train", resources=GPU), pod("mig-job", resources={"nvidia.com/mig-1g.5gb": "1"}, owner="Job"),
            pod("init-gpu", resources=GPU, init=True), pod("web"),
            pod("done", resources=GPU, phase="Succeeded"),
            pod("nvidia-device-plugin-daemonset-x", OP_NS, owner="DaemonSet", runtime_class="nvidia"),
            pod("nvidia-driver-daemonset-x", OP_NS, owner="DaemonSet"),
            pod("kube-proxy-x", "kube-system", owner="DaemonSet")]
    np = plan(node(pods=pods))
    assert np.action == "driver-reload"
    assert np.evicts == ("default/train", "default/mig-job", "default/init-gpu")
    assert np.blockers == ()


def test_host_reboot_drains_every_pod_but_daemonset_and_mirror_pods():
    pods = [pod("train", resources=GPU), pod("web"), pod("rc-only", runtime_class="nvidia"),
            pod("ds-gpu", owner="DaemonSet", resources=GPU), pod("etcd-x", "kube-system", owner=None, mirror=True)]
    np = plan(node(pods=pods), action="host-reboot")
    assert np.evicts == ("default/train", "default/web", "default/rc-only")
    assert np.blockers == ()  # the reboot stops what the drain leaves


def test_operand_restart_evicts_nothing_and_a_cordoned_node_does_not_block_it():
    np = plan(node(pods=[pod("train", resources=GPU)], cordoned=True, ready=False), action="operand-restart")
    assert np.evicts == () and np.blockers == () and np.cordoned and not np.ready


# ---------------------------------------------------------------- blockers, one per class


def test_a_pod_using_the_gpu_only_through_the_nvidia_runtime_class_blocks():
    np = plan(node(pods=[pod("rc-only", "team", runtime_class="nvidia"), pod("other", runtime_class="kata")]))
    assert np.evicts == ()
    [b] = np.blockers
    assert b.where == "gpu-a" and "team/rc-only" in b.what and "runtimeClassName: nvidia" in b.what
    assert "nvidia.com/gpu request" in b.fix


def test_a_daemonset_or_static_pod_asking_for_gpus_blocks():
    np = plan(node(pods=[pod("dcgm-custom", "mon", owner="DaemonSet", resources=GPU),
                         pod("static-gpu", "kube-system", owner=None, mirror=True, resources=GPU)]))
    assert np.evicts == ()
    assert len(np.blockers) == 2
    assert "mon/dcgm-custom (a DaemonSet pod)" in np.blockers[0].what and "DaemonSet" in np.blockers[0].fix
    assert "kube-system/static-gpu (a static pod)" in np.blockers[1].what and "manifest" in np.blockers[1].fix


@pytest.mark.parametrize(("resource", "who"), [("tencent.com/vcuda-core", "gpu-manager"),
                                               ("tencent.com/vcuda-memory", "gpu-manager"),
                                               ("nvidia.com/gpumem", "HAMi"), ("nvidia.com/gpucores", "HAMi")])
def test_other_gpu_resource_names_block(resource, who):
    np = plan(node(pods=[pod("shared", "team", resources={resource: "10"})]))
    [b] = np.blockers
    assert f"team/shared uses the GPU through {resource} ({who}" in b.what
    assert "stop it" in b.fix


def test_the_active_sharing_feature_is_named(write_site, site_data):
    site_data["sharing"] = {"mode": "gpumanager"}
    site = load_site(write_site(site_data))
    np = plan(node(pods=[pod("shared", "team", resources={"tencent.com/vcuda-core": "50"})]), site=site)
    assert "gpu-manager (this site's sharing.mode)" in np.blockers[0].what


def test_a_hami_pod_asking_for_nvidia_gpu_is_evicted_not_blocking():
    np = plan(node(pods=[pod("hami", resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"})]))
    assert np.evicts == ("default/hami",) and np.blockers == ()


def test_a_pdb_allowing_no_disruption_of_an_evicted_pod_blocks():
    pods = [pod("train-0", "ml", resources=GPU, labels={"app": "train", "tier": "gpu"})]
    budgets = [pdb("train", "ml", {"matchLabels": {"app": "train"}}, 0),
               pdb("other-ns", "default", {"matchLabels": {"app": "train"}}, 0),  # another namespace
               pdb("room", "ml", {"matchLabels": {"app": "train"}}, 1),  # allows one
               pdb("nomatch", "ml", {"matchLabels": {"app": "web"}}, 0),
               pdb("v1beta1-null", "ml", None, 0, "v1beta1")]  # no selector selects nothing
    np = plan(node(pods=pods), pdbs=budgets)
    assert np.evicts == ("ml/train-0",)
    [b] = np.blockers
    assert "PodDisruptionBudget ml/train allows no disruption now and selects ml/train-0" in b.what
    assert "scale that workload up" in b.fix


def test_a_pdb_on_a_pod_that_is_not_evicted_does_not_block():
    np = plan(node(pods=[pod("web", "ml", labels={"app": "train"})]),
              pdbs=[pdb("train", "ml", {"matchLabels": {"app": "train"}}, 0)])
    assert np.blockers == ()


def test_label_selectors_match_as_kubernetes_does():
    labels = {"app": "train", "tier": "gpu"}
    assert selects({}, labels)  # policy/v1: empty selects every pod of the namespace
    assert not selects(None, labels)
    assert selects({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}, labels)
    assert not selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, labels)
    assert selects({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}, labels)
    assert not selects({"matchLabels": {"app": "train"}, "matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}, labels)


def test_a_precordoned_node_blocks_and_stays_reported_as_cordoned():
    np = plan(node(cordoned=True, pods=[pod("train", resources=GPU)]))
    assert np.cordoned
    [b] = np.blockers
    assert "cordoned before the upgrade" in b.what and "counts against --max-unavailable" in b.what
    assert "kubectl uncordon gpu-a" in b.fix


def test_a_notready_node_blocks():
    np = plan(node(ready=False))
    assert whats(np) == ["the node is NotReady"] and "--limit" in np.blockers[0].fix


def test_the_skip_label_blocks():
    np = plan(node(labels={SKIP_LABEL: "true"}))
    assert [SKIP_LABEL + "=true" in w for w in whats(np)] == [True]
    assert f"{SKIP_LABEL}-" in np.blockers[0].fix


@pytest.mark.parametrize(("state", "said"), [("upgrade-required", "still waiting"), ("upgrade-failed", "failed"),
                                             ("drain-required", "in progress")])
def test_a_node_in_an_upgrade_controller_state_blocks_whatever_the_action(state, said):
    for action in ("none", "driver-reload"):
        np = plan(node(labels={STATE_LABEL: state}), action=action)
        assert np.upgrade_state == state
        assert [said in w and state in w for w in whats(np)] == [True]
    assert plan(node(labels={STATE_LABEL: "upgrade-done"})).blockers == ()


def test_a_node_the_cluster_does_not_have_blocks_with_the_inventory_host_named():
    np = plan_node(NodeState("host-7", "gpu-7", False), "none", [], OP_NS, ())
    assert not np.present
    assert "inventory host host-7: the cluster has no node gpu-7" in np.blockers[0].what
    assert "gpu_install_node_name" in np.blockers[0].fix


def test_untrusted_objects_with_missing_or_mistyped_fields_do_not_crash():
    junk = [{}, {"metadata": None, "spec": "x"}, {"metadata": {"name": "a", "namespace": "n", "labels": ["x"],
                                                            "ownerReferences": "DaemonSet"},
                                                "spec": {"containers": [None, {"resources": {"limits": ["gpu"]}}],
                                                         "runtimeClassName": 5}, "status": []}]
    bad_pdbs = [{}, {"metadata": {"namespace": "n"}, "spec": {"selector": {"matchExpressions": [None, {"key": 1}]}},
                     "status": {"disruptionsAllowed": "0"}}]
    np = plan(node(pods=junk), pdbs=bad_pdbs)
    assert np.evicts == () and np.blockers == ()


# ---------------------------------------------------------------- the action


def report(driver=False, toolkit=False, changes=()) -> ReleaseReport:
    return ReleaseReport(None, "v23.9.2", tuple(changes), (), (), (), (), driver, toolkit)


@pytest.mark.parametrize(("mode", "reboot", "driver", "toolkit", "changes", "want"), [
    ("operator", "never", True, False, (), "driver-reload"),
    ("precompiled", "never", True, True, (), "driver-reload"),
    ("host", "never", True, False, (), "driver-reload"),
    ("runfile", "always", True, False, (), "host-reboot"),
    ("host", "if-needed", True, False, (), "host-reboot"),
    ("preinstalled", "never", True, False, (), "none"),
    ("operator", "never", False, True, (), "operand-restart"),
    ("operator", "never", False, False, (Change("devicePlugin", "a:1", "a:2"),), "operand-restart"),
    ("operator", "never", False, False, (Change("chart", "gpu-operator-v23.9.2", "gpu-operator-v23.9.2"),), "none"),
])
def test_the_action_follows_the_release_changes_and_the_driver_mode(write_site, site_data, mode, reboot, driver,
                                                                    toolkit, changes, want):
    site_data["driver"] = {"mode": mode, "rebootPolicy": reboot, **(
        {"runfile": "NVIDIA-Linux-x86_64-535.216.03.run", "version": "535.216.03"} if mode == "runfile" else {})}
    path = write_site(site_data)
    if mode == "runfile":
        (path.parent / "NVIDIA-Linux-x86_64-535.216.03.run").write_text("x")
    assert node_action(report(driver, toolkit, changes), load_site(path)) == want


# ---------------------------------------------------------------- batches


def ready_plans(names, action="driver-reload", **kw):
    return plan_nodes([node(n, **kw) for n in names], action, [], OP_NS)


def test_the_canary_goes_alone_then_batches_of_max_parallel():
    nps = ready_plans([f"n{i}" for i in range(8)])
    bts, blockers = batches(nps, max_parallel=3, max_unavailable="50%")
    assert blockers == ()
    assert [(b.index, b.nodes, b.canary) for b in bts] == [
        (1, ("n0",), True), (2, ("n1", "n2", "n3"), False), (3, ("n4", "n5", "n6"), False), (4, ("n7",), False)]


def test_max_unavailable_bounds_the_batches_below_max_parallel():
    nps = ready_plans([f"n{i}" for i in range(10)])
    bts, _ = batches(nps, max_parallel=5, max_unavailable="25%")  # ceil(2.5) = 3
    assert [len(b.nodes) for b in bts] == [1, 3, 3, 3]
    bts, _ = batches(nps, max_parallel=5, max_unavailable=2)
    assert [len(b.nodes) for b in bts] == [1, 2, 2, 2, 2, 1]


def test_nodes_already_unavailable_count_against_max_unavailable_and_blocked_nodes_are_left_out():
    nps = [*ready_plans(["a", "b", "c", "d", "e", "f"]), *plan_nodes(
        [node("down", ready=False), node("held", cordoned=True)], "driver-reload", [], OP_NS)]
    bts, blockers = batches(nps, max_parallel=4, max_unavailable=4)  # 4 - 2 already unavailable = 2 at a time
    assert blockers == ()
    assert [b.nodes for b in bts] == [("a",), ("b", "c"), ("d", "e"), ("f",)]


def test_no_room_left_is_a_cluster_blocker_naming_the_unavailable_nodes():
    nps = [*ready_plans(["a", "b", "c"]), *plan_nodes([node("held", cordoned=True)], "driver-reload", [], OP_NS)]
    bts, blockers = batches(nps, max_parallel=1, max_unavailable="25%")  # ceil(1.0) = 1, 1 already cordoned
    assert bts == ()
    [b] = blockers
    assert b.where == "(cluster)" and "allows 1 unavailable at once, and 1 already are (held)" in b.what
    assert "raise --max-unavailable" in b.fix


def test_no_batches_without_driver_changes():
    assert batches(ready_plans(["a", "b"], action="operand-restart")) == ((), ())
    assert batches(ready_plans(["a"], action="none")) == ((), ())


def test_max_unavailable_and_parallel_arguments():
    assert max_unavailable_arg("25%") == "25%" and max_unavailable_arg("3") == 3
    for bad in ("0", "0%", "101%", "-1", "x", "2.5", ""):
        with pytest.raises(ConfigError, match="neither a node count nor a percentage"):
            max_unavailable_arg(bad)
    assert unavailable_budget("25%", 3) == 1 and unavailable_budget("34%", 3) == 2 and unavailable_budget(5, 3) == 5
    with pytest.raises(ConfigError, match="--max-parallel 0"):
        batches(ready_plans(["a"]), max_parallel=0)

