"""The pure parts of the MIG rollout (installer/mig_rollout.py): what a node's step is and which pods it evicts.
The rollout itself runs against the lab's API server in tests/integration/test_mig_rollout.py."""

from __future__ import annotations

from kubernetes.client import (
    V1Container,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodSpec,
    V1ResourceRequirements,
)

from installer.mig_rollout import NodeStep, _daemon_or_mirror, uses_gpu


def test_action_and_mode_change():
    assert NodeStep("n", "all-1g.10gb", "all-1g.10gb", "success", False).action == "none"
    assert NodeStep("n", "all-1g.10gb", "all-1g.10gb", "failed", False).action == "relabel"
    assert NodeStep("n", "all-1g.10gb", "all-disabled", "success", False).mode_change == "yes"
    assert NodeStep("n", "all-disabled", "all-3g.40gb", "success", False).mode_change == "yes"
    assert NodeStep("n", "all-1g.10gb", "all-3g.40gb", "success", False).mode_change == "no"
    assert NodeStep("n", "all-1g.10gb", None, None, False).mode_change == "unknown"
    assert NodeStep("n", "all-disabled", None, None, False).mode_change == "no"
    refused = NodeStep("n", "all-1g.10gb", None, None, False, problem="Tesla T4 has no MIG")
    assert refused.action == "refused" and refused.as_dict()["problem"] == "Tesla T4 has no MIG"


def _pod(limits=None, requests=None, init=False, owner=None, mirror=False):
    c = V1Container(name="c", resources=V1ResourceRequirements(limits=limits, requests=requests))
    spec = V1PodSpec(containers=[V1Container(name="main")], init_containers=[c]) if init else V1PodSpec(containers=[c])
    meta = V1ObjectMeta(name="p", owner_references=[V1OwnerReference(api_version="apps/v1", kind=owner, name="o",
                                                                       uid="u")] if owner else None,
                        annotations={"kubernetes.io/config.mirror": "x"} if mirror else None)
    return V1Pod(metadata=meta, spec=spec)


def test_which_pods_use_gpus_and_which_a_drain_leaves():
    assert uses_gpu(_pod(limits={"nvidia.com/gpu": "1"}))
    assert uses_gpu(_pod(requests={"nvidia.com/mig-1g.10gb": "1"}))
    assert uses_gpu(_pod(limits={"nvidia.com/gpu": "1"}, init=True))
    assert not uses_gpu(_pod(limits={"cpu": "1"}))
    assert not uses_gpu(_pod())
    assert _daemon_or_mirror(_pod(owner="DaemonSet")) and _daemon_or_mirror(_pod(mirror=True))
    assert not _daemon_or_mirror(_pod(owner="ReplicaSet"))
