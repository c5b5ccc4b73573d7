"""Smoke layer: one pod per GPU node, all at once, each pinned to its node (node affinity on metadata.name, so the
scheduler explains a pod that cannot go there), asking one GPU (or one MIG device under the mixed strategy), with
the site's pull Secret and the operator's RuntimeClass when the cluster has it:

  init container  nvidia-smi   the release's CUDA image (operator.initContainer) from the site registry:
                               `nvidia-smi -L` must list at least one GPU
  container       vectoradd    the release's validator image (the GPU Operator's own CUDA workload check):
                               `vectorAdd` must print `Test PASSED`

The pods are deleted when the layer ends (also on Ctrl-C); failed ones are kept with keep_failed. A pod that never
runs is explained from the API: unschedulable (the scheduler's message: insufficient GPUs, taints), image pull
errors (the registry's message), a container that failed (its log's last lines)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from installer.validate.report import Check

LAYER = "smoke"
MANAGED = {"app.kubernetes.io/managed-by": "gpu-install", "app.kubernetes.io/component": "validate-smoke"}
RUN_LABEL = "gpu-install.io/validate-run"
NODE_ANNOTATION = "gpu-install.io/node"
GPU_LINE = re.compile(r"^GPU \d+: ", re.M)
PASSED = "Test PASSED"
UNSCHEDULABLE_GRACE = 20.0  # seconds a pod may stay unschedulable before it is reported (the scheduler retries)
# seconds a Succeeded pod's container log may stay empty before it counts as what the container said: the kubelet
# reports a short-lived container terminated as soon as it exits, and the runtime's copy of its output to the log
# file can land after that (a lab run read vectorAdd's log as '' once, and whole on the next read)
LOG_GRACE = 10.0


@dataclass
class Target:
    node: str
    resource: str  # nvidia.com/gpu or nvidia.com/mig-<profile> (as shown: one of it is asked), or a description
    limits: dict[str, str] | None = None  # what the containers ask instead of one `resource` (gpu-manager's vcuda)
    pod: str = ""
    started: float = field(default_factory=time.monotonic)
    unschedulable_since: float | None = None
    empty_log_since: float | None = None
    done: Check | None = None


def run_id() -> str:
    return hashlib.sha256(f"{time.time_ns()}".encode()).hexdigest()[:8]


def pod_body(t: Target, namespace: str, run: str, smi_image: str, vector_image: str, pull_secret: str | None,
             runtime_class: str | None) -> dict[str, Any]:
    limits = dict(t.limits) if t.limits else {t.resource: "1"}
    env = [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [t.node]}]}]}}},
        # a cordoned node is validated too (`upgrade apply` validates a batch before it uncordons it): the cordon's
        # taint is tolerated, as DaemonSet pods tolerate it
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
        "initContainers": [{"name": "nvidia-smi", "image": smi_image, "command": ["nvidia-smi", "-L"],
                            "env": env, "resources": {"limits": limits}}],
        "containers": [{"name": "vectoradd", "image": vector_image, "command": ["sh", "-c", "vectorAdd"],
                        "env": env, "resources": {"limits": limits}}],
    }
    if pull_secret:
        spec["imagePullSecrets"] = [{"name": pull_secret}]
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": t.pod, "namespace": namespace, "labels": {**MANAGED, RUN_LABEL: run},
                         "annotations": {NODE_ANNOTATION: t.node}},
            "spec": spec}


def _waiting(pod: Any) -> tuple[str, str] | None:
    """(reason, message) of the first container stuck waiting on its image or its config."""
    for s in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
        w = s.state.waiting if s.state else None
        if w and w.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                              "CreateContainerError", "RunContainerError"):
            return f"{s.name}: {w.reason}", w.message or ""
    return None


def _logs(core: Any, pod: str, namespace: str, container: str) -> str:
    try:
        return str(core.read_namespaced_pod_log(pod, namespace, container=container, _request_timeout=30))
    except Exception as exc:  # noqa: BLE001 - the verdict says the log could not be read
        return f"<log of {container} unreadable: {type(exc).__name__}: {getattr(exc, 'reason', exc)}>"


def _tail(text: str, n: int = 5) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


def verdict(t: Target, pod: Any, core: Any, namespace: str, now: float) -> Check | None:
    """The pod's Check when it has finished (or can be explained), else None."""
    def check(ok: bool, message: str, fix: str = "") -> Check:
        return Check(LAYER, "smoke.gpu-pod", t.node, "pass" if ok else "fail", message, "" if ok else fix,
                     seconds=now - t.started)

    phase = pod.status.phase
    if phase == "Succeeded":
        smi = _logs(core, t.pod, namespace, "nvidia-smi")
        vec = _logs(core, t.pod, namespace, "vectoradd")
        if not (smi.strip() and vec.strip()):  # read again on the next poll, for LOG_GRACE at most
            t.empty_log_since = now if t.empty_log_since is None else t.empty_log_since
            if now - t.empty_log_since < LOG_GRACE:
                return None
        gpus = len(GPU_LINE.findall(smi))
        if gpus >= 1 and PASSED in vec:
            return check(True, f"{t.resource}: nvidia-smi -L listed {gpus} GPU(s); vectorAdd: {PASSED}")
        return check(False, f"{t.resource}: the pod exited 0 but nvidia-smi listed {gpus} GPU(s) and vectorAdd said "
                            f"{_tail(vec, 2)!r}", "the images are not the CUDA/validator images the release pins?")
    if phase == "Failed":
        for s in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
            term = s.state.terminated if s.state else None
            if term and term.exit_code:
                log = _logs(core, t.pod, namespace, s.name)
                fix = ("nvidia-smi found no GPU in the container: is the NVIDIA runtime the default (or the "
                       "RuntimeClass set) and the toolkit configured? see the node and runtime layers"
                       if s.name == "nvidia-smi" else
                       "the CUDA sample failed on this GPU: driver/CUDA mismatch, or an unhealthy GPU (see the node "
                       "layer: XID, ECC, throttling)")
                return check(False, f"{s.name} exited {term.exit_code}: {_tail(log)}", fix)
        return check(False, f"pod Failed: {pod.status.reason or ''} {pod.status.message or ''}".strip(),
                     f"kubectl -n {namespace} describe pod {t.pod}")
    stuck = _waiting(pod)
    if stuck:
        what, message = stuck
        fix = ("the image is not in the site registry (gpu-install mirror push) or the pull Secret is wrong; the "
               "registry's answer is above" if "Image" in what else
               f"kubectl -n {namespace} describe pod {t.pod}")
        return check(False, f"{what}: {message}".rstrip(": "), fix)
    cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
    if cond is not None and cond.status == "False" and cond.reason == "Unschedulable":
        if t.unschedulable_since is None:
            t.unschedulable_since = now
        if now - t.unschedulable_since >= UNSCHEDULABLE_GRACE:
            msg = cond.message or ""
            fix = ("every GPU of the node is in use, or none is advertised (cluster layer: gpu-allocatable)"
                   if "Insufficient" in msg else
                   "the node has a taint the smoke pod does not tolerate (it tolerates nvidia.com/gpu and a cordon)"
                   if "taint" in msg else
                   "see the scheduler's message")
            return check(False, f"not schedulable on {t.node}: {msg}", fix)
    else:
        t.unschedulable_since = None
    return None


def run(core: Any, namespace: str, targets: list[Target], smi_image: str, vector_image: str,
        pull_secret: str | None, runtime_class: str | None, timeout: float = 300.0, keep_failed: bool = False,
        progress: Callable[[str], None] | None = None, poll: float = 1.0) -> list[Check]:
    """Create every pod, wait until each has a verdict (or the timeout), clean up, return one Check per node."""
    from kubernetes.client.exceptions import ApiException

    run = run_id()
    for i, t in enumerate(targets):
        t.pod = f"gpu-install-smoke-{run}-{i}"
    created: list[Target] = []
    try:
        for t in targets:
            body = pod_body(t, namespace, run, smi_image, vector_image, pull_secret, runtime_class)
            try:
                core.create_namespaced_pod(namespace, body)
            except ApiException as exc:
                t.done = Check(LAYER, "smoke.gpu-pod", t.node, "fail",
                               f"the smoke pod was refused: HTTP {exc.status} {exc.reason}",
                               "an admission webhook or quota refused it; see the API server's message")
                continue
            t.started = time.monotonic()
            created.append(t)
        if progress:
            progress(f"smoke: {len(created)} pod(s) in {namespace} (run {run}), waiting up to {timeout:.0f}s")
        deadline = time.monotonic() + timeout
        while any(t.done is None for t in created):
            now = time.monotonic()
            pods = {p.metadata.name: p for p in
                    core.list_namespaced_pod(namespace, label_selector=f"{RUN_LABEL}={run}").items}
            for t in created:
                if t.done is not None:
                    continue
                pod = pods.get(t.pod)
                if pod is None:
                    t.done = Check(LAYER, "smoke.gpu-pod", t.node, "fail", "the smoke pod disappeared",
                                   "something deleted it (an eviction or a controller); run validate again")
                else:
                    t.done = verdict(t, pod, core, namespace, now)
                if t.done is not None and progress:
                    progress(f"smoke: {t.node}: {t.done.status} ({t.done.message})")
            if now > deadline:
                for t in created:
                    if t.done is None:
                        pod = pods.get(t.pod)
                        phase = pod.status.phase if pod is not None else "gone"
                        t.done = Check(LAYER, "smoke.gpu-pod", t.node, "fail",
                                       f"no verdict within {timeout:.0f}s (pod {phase})",
                                       f"kubectl -n {namespace} describe pod {t.pod} (use --keep-failed to keep it)",
                                       seconds=now - t.started)
                break
            if any(t.done is None for t in created):
                time.sleep(poll)
    finally:
        keep = {t.pod for t in created if keep_failed and (t.done is None or t.done.status != "pass")}
        for t in created:
            if t.pod in keep:
                continue
            try:
                core.delete_namespaced_pod(t.pod, namespace, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        if keep and progress:
            progress(f"smoke: kept {len(keep)} failed pod(s) in {namespace}: {', '.join(sorted(keep))}")
    return [t.done for t in targets if t.done is not None]
