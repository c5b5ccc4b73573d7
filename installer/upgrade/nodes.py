"""The node side of `gpu-install upgrade plan`: per GPU node what the upgrade does to it, the pods it evicts, what
blocks it (each with its fix), and the batches `upgrade apply` takes them in. Pure: it reads the objects
installer.upgrade.cluster read (API JSON, untrusted: a missing or mistyped field reads as absent).

Actions, mildest first (model.NodeAction):
- none: nothing of the node's changes;
- operand-restart: operator operands (device plugin, toolkit container, ...) roll; no pod is evicted;
- driver-reload: the driver version or mode changes. driver.mode operator|precompiled: the operator's upgrade
  controller (driver.upgradePolicy) reloads the driver container, deleting the pods that use the GPU
  (nvidia.com/gpu, nvidia.com/mig-*); driver.mode host|runfile: `apply` drains those pods (Eviction API) and runs
  the driver role;
- host-reboot: driver.mode host|runfile with driver.rebootPolicy always or if-needed (the role reboots when the
  loaded module is not the installed one, which a version change makes so): every pod but DaemonSet and mirror
  pods is evicted (kubectl drain).

Blockers, on nodes whose driver is reloaded: GPU consumers that are not evicted (a pod that uses the GPU only
through `runtimeClassName: nvidia`, DaemonSet and static pods asking for GPUs, other resource names: gpu-manager's
tencent.com/vcuda-*, HAMi's nvidia.com/gpumem|gpucores) -- they keep the kernel modules loaded and the driver
container cannot unload them (NVIDIA/gpu-operator#2570, #2509); PodDisruptionBudgets that select an evicted pod and
allow no disruption now; a node an admin cordoned (it stays cordoned and counts against maxUnavailable); the skip
label; NotReady. On every node: one already in an upgrade-controller state (upgrade-required, upgrade-failed or in
between) and a node the cluster does not have.

Batches: the first node with a driver change and no blocker alone (the canary), then the others, at most
--max-parallel at a time and never more unavailable at once than --max-unavailable (an int or a percentage of the
GPU nodes, rounded up as the operator's upgradePolicy.maxUnavailable is; default 25%) minus the nodes already
unavailable (cordoned or NotReady).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError
from installer.upgrade.cluster import SKIP_LABEL, STATE_LABEL, NodeState, str_map
from installer.upgrade.model import Batch, Blocker, NodeAction, NodePlan, ReleaseReport

if TYPE_CHECKING:
    from installer.config import Site

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
NVIDIA_RUNTIME_CLASS = "nvidia"
DRIVER_ACTIONS: tuple[NodeAction, ...] = ("driver-reload", "host-reboot")
DEFAULT_MAX_UNAVAILABLE = "25%"
CLUSTER = "(cluster)"


# ---------------------------------------------------------------- pods


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = _obj(pod.get("metadata"))
    return f"{meta.get('namespace')}/{meta.get('name')}"


def resources(pod: Mapping[str, Any]) -> set[str]:
    """Every resource name the pod's containers (init containers included) request or limit."""
    spec = _obj(pod.get("spec"))
    out: set[str] = set()
    for c in [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]:
        res = _obj(_obj(c).get("resources"))
        for part in (res.get("limits"), res.get("requests")):
            out.update(k for k in _obj(part) if isinstance(k, str))
    return out


def gpu_consumer(pod: Mapping[str, Any]) -> bool:
    """Asks for nvidia.com/gpu or a MIG device: the pods the operator's upgrade controller (gpuPodDeletion) and
    `apply`'s drain evict."""
    return any(r == GPU or r.startswith(MIG_PREFIX) for r in resources(pod))


def finished(pod: Mapping[str, Any]) -> bool:
    return _obj(pod.get("status")).get("phase") in ("Succeeded", "Failed")


def owner_kind(pod: Mapping[str, Any]) -> str | None:
    """DaemonSet, or "static" for a mirror pod (the kubelet's own), else None: pods no drain evicts."""
    meta = _obj(pod.get("metadata"))
    if "kubernetes.io/config.mirror" in str_map(meta.get("annotations")):
        return "static"
    if any(_obj(o).get("kind") == "DaemonSet" for o in _list(meta.get("ownerReferences"))):
        return "DaemonSet"
    return None


def foreign_resources(site: Site | None) -> tuple[tuple[str, str], ...]:
    """GPU resource names the operator does not evict for, with who advertises them: (name or prefix ending in
    "-", who). Always checked (a cluster may run them without this site's sharing.mode); the active sharing
    feature is named when it is the one."""
    from installer.features import gpumanager, hami, sharing

    feature = sharing(site) if site is not None else None
    active = feature.name if feature is not None else None

    def who(name: str, label: str) -> str:
        return f"{label} (this site's sharing.mode)" if active == name else label

    vcuda = who(gpumanager.NAME, "gpu-manager")
    return ((gpumanager.VCUDA_CORE, vcuda), (gpumanager.VCUDA_MEMORY, vcuda), ("tencent.com/vcuda-", vcuda),
            ("nvidia.com/gpumem", who(hami.NAME, "HAMi")), ("nvidia.com/gpucores", who(hami.NAME, "HAMi")))


def _foreign(pod: Mapping[str, Any], foreign: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    for r in sorted(resources(pod)):
        for name, by in foreign:
            if r == name or (name.endswith("-") and r.startswith(name)):
                return r, by
    return None


# ---------------------------------------------------------------- PodDisruptionBudgets


def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels + matchExpressions) against a pod's labels; null selects nothing, {} all
    (policy/v1's rule)."""
    if not isinstance(selector, dict):
        return False
    for k, v in _obj(selector.get("matchLabels")).items():
        if labels.get(k) != v:
            return False
    for e in _list(selector.get("matchExpressions")):
        e = _obj(e)
        key, op, values = e.get("key"), e.get("operator"), [v for v in _list(e.get("values")) if isinstance(v, str)]
        if not isinstance(key, str):
            return False
        has = key in labels
        if op == "In" and not (has and labels[key] in values):
            return False
        if op == "NotIn" and has and labels[key] in values:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def holding_pdbs(pod: Mapping[str, Any], pdbs: Iterable[Mapping[str, Any]]) -> list[str]:
    """namespace/name of the PDBs that select the pod and allow no disruption now (status.disruptionsAllowed 0)."""
    meta = _obj(pod.get("metadata"))
    labels = str_map(meta.get("labels"))
    out = []
    for pdb in pdbs:
        pmeta = _obj(pdb.get("metadata"))
        if pmeta.get("namespace") != meta.get("namespace"):
            continue
        allowed = _obj(pdb.get("status")).get("disruptionsAllowed", 0)
        if isinstance(allowed, int) and not isinstance(allowed, bool) and allowed > 0:
            continue
        if selects(_obj(pdb.get("spec")).get("selector"), labels):
            out.append(f"{pmeta.get('namespace')}/{pmeta.get('name')}")
    return out


# ---------------------------------------------------------------- per node


def node_action(report: ReleaseReport, site: Site) -> NodeAction:
    """What every GPU node of the site goes through (the release side decides what changes; the site's driver mode
    and reboot policy decide how)."""
    mode = site.driver.mode
    if report.driver_changes and mode in ("host", "runfile"):
        return "host-reboot" if site.driver.rebootPolicy in ("always", "if-needed") else "driver-reload"
    if report.driver_changes and mode in ("operator", "precompiled"):
        return "driver-reload"
    if report.toolkit_changes or any(c.current != c.target for c in report.changes):
        return "operand-restart"
    return "none"


def _state_blocker(node: str, state: str) -> Blocker | None:
    if state in ("", "upgrade-done"):
        return None
    look = f"kubectl describe node {node} (its events) and the nvidia-driver pod's log on it"
    if state == "upgrade-failed":
        return Blocker(node, f"the operator's driver upgrade failed here ({STATE_LABEL}=upgrade-failed)",
                       f"{look}; fix the cause, then relabel it {STATE_LABEL}=upgrade-required to retry (or "
                       f"remove the label once the driver runs), and plan again")
    if state == "upgrade-required":
        return Blocker(node, f"an earlier driver upgrade is still waiting here ({STATE_LABEL}=upgrade-required)",
                       f"let it finish or find why it is stuck ({look}: pods still holding the GPU keep the kernel "
                       f"modules loaded), then plan again")
    return Blocker(node, f"a driver upgrade is in progress here ({STATE_LABEL}={state})",
                   "wait until the operator's upgrade controller reaches upgrade-done, then plan again")


def plan_node(state: NodeState, action: NodeAction, pdbs: Sequence[Mapping[str, Any]], operator_namespace: str,
              foreign: Sequence[tuple[str, str]]) -> NodePlan:
    """One node's NodePlan from its cluster state and the action the release gives every node."""
    name = state.name
    if not state.present:
        return NodePlan(name, action, (), (Blocker(
            name, f"inventory host {state.host}: the cluster has no node {name}",
            "set gpu_install_node_name on that host when its Kubernetes node name differs, or leave the host out "
            "with --limit"),), False, False, None, present=False)
    upgrade_state = state.labels.get(STATE_LABEL)
    blockers: list[Blocker] = []
    if (b := _state_blocker(name, upgrade_state or "")) is not None:
        blockers.append(b)
    evicts: list[str] = []
    if action in DRIVER_ACTIONS:
        if not state.ready:
            blockers.append(Blocker(name, "the node is NotReady", "bring its kubelet back (kubectl describe node "
                                    f"{name}) or leave it out with --limit, then plan again"))
        if state.unschedulable:
            blockers.append(Blocker(name, "the node was cordoned before the upgrade: it stays cordoned and counts "
                                          "against --max-unavailable",
                                    f"uncordon it if it should be upgraded with the others (kubectl uncordon {name}), "
                                    "or leave it out with --limit"))
        if state.labels.get(SKIP_LABEL) == "true":
            blockers.append(Blocker(name, f"{SKIP_LABEL}=true: the operator's upgrade controller leaves this node out",
                                    f"remove the label (kubectl label node {name} {SKIP_LABEL}-) or leave the node "
                                    "out with --limit"))
        for pod in state.pods:
            if finished(pod):
                continue
            key = pod_key(pod)
            meta = _obj(pod.get("metadata"))
            kind = owner_kind(pod)
            operand = meta.get("namespace") == operator_namespace  # the operator's own: it restarts them itself
            if action == "host-reboot":
                if kind is None:
                    evicts.append(key)
                continue
            if gpu_consumer(pod) and kind is None:
                evicts.append(key)
            elif operand:
                continue
            elif gpu_consumer(pod):
                blockers.append(Blocker(name, f"pod {key} ({'a DaemonSet pod' if kind == 'DaemonSet' else 'a static pod'}"
                                              ") uses the GPU and is never evicted: it keeps the driver loaded",
                                        f"take it off the node for the upgrade (delete it, or keep its "
                                        f"{'DaemonSet' if kind == 'DaemonSet' else 'manifest'} off this node with a "
                                        "nodeSelector/affinity), then plan again"))
            elif (hit := _foreign(pod, foreign)) is not None:
                blockers.append(Blocker(name, f"pod {key} uses the GPU through {hit[0]} ({hit[1]}), which the "
                                              "upgrade does not evict for: it keeps the driver loaded",
                                        "stop it (scale its workload down or delete the pod) before apply, then plan "
                                        "again"))
            elif _obj(pod.get("spec")).get("runtimeClassName") == NVIDIA_RUNTIME_CLASS:
                blockers.append(Blocker(name, f"pod {key} uses the GPU only through runtimeClassName: nvidia (no "
                                              f"{GPU} request), so it is not evicted and keeps the driver loaded",
                                        f"give it a {GPU} request (then it is evicted) or stop it before apply, then "
                                        "plan again"))
        pdb_pods: dict[str, list[str]] = {}
        by_key = {pod_key(p): p for p in state.pods}
        for key in evicts:
            for pdb in holding_pdbs(by_key[key], pdbs):
                pdb_pods.setdefault(pdb, []).append(key)
        for pdb, keys in pdb_pods.items():
            blockers.append(Blocker(name, f"PodDisruptionBudget {pdb} allows no disruption now and selects "
                                          f"{', '.join(keys)}, which the upgrade evicts",
                                    "scale that workload up (or relax the budget's minAvailable/maxUnavailable) so "
                                    "that one pod may go, then plan again"))
    return NodePlan(name, action, tuple(evicts), tuple(blockers), state.unschedulable, state.ready, upgrade_state)


#: GPU Feature Discovery's driver version labels: the full version, else major.minor.rev
DRIVER_LABEL_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_LABEL_PARTS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")


def node_driver_version(labels: Mapping[str, str]) -> str | None:
    """The driver version a node runs, as GPU Feature Discovery labels it; None when it does not."""
    if labels.get(DRIVER_LABEL_FULL):
        return labels[DRIVER_LABEL_FULL]
    parts = [labels.get(k) for k in DRIVER_LABEL_PARTS]
    if parts[0] and parts[1]:
        return ".".join(p for p in parts if p)
    return None


def host_driver_action(state: NodeState, action: NodeAction, site: Site | None,
                       target: str | None) -> NodeAction:
    """driver.mode host|runfile: the nodes' own driver does not follow the release, so a node whose driver (GFD's
    labels) is not the site's driver version (driver.version, a runfile's version; a branch such as 535 matches its
    releases) reloads it even when the release's driver side does not change. Unknown versions change nothing."""
    if site is None or site.driver.mode not in ("host", "runfile") or action in DRIVER_ACTIONS or not target:
        return action
    have = node_driver_version(state.labels)
    if have is None or have == target or have.startswith(f"{target}."):
        return action
    return "host-reboot" if site.driver.rebootPolicy in ("always", "if-needed") else "driver-reload"


def plan_nodes(states: Sequence[NodeState], action: NodeAction, pdbs: Sequence[Mapping[str, Any]],
               operator_namespace: str, site: Site | None = None,
               host_driver: str | None = None) -> list[NodePlan]:
    """host_driver: the host driver version the site installs (role variable nvidia_driver_package_version)."""
    foreign = foreign_resources(site)
    return [plan_node(s, host_driver_action(s, action, site, host_driver), pdbs, operator_namespace, foreign)
            for s in states]


# ---------------------------------------------------------------- batches


def max_unavailable_arg(text: str) -> str | int:
    """--max-unavailable: a node count (N >= 1) or a percentage (1%..100%)."""
    text = text.strip()
    if re.fullmatch(r"[1-9][0-9]{0,5}", text):
        return int(text)
    if re.fullmatch(r"(100|[1-9][0-9]?)%", text):
        return text
    raise ConfigError(f"--max-unavailable {text!r} is neither a node count nor a percentage",
                      hint="give e.g. 1 or 25% (default 25%, like the operator's driver.upgradePolicy.maxUnavailable)")


def unavailable_budget(spec: str | int, total: int) -> int:
    """How many of total nodes may be unavailable at once: N, or the percentage of total rounded up (as the
    operator's upgrade controller scales maxUnavailable)."""
    if isinstance(spec, int):
        return spec
    return math.ceil(total * int(spec.rstrip("%")) / 100)


def batches(nodes: Sequence[NodePlan], max_parallel: int = 1,
            max_unavailable: str | int = DEFAULT_MAX_UNAVAILABLE) -> tuple[tuple[Batch, ...], tuple[Blocker, ...]]:
    """The canary (the first node with a driver change and no blocker), then the others in batches of at most
    min(max_parallel, budget - already unavailable); a cluster blocker when that leaves no room at all."""
    if max_parallel < 1:
        raise ConfigError(f"--max-parallel {max_parallel}: must be at least 1", hint="give e.g. --max-parallel 1")
    todo = [n.name for n in nodes if n.action in DRIVER_ACTIONS and not n.blockers]
    if not todo:
        return (), ()
    present = [n for n in nodes if n.present]
    budget = unavailable_budget(max_unavailable, len(present))
    down = sorted(n.name for n in present if n.cordoned or not n.ready)
    width = min(max_parallel, budget - len(down))
    if width < 1:
        return (), (Blocker(CLUSTER, f"--max-unavailable {max_unavailable} of {len(present)} GPU node(s) allows "
                                     f"{budget} unavailable at once, and {len(down)} already are "
                                     f"({', '.join(down)}): no node can be taken down",
                            "uncordon or repair those nodes, or raise --max-unavailable"),)
    out = [Batch(1, (todo[0],), True)]
    rest = todo[1:]
    for i in range(0, len(rest), width):
        out.append(Batch(len(out) + 1, tuple(rest[i:i + width]), False))
    return tuple(out), ()
