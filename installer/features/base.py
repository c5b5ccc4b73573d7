"""What a feature is: the Feature base class (every hook has a default that adds nothing) and the small types its
hooks return. A feature is one capability a site switches on in its site file (a sharing mode, dynamic MIG, the device
plugin's time-slicing/MPS, monitoring); installer.features keeps the one list of them and the plan, the mirror plan,
the role variables, apply's stages and validate ask that list, never a mode by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from installer.config import Extender, Site
from installer.errors import ConfigError

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.catalog import Release
    from installer.plan import Plan
    from installer.validate.report import Check
    from installer.validate.smoke import Target

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Chart:
    """A chart a feature installs from upstream (the mirror carries it): name, version, repository, and how the mirror
    plan names it (e.g. "HAMi chart")."""

    name: str
    version: str
    repository: str
    label: str


@dataclass(frozen=True)
class StageRun:
    """What apply hands a feature's stage: the plan, the cluster, the operator stage's options, and what the feature's
    check_cluster() returned for this run (e.g. monitoring's scrape flavour)."""

    plan: Plan
    kubeconfig: Path
    check: bool  # apply --check: say what would change, change nothing
    timeout: float
    wait: bool
    say: Progress
    cluster: Any = None


@dataclass(frozen=True)
class StageResult:
    """A stage's row in apply's table: changed | unchanged | would change, and the detail."""

    outcome: str
    detail: str


class Feature:
    """A capability of the site, with what it adds to each part of the plan. Subclasses set `name` and override the
    hooks they need; the defaults add nothing. Hooks taking a Site are pure (no cluster, no host)."""

    name: ClassVar[str]  # e.g. "hami"
    stage: ClassVar[str | None] = None  # its apply/uninstall stage (e.g. "sharing"); None: it has none
    #: the default runtime its pods need on the GPU nodes: "nvidia", "runc" (plain: the NVIDIA runtime must not be
    #: the default, and validate's pods run without the nvidia RuntimeClass), or None (no opinion)
    default_runtime: ClassVar[str | None] = None

    # ---- which sites
    def requested(self, site: Site) -> bool:
        """The site file asks for it (its values, role variables and site conflicts apply)."""
        return False

    def active(self, site: Site) -> bool:
        """It is part of the install (its images, charts, stage, cluster checks and validate checks)."""
        return self.requested(site)

    def what(self, site: Site) -> str:
        """How the site names it in messages, e.g. "sharing.mode hami"."""
        return self.name

    def selector(self, site: Site) -> str:
        """The site setting that pulls in its artifacts, as the mirror plan shows it, e.g. "sharing.mode=hami"."""
        return self.what(site).replace(" ", "=", 1)

    # ---- the site model
    def check_block(self, block: BaseModel) -> None:
        """Its rules on a block of the site model that selects features (config.Mig, config.Sharing), called for
        every feature by that block's validator once its fields are valid: raise ValueError worded for the site file
        (pydantic reports it at the block's path; exit 2). It may settle a field its mode decides."""

    # ---- the plan
    def images(self, site: Site) -> list[Image]:
        """Images it deploys, source -> site registry (Plan.images, the mirror plan, apply's registry check)."""
        return []

    def charts(self, site: Site) -> list[Chart]:
        """Upstream charts it installs (the mirror plan carries them)."""
        return []

    def operator_values(self, site: Site, release: Release, values: dict[str, Any]) -> None:
        """What it sets in the GPU Operator's Helm values (called when requested); raises ConfigError (exit 2)."""

    def component_modes(self, site: Site) -> dict[str, tuple[str, str, bool]]:
        """Operator components whose deployment it decides: name -> (site field, its value, deployed); a
        components.<name>.enabled saying otherwise is refused (called when requested)."""
        return {}

    def role_vars(self, site: Site) -> dict[str, Any]:
        """The role variables it owns, for every site (each is declared in a role's argument spec, so each needs a
        value whether the feature is requested or not)."""
        return {}

    def extenders(self, site: Site) -> list[Extender]:
        """kube-scheduler extenders it wires in (after the site's; called when active)."""
        return []

    def extenders_why(self, site: Site) -> str:
        """Why the scheduler stage runs for it (an error message names it when the inventory lacks a control plane)."""
        return f"{self.what(site)} wires a scheduler extender"

    def conflicts(self, plan: Plan) -> list[str]:
        """What in the site contradicts it, each with its fix (called for every feature; exit 3 before any host)."""
        return []

    # ---- apply
    def check_inputs(self, site: Site) -> None:
        """What it reads from the controller, checked before any host (ConfigError, exit 2)."""

    def check_stage_inputs(self, site: Site) -> None:
        """What its stage alone reads from the controller, checked before any host when the stage is to run
        (ConfigError, exit 2)."""

    def check_cluster(self, plan: Plan, client: Any, say: Progress) -> Any:
        """Read-only, before any host: what in the cluster contradicts it (PreflightError, exit 3); returns what its
        stage needs to know of the cluster (StageRun.cluster)."""
        return None

    def apply(self, run: StageRun) -> StageResult:
        """Its stage (check mode: what would change)."""
        raise NotImplementedError(f"{self.name} has no stage")

    def removal(self, plan: Plan) -> str:
        """What uninstall removes of it (one line of the removal plan)."""
        return ""

    def uninstall(self, plan: Plan, kubeconfig: Path, timeout: float, progress: Progress) -> list[str]:
        """Remove what its stage made; returns what was removed."""
        return []

    # ---- validate
    def cluster_counts(self, plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
        """The cluster layer's count of what the GPU nodes advertise, when it advertises them (None: not its)."""
        return None

    def smoke_target(self, plan: Plan, node: str, obj: Any) -> Target | None:
        """What a pod asks to hold one GPU of the node through it (None: not its)."""
        return None

    def mig_checks(self, plan: Plan, objs: dict[str, Any], facts: dict[str, Any]) -> list[Check] | None:
        """The mig layer's checks when it makes the MIG layouts (None: the static layouts' checks)."""
        return None


@lru_cache(maxsize=4)
def pinned(name: str) -> dict[str, Any]:
    """values/sharing/<name>.yaml as shipped (read once): a feature's pinned images (and chart)."""
    from installer import content
    from installer.safefile import read_yaml

    path = content.sharing_pins_file(name)
    doc = read_yaml(path, what=f"{name} pins")
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a mapping", hint="reinstall gpu-install: its shipped data is damaged")
    return doc


def site_images(site: Site, sources: dict[str, str]) -> list[Image]:
    """component -> upstream reference as Images to the site registry."""
    from installer.artifacts import Image
    from installer.render.values import destination_ref

    return [Image(src, destination_ref(src, site.registry), comp) for comp, src in sources.items()]
