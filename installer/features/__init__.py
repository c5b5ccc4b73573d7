"""Features: the capabilities a site switches on beside the GPU Operator itself, one module each, in one list.

A feature (installer.features.base.Feature) says what it adds to each part of the plan: images and charts (Plan.images,
the mirror plan), GPU Operator values, role variables, scheduler extenders, site conflicts (exit 3), inputs checked
before any host (exit 2), cluster checks (exit 3), its apply/uninstall stage, validate's checks. The plan, the mirror
plan, the role variables, apply and validate ask the functions below, which iterate FEATURES; nothing outside this
package tests a mode by name. Adding a feature: a module with a Feature subclass and its FEATURE, and one line in
FEATURES.

Order matters where features meet: the first feature with site conflicts is the one reported (nos before the sharing
modes it refuses), operator values are set in this order, stages run in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from installer.config import Extender, Site
from installer.errors import PreflightError
from installer.features import device_plugin, gpumanager, hami, monitoring, nos
from installer.features.base import Chart, Feature, StageResult, StageRun
from installer.features.release import ReleaseFeature

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.catalog import Release
    from installer.plan import Plan
    from installer.validate.report import Check
    from installer.validate.smoke import Target

#: every feature, in the order they meet (see above)
FEATURES: tuple[Feature, ...] = (
    nos.FEATURE,
    gpumanager.FEATURE,
    hami.FEATURE,
    device_plugin.FEATURE,
    monitoring.FEATURE,
)


def requested(site: Site) -> list[Feature]:
    """The features the site file asks for."""
    return [f for f in FEATURES if f.requested(site)]


def active(site: Site) -> list[Feature]:
    """The features that are part of the install."""
    return [f for f in FEATURES if f.active(site)]


def staged(site: Site) -> list[Feature]:
    """The active features with an apply/uninstall stage of their own, in stage order (Feature.stage names it)."""
    return [f for f in active(site) if f.stage]


#: the features' apply/uninstall stages in order (Feature.stage), and why one does not run when no active feature has it
STAGES: dict[str, str] = {
    "sharing": "no sharing.mode with a release of its own (gpumanager, hami) and no mig.dynamic nos",
    "monitoring": "monitoring.enabled is false",
}


def feature_stages(site: Site) -> list[tuple[str, Feature | None, str]]:
    """Every feature stage, in order, for a stage table that lists them all: (stage name, the active feature that
    runs it, or None and the reason it does not run)."""
    out: list[tuple[str, Feature | None, str]] = []
    for stage, why_not in STAGES.items():
        f = next((f for f in staged(site) if f.stage == stage), None)
        out.append((stage, f, "" if f else why_not))
    return out


def sharing(site: Site) -> ReleaseFeature | None:
    """The active feature the sharing stage installs (gpumanager, hami or nos), if any."""
    return next((f for f in active(site) if isinstance(f, ReleaseFeature)), None)


# ---------------------------------------------------------------- the site model


def check_block(block: BaseModel) -> None:
    """Every feature's rules on a block of the site model (installer.config calls it from the block's validator)."""
    for f in FEATURES:
        f.check_block(block)


# ---------------------------------------------------------------- the plan


def images(site: Site) -> list[Image]:
    return [i for f in active(site) for i in f.images(site)]


def charts(site: Site) -> list[tuple[Feature, Chart]]:
    return [(f, c) for f in active(site) for c in f.charts(site)]


def image_selector(site: Site, component: str) -> str:
    """The site setting that pulls in a feature's image (its component name), as the mirror plan shows it."""
    return next((f.selector(site) for f in active(site) if component in {i.component for i in f.images(site)}),
                f"sharing.mode={site.sharing.mode}")


def operator_values(site: Site, release: Release, values: dict[str, Any]) -> None:
    for f in requested(site):
        f.operator_values(site, release, values)


def component_modes(site: Site) -> dict[str, tuple[str, str, bool]]:
    out: dict[str, tuple[str, str, bool]] = {}
    for f in requested(site):
        out |= f.component_modes(site)
    return out


def role_vars(site: Site) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in FEATURES:
        out |= f.role_vars(site)
    return out


def extenders(site: Site) -> list[Extender]:
    """Every extender the scheduler_policy role writes: the site's, then the active features'."""
    return [*site.scheduler.extenders, *(e for f in active(site) for e in f.extenders(site))]


def extenders_why(site: Site) -> str:
    """Why the scheduler stage runs (extenders() is not empty)."""
    if site.scheduler.extenders:
        return "scheduler.extenders are"
    return next(f.extenders_why(site) for f in active(site) if f.extenders(site))


def default_runtime(site: Site) -> str | None:
    """The default runtime an active feature needs on the GPU nodes ("runc" wins: it is about isolation)."""
    wanted = {f.default_runtime for f in active(site)}
    return "runc" if "runc" in wanted else "nvidia" if "nvidia" in wanted else None


def conflicts(plan: Plan) -> list[str]:
    """What in the site contradicts a feature, each with its fix: the first feature's (in FEATURES order) that has
    any; empty: none."""
    return next((found for f in FEATURES if (found := f.conflicts(plan))), [])


def check(plan: Plan) -> None:
    """The site's feature conflicts: exit 3 before any host."""
    for f in FEATURES:
        found = f.conflicts(plan)
        if found:
            raise PreflightError(f"{f.what(plan.site)} conflicts with the site:\n    "
                                 + "\n    ".join(found), hint="fix the site file; nothing was changed on any host")


# ---------------------------------------------------------------- apply and uninstall


def check_inputs(site: Site, stages: bool = True) -> None:
    """What the active features read from the controller, before any host (exit 2); stages: their stages are to run
    (the operator stage is), so what those read too."""
    for f in active(site):
        if stages and f.stage:
            f.check_stage_inputs(site)
        f.check_inputs(site)


def check_cluster(plan: Plan, client: Any, say: Any) -> dict[str, Any]:
    """Each staged feature's cluster check (exit 3), before any host: feature name -> what its stage needs."""
    return {f.name: f.check_cluster(plan, client, say) for f in staged(plan.site)}


def removal(plan: Plan) -> list[str]:
    return [line for f in staged(plan.site) if (line := f.removal(plan))]


# ---------------------------------------------------------------- validate


def cluster_counts(plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check]:
    """The cluster layer's count: of the active feature that advertises the GPUs, else the operator's device plugin
    (with time-slicing/MPS replicas, or one per GPU)."""
    for f in active(plan.site):
        found = f.cluster_counts(plan, objs, facts)
        if found is not None and f is not device_plugin.FEATURE:
            return found
    return device_plugin.FEATURE.cluster_counts(plan, objs, facts) or []


def smoke_target(plan: Plan, node: str, obj: Any) -> Target | None:
    """What a pod asks to hold one GPU of the node through an active feature (None: one GPU as advertised)."""
    return next((t for f in active(plan.site) if (t := f.smoke_target(plan, node, obj)) is not None), None)


def mig_checks(plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
    """The mig layer's checks of an active feature that makes the MIG layouts (None: the static layouts')."""
    return next((c for f in active(plan.site) if (c := f.mig_checks(plan, objs, facts)) is not None), None)


__all__ = ["FEATURES", "STAGES", "Chart", "Feature", "ReleaseFeature", "StageResult", "StageRun", "active", "check",
           "check_block", "charts", "conflicts", "extenders", "feature_stages", "images", "requested", "role_vars",
           "sharing", "staged"]
