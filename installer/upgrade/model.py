"""The shapes `gpu-install upgrade plan` is made of, shared by the release side (installer.upgrade.release: chart,
values, CRDs, hop and Kubernetes checks, images) and the node side (installer.upgrade.nodes: per-node action,
evictions, blockers, batches). installer.upgrade.plan puts them together, hashes them and writes them out
(schema gpu-install.upgrade-plan/v1, docs/json.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: what a node goes through when the plan is applied, mildest first
NodeAction = Literal["none", "operand-restart", "driver-reload", "host-reboot"]


@dataclass(frozen=True)
class Blocker:
    """Something that stops `upgrade apply` until fixed: where (a node name, or "(cluster)"), what, and the fix."""

    where: str
    what: str
    fix: str


@dataclass(frozen=True)
class CurrentRelease:
    """The operator's Helm release as deployed (read-only view of the cluster)."""

    name: str
    namespace: str
    revision: int
    chart_version: str  # e.g. v23.9.2
    values: dict[str, Any]  # the values the release was installed with (helm get values)
    crds: dict[str, dict[str, Any]] = field(default_factory=dict)  # CRD name -> the CRD object in the cluster


@dataclass(frozen=True)
class Change:
    """One row of the component table, CURRENT -> TARGET (image refs, chart, driver, toolkit versions)."""

    component: str
    current: str | None  # None: not deployed now
    target: str | None  # None: not deployed by the target


@dataclass(frozen=True)
class ReleaseReport:
    """The release side of a plan."""

    current: CurrentRelease | None
    target_version: str
    changes: tuple[Change, ...]
    values_diff: tuple[str, ...]  # lines, three-way: what the site changes, what the release's defaults change
    crd_changes: tuple[str, ...]
    findings: tuple[str, ...]  # informational (skipped majors named, Kubernetes range, rollback caveats)
    blockers: tuple[Blocker, ...]
    driver_changes: bool  # the driver version or mode changes (nodes reload the driver)
    toolkit_changes: bool
    #: sha256 of the target chart's rendered objects ("objects") and of its CRDs ("crds"), each as canonical JSON;
    #: empty without a chart
    target_digests: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodePlan:
    """One GPU node: what the upgrade does to it, which pods it evicts, what blocks it."""

    name: str
    action: NodeAction
    evicts: tuple[str, ...]  # namespace/name of the pods drained from it
    blockers: tuple[Blocker, ...]
    cordoned: bool  # cordoned before the upgrade (stays cordoned, counts as unavailable)
    ready: bool
    upgrade_state: str | None  # nvidia.com/gpu-driver-upgrade-state label, if any
    present: bool = True  # False: the inventory names a node the cluster does not have


@dataclass(frozen=True)
class Batch:
    """Nodes upgraded together; the first batch is the canary (one node)."""

    index: int
    nodes: tuple[str, ...]
    canary: bool
