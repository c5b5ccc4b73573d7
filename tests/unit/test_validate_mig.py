"""MIG layer checks (installer/validate/mig.py) on Node objects as the API server returns them.

Labels are those the GPU Operator's components set on a real node: mig-manager (`nvidia.com/mig.config.state`),
GFD (`nvidia.com/gpu.count`, `nvidia.com/gpu.product` with `-MIG-<profile>` under the single strategy) and the
device plugin's allocatable resources; the expected counts come from values/mig/models.yaml (mig-parted's profiles).
"""

from __future__ import annotations

from kubernetes.client import V1Node, V1NodeStatus, V1ObjectMeta

from installer.validate import mig
from installer.validate.mig import checks, node_checks, per_gpu

A100 = "NVIDIA-A100-SXM4-80GB"


def labels(config="all-1g.10gb", state="success", count="2", product=A100, **extra):
    out = {"nvidia.com/mig.config": config, "nvidia.com/mig.config.state": state, "nvidia.com/gpu.count": count,
           "nvidia.com/gpu.product": product, **extra}
    return {k: v for k, v in out.items() if v is not None}


def by(cs):
    return {c.check: c for c in cs}


def test_per_gpu_from_the_models_profiles():
    assert per_gpu("all-1g.10gb", "NVIDIA A100-SXM4-80GB") == ("1g.10gb", 7)
    assert per_gpu("all-3g.40gb", "NVIDIA A100-SXM4-80GB") == ("3g.40gb", 2)
    assert per_gpu("all-1g.10gb.me", "NVIDIA A100 SXM4 80GB") == ("1g.10gb.me", 1)
    assert per_gpu("all-1g.5gb", "NVIDIA A100-SXM4-40GB") == ("1g.5gb", 7)
    assert per_gpu("all-balanced", "NVIDIA A100-SXM4-80GB") is None
    assert per_gpu("all-1g.10gb", "Tesla T4") is None
    assert per_gpu("all-9g.99gb", "NVIDIA A100-SXM4-80GB") is None


def test_mixed_strategy_counts_exactly():
    ok = node_checks("n1", "all-1g.10gb", "mixed", labels(), {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/gpu": "0"})
    assert {c.check: c.status for c in ok} == {"mig.config-label": "pass", "mig.config-state": "pass",
                                               "mig.allocatable": "pass"}
    assert by(ok)["mig.allocatable"].message == "14 x nvidia.com/mig-1g.10gb (2 GPU(s) x 7)"
    short = by(node_checks("n1", "all-1g.10gb", "mixed", labels(),
                           {"nvidia.com/mig-1g.10gb": "13", "nvidia.com/mig-2g.20gb": "1"}))["mig.allocatable"]
    assert short.status == "fail" and "13 x nvidia.com/mig-1g.10gb allocatable" in short.message
    assert "yields 14; also 1 x 2g.20gb" in short.message


def test_single_strategy_uses_nvidia_com_gpu_and_the_product_suffix():
    single = labels(product=A100 + "-MIG-1g.10gb")
    ok = by(node_checks("n1", "all-1g.10gb", "single", single, {"nvidia.com/gpu": "14"}))["mig.allocatable"]
    assert ok.status == "pass" and "14 x nvidia.com/gpu" in ok.message
    wrong = by(node_checks("n1", "all-1g.10gb", "single", labels(), {"nvidia.com/gpu": "2"}))["mig.allocatable"]
    assert wrong.status == "fail" and "yields 14 x 1g.10gb" in wrong.message
    mixed_here = by(node_checks("n1", "all-1g.10gb", "single", single, {"nvidia.com/mig-1g.10gb": "14"}))
    assert mixed_here["mig.allocatable"].status == "fail" and "another strategy" in mixed_here["mig.allocatable"].fix


def test_state_and_label_findings_name_the_fix():
    pending = by(node_checks("n1", "all-1g.10gb", "mixed", labels(state="pending"), {}))
    assert pending["mig.config-state"].status == "fail" and "still applying" in pending["mig.config-state"].message
    failed = by(node_checks("n1", "all-1g.10gb", "mixed", labels(state="failed"), {}))["mig.config-state"]
    assert "could not apply" in failed.message and "nvidia-mig-manager pod's log" in failed.fix
    missing = by(node_checks("n1", "all-1g.10gb", "mixed", labels(state=None, config=None), {}))
    assert "no nvidia.com/mig.config label" in missing["mig.config-label"].message
    assert "gpu-install mig label" in missing["mig.config-label"].fix
    assert "has not processed" in missing["mig.config-state"].message
    other = by(node_checks("n1", "all-1g.10gb", "mixed", labels(config="all-disabled"), {}))["mig.config-label"]
    assert other.status == "fail" and "'all-disabled', the site gives all-1g.10gb" in other.message


def test_all_disabled_wants_whole_gpus_and_no_mig_devices():
    d = labels(config="all-disabled")
    assert by(node_checks("n1", "all-disabled", "mixed", d, {"nvidia.com/gpu": "2"}))["mig.allocatable"].status == "pass"
    bad = by(node_checks("n1", "all-disabled", "mixed", d, {"nvidia.com/mig-1g.10gb": "7"}))["mig.allocatable"]
    assert bad.status == "fail" and "7 x 1g.10gb" in bad.message


def test_without_gfd_labels_presence_only_and_layouts_not_counted():
    bare = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
    c = by(node_checks("n1", "all-1g.10gb", "mixed", bare, {"nvidia.com/mig-1g.10gb": "3"}))["mig.allocatable"]
    assert c.status == "pass" and "count is not checked" in c.message
    none = by(node_checks("n1", "all-balanced", "mixed", labels(config="all-balanced"), {}))["mig.allocatable"]
    assert none.status == "fail" and "no nvidia.com/mig-*" in none.message


def test_checks_over_nodes_and_no_layout():
    node = V1Node(metadata=V1ObjectMeta(name="n1", labels=labels()),
                  status=V1NodeStatus(allocatable={"nvidia.com/mig-1g.10gb": "14"}))
    out = checks([("n1", "all-1g.10gb"), ("gone", "all-1g.10gb")], "mixed", {"n1": node})
    assert [(c.node, c.check, c.status) for c in out] == [
        ("n1", "mig.config-label", "pass"), ("n1", "mig.config-state", "pass"), ("n1", "mig.allocatable", "pass"),
        ("gone", "mig.config-label", "skip")]
    (skip,) = checks([], "single", {})
    assert skip.status == "skip" and skip.node == "(cluster)"


def test_nos_nodes_need_their_label_and_mig_mode_on_every_gpu():
    from types import SimpleNamespace

    from installer.features.nos import checks as nos_checks

    def node(name, **lab):
        return V1Node(metadata=V1ObjectMeta(name=name, labels=lab), status=V1NodeStatus(allocatable={}))

    objs = {"n1": node("n1", **{"nos.nebuly.com/gpu-partitioning": "mig"}), "n2": node("n2")}
    smi = {"n1": SimpleNamespace(gpus=(SimpleNamespace(mig_current=True), SimpleNamespace(mig_current=True))),
           "n2": SimpleNamespace(gpus=(SimpleNamespace(mig_current=True), SimpleNamespace(mig_current=False)))}
    got = {(c.node, c.check): (c.status, c.message) for c in nos_checks(["n1", "n2", "n3"], objs, smi)}
    assert got[("n1", "mig.nos-label")] == ("pass", "nos.nebuly.com/gpu-partitioning=mig")
    assert got[("n1", "mig.mode")] == ("pass", "MIG mode on for 2 GPU(s)")
    assert got[("n2", "mig.nos-label")] == ("fail", "no nos.nebuly.com/gpu-partitioning label")
    assert got[("n2", "mig.mode")] == ("fail", "MIG mode off on GPU 1")
    assert got[("n3", "mig.nos-label")][0] == "skip" and ("n3", "mig.mode") not in got


def test_wait_states_waits_for_mig_managers_verdict_then_returns_the_nodes_as_last_listed():
    """apply's validate stage right after its mig stage labelled the nodes: no state yet, then pending, then a verdict
    (success on n1, failed on n2) ends the wait; a node the cluster lacks is not waited for; the progress says so."""
    from types import SimpleNamespace

    states = iter([{}, {"n1": "pending"}, {"n1": "success", "n2": "pending"}, {"n1": "success", "n2": "failed"}])
    calls = []

    def list_nodes():
        now = next(states)
        calls.append(now)
        return [SimpleNamespace(metadata=SimpleNamespace(name=n, labels={mig.STATE: now[n]} if n in now else {}))
                for n in ("n1", "n2")]

    said: list[str] = []
    objs = mig.wait_states(list_nodes, ["n1", "n2", "gone"], 60, said.append, interval=0)
    assert len(calls) == 4 and {n: o.metadata.labels[mig.STATE] for n, o in objs.items()} == {"n1": "success",
                                                                                             "n2": "failed"}
    assert said[0].startswith("mig: waiting up to 60s") and "n1 (no state yet)" in said[0] and "gone" not in said[0]
    assert said[-1] == "mig: mig-manager's verdict on every node"


def test_wait_states_gives_up_at_its_deadline_and_the_check_then_fails():
    from types import SimpleNamespace

    node = SimpleNamespace(metadata=SimpleNamespace(name="n1", labels={mig.LABEL: "all-disabled"}))
    said: list[str] = []
    objs = mig.wait_states(lambda: [node], ["n1"], 0, said.append, interval=0)
    assert objs == {"n1": node} and said == []  # past the deadline at once: no wait, nothing said
    found = {c.check: c for c in mig.node_checks("n1", "all-disabled", "single", node.metadata.labels, {})}
    assert found["mig.config-state"].status == "fail"
