"""`upgrade apply` with `driver.mode operator|precompiled`: the GPU Operator's own driver upgrade controller
(`driver.upgradePolicy`, from v22.9.2) reloads the drivers; gpu-install decides which nodes it may touch, batch by
batch, with the controller's skip label, and watches its state label.

The controller's protocol (NVIDIA k8s-operator-libs, pkg/upgrade): every GPU node carries
`nvidia.com/gpu-driver-upgrade-state`; a node whose driver pod is not at the driver DaemonSet's current revision goes
upgrade-required → cordon-required → wait-for-jobs-required → pod-deletion-required → drain-required →
pod-restart-required → validation-required → uncordon-required → upgrade-done, or upgrade-failed. A node labelled
`nvidia.com/gpu-driver-upgrade.skip=true` stays in upgrade-required: the controller never starts it.

- hold_all(): before `helm upgrade`, the skip label on every node of the plan's batches, with the annotation
  `gpu-install.io/upgrade-hold=true` in the same patch, so that the new driver DaemonSet does not roll everywhere at
  once. What apply (or `--resume`) needs is on the Nodes, nothing in memory. A node whose skip label an admin set
  (no annotation of ours) is refused before any node is labelled (exit 3): the admin left it out of upgrades on
  purpose.
- release_batch(): lifts the skip label (and our annotation) on the batch's nodes, then watches the Nodes until each
  is upgrade-done. upgrade-failed, seen at any moment of the watch -- also when the controller moves the node on to
  upgrade-done afterwards (NVIDIA/gpu-operator#2549) -- or the deadline stops it with BatchFailed (exit 4) naming the
  node, its recent events and the tail of its driver pod's log.
- lift_all(): removes the skip labels gpu-install set (those with its annotation); an admin's skip labels stay.

A node counts as upgraded when its state is upgrade-done and either the watch saw it in another state first (the
controller took it through the upgrade), or its driver pod is at the driver DaemonSet's newest ControllerRevision
(the controller's own test: nothing to upgrade there, e.g. a batch finished before a `--resume`).

Label and annotation changes are merge patches carrying the resourceVersion read just before: a concurrent change of
the Node (an admin's label) is a conflict that is re-read, never overwritten. Everything read from the cluster
(labels, events, logs) is untrusted: only string labels are read, events and log lines are cut to a bounded size and
credentials in them (`password=…`, `token: …`, URL user:password@) are replaced with ***.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from installer import kube
from installer.errors import ClusterError, HostFailures, PreflightError
from installer.upgrade.cluster import SKIP_LABEL, STATE_LABEL

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

HOLD_ANNOTATION = "gpu-install.io/upgrade-hold"
DONE = "upgrade-done"
FAILED = "upgrade-failed"
REQUIRED = "upgrade-required"
#: the controller's states, in the order a node goes through them
STATES = (REQUIRED, "cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
          "pod-restart-required", "validation-required", "uncordon-required", DONE)
#: labels of the driver pods: the ClusterPolicy's DaemonSet, and NVIDIADriver's (v23.9+)
DRIVER_POD_SELECTORS = ("app=nvidia-driver-daemonset", "app.kubernetes.io/component=nvidia-driver")
DRIVER_CONTAINER = "nvidia-driver-ctr"
REVISION_HASH = "controller-revision-hash"
EVENTS_SHOWN = 10
LOG_LINES = 40
LINE_MAX = 400  # characters of one event message or log line shown
CONFLICT_RETRIES = 5
WATCH_SLICE = 30  # seconds of one watch request; the deadline is checked between them

Progress = Callable[[str, str], None]

_SECRET_ASSIGN = re.compile(
    r"(?i)((?:[\w.-]*)(?:pass(?:word|wd|phrase)?|secret|token|credential|api[_-]?key|private[_-]?key|auth)"
    r"[\w.-]*[\"']?\s*[=:]\s*)((?:bearer|basic)\s+\S+|\"[^\"]*\"|'[^']*'|\S+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")


class BatchFailed(HostFailures):
    """A node of the batch did not get through the operator's driver upgrade: upgrade-failed (also when it flapped
    to upgrade-done afterwards) or still in progress at the deadline. Exit 4 (HostFailures): the failure is the
    node's (its driver did not reload), as a failed host of an Ansible run is; 6 stays validate's findings. The
    node is left as the controller has it (cordoned while the controller holds it); later batches stay held."""

    def __init__(self, node: str, detail: str, *, timed_out: bool = False):
        self.node, self.detail, self.timed_out = node, detail, timed_out
        what = "did not finish the driver upgrade in time" if timed_out else \
            f"the operator's driver upgrade failed ({STATE_LABEL}={FAILED})"
        super().__init__(
            f"{node}: {what}; the nodes of later batches still carry {SKIP_LABEL}=true\n{detail}",
            hint=f"fix the cause on {node} (its driver pod's log and events above), then relabel it "
                 f"(kubectl label node {node} {STATE_LABEL}={REQUIRED} --overwrite) and run `gpu-install upgrade "
                 "apply --resume`; `gpu-install upgrade rollback` goes back to the previous release instead")


# ---------------------------------------------------------------- pure parts


def scrub(text: str) -> str:
    """A line read from the cluster (event message, log line) without credentials and control characters, cut to
    LINE_MAX characters."""
    from installer.jsonout import redact

    text = "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text)
    text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + "***", text)
    text = _BEARER.sub(lambda m: m.group(1) + " ***", text)
    cleaned = redact(text)
    assert isinstance(cleaned, str)
    return cleaned if len(cleaned) <= LINE_MAX else cleaned[:LINE_MAX] + "…"


def held_by_us(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """The node's skip label is gpu-install's hold (upgrade apply set it), not an admin's."""
    return labels.get(SKIP_LABEL) == "true" and annotations.get(HOLD_ANNOTATION) == "true"


def admin_skip(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """The skip label is set, and not by gpu-install."""
    return labels.get(SKIP_LABEL) == "true" and annotations.get(HOLD_ANNOTATION) != "true"


@dataclass
class NodeWatch:
    """What the watch knows of one node of the batch."""

    name: str
    state: str | None = None
    moved: bool = False  # seen in a state other than upgrade-done since the skip label was lifted
    failed: bool = False  # seen upgrade-failed since the skip label was lifted
    in_sync_at_start: bool = False  # its driver pod was at the DaemonSet's revision when the batch started

    def see(self, state: str | None) -> bool:
        """Record a state read from the Node; True when it changed."""
        changed = state != self.state
        self.state = state
        if state != DONE:
            self.moved = True
        if state == FAILED:
            self.failed = True
        return changed

    @property
    def done(self) -> bool:
        return self.state == DONE and not self.failed and (self.moved or self.in_sync_at_start)


def newest_revision_hash(revisions: Iterable[Mapping[str, Any]], owner_uid: str) -> str | None:
    """The controller-revision-hash of a DaemonSet's newest ControllerRevision (the highest .revision among those it
    owns), or None when it owns none."""
    best: tuple[int, str] | None = None
    for r in revisions:
        meta = r.get("metadata") if isinstance(r.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        owners = meta.get("ownerReferences") if isinstance(meta.get("ownerReferences"), list) else []
        assert isinstance(owners, list)
        if not any(isinstance(o, dict) and o.get("uid") == owner_uid for o in owners):
            continue
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        assert isinstance(labels, dict)
        rev, digest = r.get("revision"), labels.get(REVISION_HASH)
        if isinstance(rev, int) and isinstance(digest, str) and (best is None or rev > best[0]):
            best = (rev, digest)
    return best[1] if best else None


def event_lines(events: Iterable[Mapping[str, Any]], limit: int = EVENTS_SHOWN) -> list[str]:
    """The newest `limit` events, oldest first: `<time> <type> <reason>: <message> (xN)`."""
    rows: list[tuple[str, str]] = []
    for e in events:
        when = e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or \
            (e.get("metadata") or {}).get("creationTimestamp") or ""
        count = e.get("count")
        rows.append((str(when), scrub(f"{when} {e.get('type') or '?'} {e.get('reason') or '?'}: "
                                      f"{e.get('message') or ''}".strip()
                                      + (f" (x{count})" if isinstance(count, int) and count > 1 else ""))))
    rows.sort(key=lambda r: r[0])
    return [line for _, line in rows[-limit:]]


def detail_text(node: str, state: str | None, node_events: list[str], pod: str | None, pod_events: list[str],
                log: list[str] | str) -> str:
    """BatchFailed's detail: the node's state, its events, the driver pod's events and log tail (or why none)."""
    out = [f"  {STATE_LABEL}: {state or '(not set)'}", f"  events of node {node} (newest {EVENTS_SHOWN}):"]
    out += [f"    {e}" for e in node_events] or ["    (none)"]
    if pod is None:
        out += ["  driver pod: none found on the node (labels " + " or ".join(DRIVER_POD_SELECTORS) + ")"]
    else:
        out += [f"  events of driver pod {pod}:", *([f"    {e}" for e in pod_events] or ["    (none)"])]
        if isinstance(log, str):
            out += [f"  log of {pod}: not available ({scrub(log)})"]
        else:
            out += [f"  log of {pod} (last {LOG_LINES} lines):", *([f"    {scrub(x)}" for x in log] or ["    (empty)"])]
    return "\n".join(out)


# ---------------------------------------------------------------- cluster access


def _core(client: ApiClient) -> Any:
    from kubernetes import client as k

    return k.CoreV1Api(client)


def _read_node(core: Any, name: str) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return kube._call(f"read node {name}", lambda: core.read_node(name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise kube._api_error(f"read node {name}", exc) from None


def _meta_maps(node: Any) -> tuple[dict[str, str], dict[str, str]]:
    def str_only(m: Any) -> dict[str, str]:
        return {k: v for k, v in (m or {}).items() if isinstance(k, str) and isinstance(v, str)}

    return str_only(node.metadata.labels), str_only(node.metadata.annotations)


def _patch_node(core: Any, name: str, change: Callable[[dict[str, str], dict[str, str]], dict[str, Any] | None],
                what: str) -> None:
    """Read the node, let change() build the labels/annotations patch from what is there (None: nothing to do), and
    send it with the resourceVersion read: a conflict (the node changed meanwhile) is read again."""
    from kubernetes.client.exceptions import ApiException

    for _ in range(CONFLICT_RETRIES):
        node = _read_node(core, name)
        if node is None:
            raise PreflightError(f"node {name} is not in the cluster", hint="plan again (gpu-install upgrade plan)")
        labels, annotations = _meta_maps(node)
        meta = change(labels, annotations)
        if meta is None:
            return
        body = {"metadata": {**meta, "resourceVersion": node.metadata.resource_version}}
        try:
            kube._call(f"{what} on node {name}", lambda: core.patch_node(name, body))  # noqa: B023 - called now
            return
        except ApiException as exc:
            if exc.status == 409:
                continue
            raise kube._api_error(f"{what} on node {name}", exc) from None
    raise ClusterError(f"{what} on node {name}: the node changed under every one of {CONFLICT_RETRIES} tries",
                       hint="something rewrites the node continuously; re-run")


def hold_all(client: ApiClient, nodes: list[str]) -> None:
    """`nvidia.com/gpu-driver-upgrade.skip=true` and our annotation on every node (one patch each); nodes already held
    by us are left as they are. Refuses (PreflightError, exit 3, nothing labelled) when a node is not in the cluster
    or already carries an admin's skip label."""
    core = _core(client)
    problems: list[str] = []
    for name in nodes:
        node = _read_node(core, name)
        if node is None:
            problems.append(f"node {name} is not in the cluster")
            continue
        labels, annotations = _meta_maps(node)
        if admin_skip(labels, annotations):
            problems.append(f"node {name} carries {SKIP_LABEL}=true set outside gpu-install (no {HOLD_ANNOTATION} "
                            "annotation): the operator's upgrade controller leaves it out on purpose")
    if problems:
        raise PreflightError("; ".join(problems) + "; no node was labelled",
                             hint=f"leave such nodes out of the upgrade (--limit) or remove the label (kubectl label "
                                  f"node NODE {SKIP_LABEL}-) if the upgrade may reload their driver; then plan again")

    def hold(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any] | None:
        if held_by_us(labels, annotations):
            return None
        if admin_skip(labels, annotations):  # set between the check above and now: an admin's, never ours to take
            raise PreflightError(f"{SKIP_LABEL}=true was set outside gpu-install while the nodes were being held",
                                 hint="re-run once the node's labels are settled")
        return {"labels": {SKIP_LABEL: "true"}, "annotations": {HOLD_ANNOTATION: "true"}}

    for name in nodes:
        _patch_node(core, name, hold, f"set {SKIP_LABEL}=true")


def lift_all(client: ApiClient, nodes: list[str]) -> None:
    """Remove the skip label from the nodes gpu-install held (its annotation), with the annotation; an admin's skip
    labels and nodes no longer in the cluster are left alone."""
    core = _core(client)

    def lift(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any] | None:
        if annotations.get(HOLD_ANNOTATION) != "true":
            return None
        if labels.get(SKIP_LABEL) == "true":
            return {"labels": {SKIP_LABEL: None}, "annotations": {HOLD_ANNOTATION: None}}
        return {"annotations": {HOLD_ANNOTATION: None}}  # the label went already: our mark goes too

    for name in nodes:
        if _read_node(core, name) is not None:
            _patch_node(core, name, lift, f"remove {SKIP_LABEL}")


# ---------------------------------------------------------------- the driver pod (for the detail and the sync test)


def _get_json(client: ApiClient, path: str, query: list[tuple[str, Any]], what: str) -> dict[str, Any] | None:
    from installer.upgrade.cluster import _get

    return _get(client, path, query, what)


def _items(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    items = (doc or {}).get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def driver_pod(client: ApiClient, node: str) -> dict[str, Any] | None:
    """The driver pod bound to node (the newest, when a restart leaves two), as the API returns it."""
    found: dict[str, dict[str, Any]] = {}
    for selector in DRIVER_POD_SELECTORS:
        doc = _get_json(client, "/api/v1/pods", [("labelSelector", selector), ("fieldSelector",
                        f"spec.nodeName={node}"), ("limit", 50)], f"list the driver pods on {node}")
        for p in _items(doc):
            meta = p.get("metadata") or {}
            found[f"{meta.get('namespace')}/{meta.get('name')}"] = p
    if not found:
        return None
    return max(found.values(), key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))


def pod_in_sync(client: ApiClient, pod: Mapping[str, Any]) -> bool:
    """The pod's controller-revision-hash is its DaemonSet's newest ControllerRevision's (the upgrade controller's
    own 'nothing to upgrade' test). False when either cannot be read."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace")
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("kind") == "DaemonSet"]
    pod_hash = (meta.get("labels") or {}).get(REVISION_HASH)
    if not owners or not isinstance(ns, str) or not isinstance(pod_hash, str):
        return False
    uid = owners[0].get("uid")
    doc = _get_json(client, f"/apis/apps/v1/namespaces/{ns}/controllerrevisions", [("limit", 500)],
                    f"list the ControllerRevisions in {ns}")
    return isinstance(uid, str) and newest_revision_hash(_items(doc), uid) == pod_hash


def _events(client: ApiClient, kind: str, name: str, namespace: str | None) -> list[str]:
    fields = f"involvedObject.kind={kind},involvedObject.name={name}"
    path = f"/api/v1/namespaces/{namespace}/events" if namespace else "/api/v1/events"
    try:
        doc = _get_json(client, path, [("fieldSelector", fields), ("limit", 500)], f"list the events of {kind} {name}")
    except ClusterError as exc:
        return [f"(not available: {scrub(exc.message)})"]
    return event_lines(_items(doc))


def _log_tail(core: Any, pod: Mapping[str, Any]) -> list[str] | str:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    names = [c.get("name") for c in spec.get("containers") or [] if isinstance(c, dict)]
    container = DRIVER_CONTAINER if DRIVER_CONTAINER in names else (names[0] if names else None)
    try:
        text = core.read_namespaced_pod_log(str(meta.get("name")), str(meta.get("namespace")), container=container,
                                            tail_lines=LOG_LINES, limit_bytes=64 * 1024, _request_timeout=20)
    except ApiException as exc:
        return kube._describe(exc)
    except (HTTPError, OSError) as exc:
        return type(exc).__name__
    return str(text).splitlines()[-LOG_LINES:]


def failure_detail(client: ApiClient, node: str, state: str | None) -> str:
    """The node's state, recent events, and its driver pod's events and log tail (never raises for what cannot be
    read: says so instead)."""
    pod_err: str | None = None
    try:
        pod = driver_pod(client, node)
    except ClusterError as exc:
        pod, pod_err = None, exc.message
    node_events = _events(client, "Node", node, None)
    if pod is None:
        text = detail_text(node, state, node_events, None, [], [])
        return text + (f" (listing them failed: {scrub(pod_err)})" if pod_err else "")
    meta = pod.get("metadata") or {}
    name, ns = str(meta.get("name")), str(meta.get("namespace"))
    return detail_text(node, state, node_events, f"{ns}/{name}", _events(client, "Pod", name, ns),
                       _log_tail(_core(client), pod))


# ---------------------------------------------------------------- the batch


def release_batch(client: ApiClient, nodes: list[str], *, timeout: float, progress: Progress) -> None:
    """Lift the skip label on the batch's nodes, then wait until each is upgrade-done (see the module's docstring);
    progress(node, state) at the start and on every change of a node's state. BatchFailed on upgrade-failed (at any
    moment of the watch) or at the deadline; PreflightError (nothing lifted) for a node whose skip label is an
    admin's or that is not in the cluster."""
    core = _core(client)
    deadline = time.monotonic() + timeout
    for name in nodes:
        node = _read_node(core, name)
        if node is None:
            raise PreflightError(f"node {name} is not in the cluster; nothing was lifted",
                                 hint="plan again (gpu-install upgrade plan)")
        if admin_skip(*_meta_maps(node)):
            raise PreflightError(f"node {name} carries {SKIP_LABEL}=true set outside gpu-install; nothing was lifted",
                                 hint=f"remove it (kubectl label node {name} {SKIP_LABEL}-) if the upgrade may "
                                      "reload its driver, or leave the node out (--limit) and plan again")

    # the starting point of the watch is read before anything is lifted: every change after it is seen
    listed = kube._call("list the nodes", core.list_node)  # a quorum read: nothing older
    states = {n.metadata.name: (n.metadata.labels or {}).get(STATE_LABEL) for n in listed.items}
    watches: dict[str, NodeWatch] = {}
    for name in nodes:
        w = NodeWatch(name)
        state = states.get(name)
        w.see(state if isinstance(state, str) else None)  # a node not at upgrade-done now goes through the controller
        if w.failed:  # failed before this batch: nothing is lifted
            raise BatchFailed(name, failure_detail(client, name, w.state))
        if w.state == DONE:
            pod = driver_pod(client, name)
            w.in_sync_at_start = pod is not None and pod_in_sync(client, pod)
        watches[name] = w
        progress(name, w.state or "(not set)")

    def lift(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any] | None:
        if annotations.get(HOLD_ANNOTATION) == "true":
            return {"labels": {SKIP_LABEL: None}, "annotations": {HOLD_ANNOTATION: None}}
        if labels.get(SKIP_LABEL) == "true":
            raise PreflightError(f"{SKIP_LABEL}=true was set outside gpu-install while the batch was released",
                                 hint="re-run once the node's labels are settled")
        return None

    for name in nodes:
        _patch_node(core, name, lift, f"remove {SKIP_LABEL}")
    _watch(client, core, watches, deadline, timeout, progress, listed.metadata.resource_version)


def _check(client: ApiClient, watches: dict[str, NodeWatch]) -> bool:
    """BatchFailed for a node seen failed; True when every node is done."""
    for w in watches.values():
        if w.failed:
            raise BatchFailed(w.name, failure_detail(client, w.name, w.state))
    return all(w.done for w in watches.values())


def _watch(client: ApiClient, core: Any, watches: dict[str, NodeWatch], deadline: float, timeout: float,
           progress: Progress, resource_version: str | None) -> None:
    """Follow every change of the nodes (a watch from the list's resourceVersion: each version of a Node is seen,
    so a failed state the controller leaves again at once is not missed) until all are done, one failed, or the
    deadline."""
    from kubernetes import watch as kwatch
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    def record(name: str, labels: Mapping[str, Any] | None) -> None:
        w = watches.get(name)
        state = (labels or {}).get(STATE_LABEL)
        if w is not None and w.see(state if isinstance(state, str) else None):
            progress(name, w.state or "(not set)")

    while True:
        if resource_version is None:  # (re)list: the starting point of the watch
            listed = kube._call("list the nodes", core.list_node)  # a quorum read: nothing older
            for n in listed.items:
                record(n.metadata.name, n.metadata.labels)
            resource_version = listed.metadata.resource_version
        if _check(client, watches):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            w = next(w for w in watches.values() if not w.done)
            raise BatchFailed(w.name, f"  still {w.state or '(not set)'} after {timeout:.0f} s (the upgrade "
                                      f"controller's maxParallelUpgrades and maxUnavailable decide its pace)\n"
                                      + failure_detail(client, w.name, w.state), timed_out=True)
        stream = kwatch.Watch()  # type: ignore[no-untyped-call]
        try:
            events = stream.stream(  # type: ignore[no-untyped-call]
                core.list_node, resource_version=resource_version, timeout_seconds=max(1, int(min(left, WATCH_SLICE))),
                _request_timeout=min(left, WATCH_SLICE) + 10)
            for event in events:
                obj = event["object"]
                if event["type"] == "ERROR":
                    resource_version = None
                    break
                resource_version = obj.metadata.resource_version
                record(obj.metadata.name, obj.metadata.labels)
                if any(w.failed for w in watches.values()) or all(w.done for w in watches.values()):
                    break
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: the resourceVersion is too old, list again
                raise kube._api_error("watch the nodes", exc) from None
            resource_version = None
        except (HTTPError, OSError):  # the connection dropped or the slice's read limit passed: list again
            resource_version = None
        finally:
            stream.stop()  # type: ignore[no-untyped-call]
