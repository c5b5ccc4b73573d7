"""The cluster as it is, read-only, for `gpu-install upgrade plan`: the Kubernetes version, the operator's Helm release
(revision, chart, deployed values) and its CRDs, the GPU nodes of the plan (Ready, cordoned, the driver upgrade
controller's labels), the pods on each and the PodDisruptionBudgets.

Everything here is untrusted input: objects are read as the API returns them (JSON, not the client's models, so a
field the client does not know or a value of the wrong type is no crash), every list is paged and bounded
(MAX_PODS_PER_NODE, MAX_PDBS; what was cut is said in `truncated`), and a missing field reads as absent. Requests
carry installer.limits' API timeouts (installer.kube.api_client); an API server that does not answer is exit 5.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import kube
from installer.upgrade.model import CurrentRelease

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from installer.plan import Plan

#: the CRDs of the operator's groups whose objects `upgrade plan` reads (the release side compares them with the
#: target chart's)
OPERATOR_CRDS = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com")
STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
PAGE = 500  # items per list request
MAX_PODS_PER_NODE = 5000  # kubelet's own limit is 110 by default, 250 at most in practice
MAX_PDBS = 5000


@dataclass(frozen=True)
class NodeState:
    """One GPU node of the plan as the cluster has it (present False: no Node object of that name)."""

    host: str  # the inventory host
    name: str  # the Kubernetes Node name
    present: bool
    ready: bool = False
    unschedulable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    pods: tuple[dict[str, Any], ...] = ()  # the pods bound to it, as the API returns them


@dataclass(frozen=True)
class ClusterState:
    kube_version: str
    release: CurrentRelease | None
    release_status: str | None  # helm's status of the current revision (deployed, failed, pending-upgrade, ...)
    nodes: tuple[NodeState, ...]
    pdbs: tuple[dict[str, Any], ...]
    truncated: tuple[str, ...] = ()  # lists cut at their bound, named


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def str_map(value: Any) -> dict[str, str]:
    """labels/annotations of an untrusted object: only string keys and values."""
    return {k: v for k, v in _obj(value).items() if isinstance(k, str) and isinstance(v, str)}


def node_ready(node: Mapping[str, Any]) -> bool:
    conditions = _list(_obj(node.get("status")).get("conditions"))
    return any(_obj(c).get("type") == "Ready" and _obj(c).get("status") == "True" for c in conditions)


def _get(client: ApiClient, path: str, query: list[tuple[str, Any]], what: str) -> dict[str, Any] | None:
    """GET path as JSON (None on 404); HTTP errors as ClusterError, an unreachable server as ClusterUnreachable."""
    from kubernetes.client.exceptions import ApiException

    api: Any = client

    def call() -> Any:
        method, url, headers, body, post = api.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        resp = api.call_api(method, url, header_params=headers, body=body, post_params=post)
        resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(http_resp=resp)
        return resp

    try:
        resp = kube._call(what, call, attempts=3)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise kube._api_error(what, exc) from None
    try:
        doc = json.loads(resp.data or b"null")
    except ValueError:
        doc = None
    return _obj(doc)


def list_all(client: ApiClient, path: str, what: str, bound: int,
             query: list[tuple[str, Any]] | None = None) -> tuple[list[dict[str, Any]], bool] | None:
    """Every item of a list, page by page (limit/continue), at most `bound` items: (items, cut). None on 404."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(bound // PAGE + 2):  # a server that hands out continue tokens with short pages ends here too
        q = [*(query or []), ("limit", min(PAGE, bound - len(items)))] + ([("continue", token)] if token else [])
        doc = _get(client, path, q, what)
        if doc is None:
            return None
        items.extend(_obj(i) for i in _list(doc.get("items")))
        token = _obj(doc.get("metadata")).get("continue") or None
        if len(items) >= bound:
            return items[:bound], bool(token) or len(items) > bound
        if not isinstance(token, str):
            return items, False
    return items, True


def read_nodes(client: ApiClient, plan: Plan) -> tuple[list[NodeState], list[str]]:
    """The plan's GPU nodes (the inventory's, after --limit) matched to Node objects by name, with their pods."""
    out: list[NodeState] = []
    cut: list[str] = []
    for n in plan.nodes:
        name = n.node_name
        obj = _get(client, f"/api/v1/nodes/{name}", [], f"read node {name}")
        if obj is None:
            out.append(NodeState(n.name, name, False))
            continue
        listed = list_all(client, "/api/v1/pods", f"list the pods on {name}", MAX_PODS_PER_NODE,
                          [("fieldSelector", f"spec.nodeName={name}")])
        pods, more = listed if listed is not None else ([], False)
        if more:
            cut.append(f"pods on {name} (first {MAX_PODS_PER_NODE})")
        out.append(NodeState(n.name, name, True, node_ready(obj), _obj(obj.get("spec")).get("unschedulable") is True,
                             str_map(_obj(obj.get("metadata")).get("labels")), tuple(pods)))
    return out, cut


def read_pdbs(client: ApiClient) -> tuple[list[dict[str, Any]], bool]:
    """Every PodDisruptionBudget (policy/v1; policy/v1beta1 on API servers before 1.21)."""
    for version in ("v1", "v1beta1"):
        listed = list_all(client, f"/apis/policy/{version}/poddisruptionbudgets",
                          f"list PodDisruptionBudgets (policy/{version})", MAX_PDBS)
        if listed is not None:
            return listed
    return [], False


def read_release(plan: Plan, kubeconfig: Path, client: ApiClient) -> tuple[CurrentRelease | None, str | None]:
    """The operator's Helm release (site operator.releaseName in operator.namespace) as deployed, and its status."""
    from installer import helm

    op = plan.site.operator
    found = helm.release_values(op.releaseName, op.namespace, kubeconfig)
    if found is None:
        return None, None
    state, values = found
    chart = state.chart
    version = chart[len("gpu-operator-"):] if chart.startswith("gpu-operator-") else chart.rpartition("-")[2]
    crds = {name: obj for name in OPERATOR_CRDS if (obj := kube._crd_raw(client, name)) is not None}
    return CurrentRelease(state.name, state.namespace, state.revision, version, values, crds), state.status


def read(plan: Plan, kubeconfig: Path, client: ApiClient | None = None) -> tuple[ClusterState, ApiClient]:
    """The whole read: Kubernetes version first (an unreachable cluster fails there, exit 5), then the release,
    the nodes and their pods, the PDBs."""
    client = client or kube.api_client(kubeconfig)
    version = kube.server_version(client)
    release, status = read_release(plan, kubeconfig, client)
    nodes, cut = read_nodes(client, plan)
    pdbs, more = read_pdbs(client)
    if more:
        cut.append(f"PodDisruptionBudgets (first {MAX_PDBS})")
    return ClusterState(version, release, status, tuple(nodes), tuple(pdbs), tuple(cut)), client

