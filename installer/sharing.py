"""The sharing stage's entry points as apply and uninstall called them before installer.features: each forwards to
the active feature the sharing stage installs (installer.features.sharing()). Kept until installer.pipeline runs the
features' stages itself (installer.features.staged())."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import features
from installer.config import Site
from installer.features.base import Progress
from installer.features.release import ReleaseFeature, Report

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.plan import Plan


def _one(site: Site) -> ReleaseFeature:
    f = features.sharing(site)
    assert f is not None, "no sharing feature is active"
    return f


def active(site: Site) -> bool:
    return features.sharing(site) is not None


def kind(site: Site) -> str | None:
    f = features.sharing(site)
    return f.name if f else None


def namespace(site: Site) -> str:
    return _one(site).namespace(site)


def release_name(site: Site) -> str:
    return _one(site).release_name(site)


def node_label(site: Site) -> tuple[str, str]:
    return _one(site).node_label(site)


def images(site: Site) -> list[Image]:
    return features.images(site)


def check(plan: Plan) -> None:
    features.check(plan)


def check_chart(site: Site) -> None:
    _one(site).check_stage_inputs(site)


def check_cluster(plan: Plan, client: Any, operator_namespace: str) -> None:
    _one(plan.site).check_cluster(plan, client, lambda _m: None)


def install(plan: Plan, kubeconfig: Path, timeout: float = 300, wait: bool = True,
            progress: Progress | None = None) -> Report:
    return _one(plan.site).install(plan, kubeconfig, timeout=timeout, wait=wait, progress=progress)


def preview(plan: Plan, kubeconfig: Path) -> tuple[bool, str]:
    return _one(plan.site).preview(plan, kubeconfig)


def uninstall(plan: Plan, kubeconfig: Path, timeout: float = 300, progress: Progress | None = None) -> list[str]:
    return _one(plan.site).uninstall(plan, kubeconfig, timeout=timeout, progress=progress)
