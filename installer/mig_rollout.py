"""`gpu-install mig plan` / `mig apply`: change the MIG layout of GPU nodes in use, one batch at a time.

`mig label` only sets `nvidia.com/mig.config`; on a node whose GPUs run workloads that is abrupt: mig-manager stops the
GPU clients it knows, resets the GPUs and leaves the node's pods to fail. `mig apply` does what an admin does by hand,
per batch of nodes (`--batch`, default 1):

  cordon → evict the pods that use the node's GPUs (nvidia.com/gpu, nvidia.com/mig-*; `--drain-all`: every pod but
  DaemonSet and mirror pods) through the Eviction API, so PodDisruptionBudgets are respected (a refused eviction is
  retried until `--drain-timeout`) → label `nvidia.com/mig.config` (dropping mig-manager's previous
  `nvidia.com/mig.config.state` in the same patch, so a stale `success` is not read as the new one's) → wait for
  mig-manager's
  `nvidia.com/mig.config.state=success` (`--state-timeout`) → check the MIG devices the layout yields are allocatable
  (installer/validate/mig.py, by the site's strategy) → uncordon.

Failure handling: a drain that does not finish is stopped before anything changes on the node: the node is uncordoned
again (it was not relabelled) and the pods that could not be evicted are named. mig-manager reporting `failed`, its
state not reaching success in time, or the devices not showing up stop the rollout with the node LEFT CORDONED (its
GPUs are in an unknown layout) and say so; later batches are not started. Nodes already at their layout (label and
state success) are skipped; a node an admin had cordoned before stays cordoned.

`mig plan` is read-only: per node its current layout and state, the desired one, whether MIG mode changes (a GPU reset
by mig-manager; some platforms need a reboot for it), and the pods that `mig apply` would evict.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from installer import kube
from installer.errors import ClusterError, ConfigError
from installer.mig import DISABLED, LABEL, check_node

if TYPE_CHECKING:
    from installer.plan import Plan

STATE = "nvidia.com/mig.config.state"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
Progress = Callable[[str], None]


@dataclass
class NodeStep:
    node: str
    desired: str
    current: str | None  # nvidia.com/mig.config now
    state: str | None  # nvidia.com/mig.config.state now
    cordoned: bool  # spec.unschedulable before gpu-install touched it
    pods: list[str] = field(default_factory=list)  # namespace/name of the pods `apply` would evict
    problem: str | None = None  # why this config cannot go on this node (its GPU), from installer.mig.check_node

    @property
    def action(self) -> str:
        if self.problem:
            return "refused"
        if self.current == self.desired and self.state == "success":
            return "none"
        return "relabel"

    @property
    def mode_change(self) -> str:
        """Whether MIG mode flips (mig-manager resets the GPUs): yes | no | unknown (no label yet)."""
        if self.current is None:
            return "unknown" if self.desired != DISABLED else "no"
        return "yes" if (self.current == DISABLED) != (self.desired == DISABLED) else "no"

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "current": self.current, "state": self.state, "desired": self.desired,
                "action": self.action, "migModeChange": self.mode_change, "cordoned": self.cordoned,
                "evict": self.pods, "problem": self.problem}


def uses_gpu(pod: Any) -> bool:
    for c in [*(pod.spec.containers or []), *(pod.spec.init_containers or [])]:
        res = c.resources
        for part in (res.limits, res.requests) if res is not None else ():
            if any(k == GPU_RESOURCES[0] or k.startswith(GPU_RESOURCES[1]) for k in (part or {})):
                return True
    return False


def _daemon_or_mirror(pod: Any) -> bool:
    owners = pod.metadata.owner_references or []
    return any(o.kind == "DaemonSet" for o in owners) or "kubernetes.io/config.mirror" in (
        pod.metadata.annotations or {})


def pods_to_evict(core: Any, node: str, drain_all: bool = False) -> list[Any]:
    """The pods on node that a rollout evicts: those using its GPUs (every pod but DaemonSet and mirror pods with
    drain_all); finished pods hold nothing and are left."""
    pods = kube._call(f"list the pods on {node}", lambda: core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}").items)
    return [p for p in pods if p.status.phase not in ("Succeeded", "Failed") and not _daemon_or_mirror(p)
            and (drain_all or uses_gpu(p))]


def plan_rollout(plan: Plan, client: Any, drain_all: bool = False) -> list[NodeStep]:
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    if not plan.mig:
        raise ConfigError("no MIG layout configured", hint="set mig.config in the site file or gpu_install_mig_config "
                                                           "per host in the inventory")
    core = k.CoreV1Api(client)
    steps = []
    for a in plan.mig:
        try:
            node = kube._call(f"read node {a.node}", functools.partial(core.read_node, a.node))
        except ApiException as exc:
            if exc.status == 404:
                raise ConfigError(f"node {a.node} (inventory host {a.host}) is not in the cluster",
                                  hint="set gpu_install_node_name for hosts whose Kubernetes node name differs; "
                                       "nothing was changed") from None
            raise kube._api_error(f"read node {a.node}", exc) from None
        labels = dict(node.metadata.labels or {})
        step = NodeStep(a.node, a.config, labels.get(LABEL), labels.get(STATE), bool(node.spec.unschedulable),
                        problem=check_node(plan.site, plan.release, a, labels))
        if step.action == "relabel":
            step.pods = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods_to_evict(core, a.node, drain_all)]
        steps.append(step)
    return steps


class Rollout:
    def __init__(self, plan: Plan, client: Any, *, drain_timeout: float = 300, state_timeout: float = 900,
                 drain_all: bool = False, progress: Progress | None = None, poll: float = 1.0):
        from kubernetes import client as k

        self.plan, self.client = plan, client
        self.core = k.CoreV1Api(client)
        self.drain_timeout, self.state_timeout, self.drain_all, self.poll = drain_timeout, state_timeout, drain_all, poll
        self.say: Progress = progress or (lambda m: None)
        self._eviction_version: str | None = None

    # ------------------------------------------------------------ node operations

    def _cordon(self, node: str, on: bool) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            kube._call(f"{'cordon' if on else 'uncordon'} {node}",
                       lambda: self.core.patch_node(node, {"spec": {"unschedulable": True if on else None}}))
        except ApiException as exc:
            raise kube._api_error(f"{'cordon' if on else 'uncordon'} node {node}", exc) from None
        self.say(f"{node}: {'cordoned' if on else 'uncordoned'}")

    def _relabel(self, node: str, desired: str) -> None:
        """Set the layout and drop mig-manager's previous verdict in the same patch: until mig-manager notices the
        new layout the old `success` would otherwise read as the new one's."""
        from kubernetes.client.exceptions import ApiException

        try:
            kube._call(f"label node {node}", lambda: self.core.patch_node(
                node, {"metadata": {"labels": {LABEL: desired, STATE: None}}}))
        except ApiException as exc:
            raise kube._api_error(f"label node {node} {LABEL}={desired}", exc) from None
        self.say(f"{node}: {LABEL}={desired}")

    def _evict(self, pod: Any) -> str | None:
        """Ask the Eviction API to evict pod: None when accepted (or the pod is gone), else why not (a
        PodDisruptionBudget refuses: HTTP 429)."""
        from kubernetes.client.exceptions import ApiException

        if self._eviction_version is None:  # policy/v1 Eviction came with Kubernetes 1.22; older servers: v1beta1
            from packaging.version import Version

            v = Version(kube.server_version(self.client).lstrip("v").split("-")[0].split("+")[0])
            self._eviction_version = "policy/v1" if v >= Version("1.22") else "policy/v1beta1"
        body: Any = {"apiVersion": self._eviction_version, "kind": "Eviction",
                "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}}
        try:
            self.core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)
            return None
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 429:
                return kube._describe(exc)
            raise kube._api_error(f"evict pod {pod.metadata.namespace}/{pod.metadata.name}", exc) from None

    def drain(self, node: str) -> None:
        """Evict the node's pods (see pods_to_evict) and wait until they are gone; ClusterError naming the pods left
        after drain_timeout."""
        deadline = time.monotonic() + self.drain_timeout
        refused: dict[str, str] = {}
        while True:
            left = pods_to_evict(self.core, node, self.drain_all)
            if not left:
                self.say(f"{node}: drained")
                return
            for p in left:
                if p.metadata.deletion_timestamp is not None:
                    continue  # being deleted: wait for it
                why = self._evict(p)
                key = f"{p.metadata.namespace}/{p.metadata.name}"
                if why:
                    if key not in refused:
                        self.say(f"{node}: eviction of {key} refused for now ({why}); retrying")
                    refused[key] = why
                else:
                    refused.pop(key, None)
                    self.say(f"{node}: evicting {key}")
            if time.monotonic() > deadline:
                names = [f"{p.metadata.namespace}/{p.metadata.name}" + (f" ({refused[k_]})" if (
                    k_ := f"{p.metadata.namespace}/{p.metadata.name}") in refused else " (still terminating)")
                    for p in left]
                raise DrainTimeout(f"{node}: {len(left)} pod(s) not evicted within {self.drain_timeout:.0f}s: "
                                   + "; ".join(names),
                                   hint="a PodDisruptionBudget allows no disruption now, or a pod does not stop: "
                                        "scale the workload elsewhere or raise --drain-timeout; the node was "
                                        "uncordoned and its layout left as it was")
            time.sleep(self.poll)

    def wait_state(self, node: str, desired: str) -> None:
        """Until mig-manager reports success for desired; ClusterError on failed or timeout."""
        deadline = time.monotonic() + self.state_timeout
        last = None
        while True:
            labels = dict(kube._call(f"read node {node}", lambda: self.core.read_node(node)).metadata.labels or {})
            state = labels.get(STATE)
            if state != last:
                self.say(f"{node}: {STATE}={state or '(none yet)'}")
                last = state
            if labels.get(LABEL) == desired and state == "success":
                return
            if labels.get(LABEL) == desired and state == "failed":
                raise ClusterError(f"{node}: mig-manager could not apply {desired} ({STATE}=failed); the node is left "
                                   "cordoned", hint="read the nvidia-mig-manager pod's log on this node (GPUs still "
                                   "in use, a reset refused, a profile the GPU cannot hold); fix it, then run mig "
                                   "apply again (or kubectl uncordon to give the node back as it is)")
            if time.monotonic() > deadline:
                raise ClusterError(f"{node}: {STATE} is {state or 'not set'} after {self.state_timeout:.0f}s, not "
                                   "success; the node is left cordoned",
                                   hint="is mig-manager running on the node (components.migManager, the node label "
                                        "nvidia.com/gpu.deploy.mig-manager)? a reboot may be needed for the MIG mode "
                                        "change; then run mig apply again")
            time.sleep(self.poll)

    def check_devices(self, node: str, desired: str) -> None:
        """The layout's MIG devices are allocatable (validate's mig.allocatable); the device plugin may take a moment
        to re-advertise, so this waits up to a minute. ClusterError when they do not show."""
        from installer.validate.mig import node_checks

        deadline = time.monotonic() + min(60.0, self.state_timeout)
        while True:
            obj = kube._call(f"read node {node}", lambda: self.core.read_node(node))
            found = [c for c in node_checks(node, desired, self.plan.site.mig.strategy, dict(obj.metadata.labels or {}),
                                            dict(obj.status.allocatable or {})) if c.check == "mig.allocatable"]
            if all(c.status == "pass" for c in found):
                self.say(f"{node}: {found[0].message}" if found else f"{node}: devices ok")
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{found[0].message}; the node is left cordoned", hint=found[0].fix)
            time.sleep(self.poll)

    # ------------------------------------------------------------ the rollout

    def run(self, steps: list[NodeStep], batch: int = 1) -> list[NodeStep]:
        refused = [s for s in steps if s.problem]
        if refused:
            raise ConfigError("; ".join(s.problem or "" for s in refused),
                              hint="pick a config for that GPU model (per node: gpu_install_mig_config); nothing was "
                                   "changed")
        todo = [s for s in steps if s.action == "relabel"]
        for s in steps:
            if s.action == "none":
                self.say(f"{s.node}: already {s.desired} ({STATE}=success)")
        for i in range(0, len(todo), max(1, batch)):
            group = todo[i:i + max(1, batch)]
            self.say(f"batch {i // max(1, batch) + 1}: {', '.join(s.node for s in group)}")
            for s in group:
                self._cordon(s.node, True)
            for s in group:
                try:
                    self.drain(s.node)
                except DrainTimeout:
                    for g in group:  # nothing was relabelled in this batch yet: give the nodes back
                        if not g.cordoned:
                            self._cordon(g.node, False)
                    raise
            for s in group:
                self._relabel(s.node, s.desired)
            for s in group:
                self.wait_state(s.node, s.desired)
                self.check_devices(s.node, s.desired)
            for s in group:
                if not s.cordoned:
                    self._cordon(s.node, False)
                else:
                    self.say(f"{s.node}: stays cordoned (it was before mig apply)")
        return todo


class DrainTimeout(ClusterError):
    """Pods could not be evicted in time; nothing was relabelled (exit 7)."""
