"""The node stages of `preflight`, `apply` and `uninstall`: a resolved Plan's role variables → playbooks through the
Ansible seam (installer.ansible), the run's per-host outcome → the matching exception."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from installer.ansible import RunResult, run_playbook
from installer.errors import ConfigError, HostFailures, HostsUnreachable, PreflightError

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.progress import Display

VALIDATE_PREFIX = "Inventory |"


@dataclass(frozen=True)
class RunOptions:
    """How a node playbook runs (what it runs on comes from the plan: inventory, --limit)."""

    tags: str | None = None
    skip_tags: str | None = None
    check: bool = False
    diff: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)  # variables for tests/labs, merged over the plan's
    keep_packages: bool = False  # uninstall --keep-packages: the driver and toolkit packages stay

    def removing(self) -> RunOptions:
        """The same run with the roles' remove action (uninstall)."""
        keep = {f"{role}_keep_packages": True for role in ("nvidia_driver", "nvidia_container_toolkit")}
        return replace(self, extra={**self.extra, "gpu_install_action": "remove",
                                    **(keep if self.keep_packages else {})})


def scrub_names(plan: Plan) -> list[str]:
    """Env vars holding the site's credentials: removed from the environment ansible-runner sees."""
    ps = plan.pull_secret
    return [n for n in ((ps.usernameEnv, ps.passwordEnv) if ps else ()) if n]


def _run(playbook: str, plan: Plan, run: RunOptions, display: Display | None, tags: bool) -> RunResult:
    inv = plan.require_inventory()
    ev = dict(plan.role_vars) | dict(run.extra)
    return run_playbook(playbook, inv.path, ev, limit=plan.limit, tags=run.tags if tags else None,
                        skip_tags=run.skip_tags if tags else None, check=run.check, diff=run.diff,
                        scrub_env=scrub_names(plan), display=display, inventory_info=inv)


def raise_for(result: RunResult, preflight: bool) -> RunResult:
    """Turn a run's per-host outcome into the matching exception (or return it when all is well)."""
    bad_input = [f for f in result.failures if f.task.startswith(VALIDATE_PREFIX)]
    if bad_input:
        raise ConfigError("inventory: " + "; ".join(sorted({f.message for f in bad_input})),
                          hint="fix the inventory; nothing was changed on any host")
    where = f" (run artifacts: {result.artifacts})"
    if result.unreachable:
        raise HostsUnreachable(f"unreachable: {', '.join(result.unreachable)}" +
                               (f"; failed: {', '.join(result.failed)}" if result.failed else "") + where,
                               hint="check SSH to those hosts; the other hosts finished (re-run with --limit)")
    if result.failed:
        detail = "; ".join(f"{f.host}: {f.message}" for f in result.failures)
        if preflight:
            raise PreflightError(f"preflight failed on {', '.join(result.failed)}: {detail}",
                                 hint="fix the reported problems; nothing was changed")
        raise HostFailures(f"tasks failed on {', '.join(result.failed)}: {detail}" + where,
                           hint="runtime configs are backed up next to the originals; fix and re-run")
    return result


def _check_inputs(plan: Plan) -> None:
    """What the node playbooks read from the controller, checked before any host is contacted (exit 2)."""
    from installer.plan import check_package_repo

    check_package_repo(plan.site, plan.nodes if plan.inventory is not None else ())


def preflight(plan: Plan, run: RunOptions | None = None, display: Display | None = None,
              offline: bool = True) -> RunResult:
    """The read-only probe (playbooks/preflight.yml, always whole: --tags do not apply); raises on problems. First
    (offline: apply's pipeline has made them already) the checks `config check` makes too (installer.offline_checks:
    exit 2, then the site's feature conflicts, exit 3): no host is contacted then."""
    if offline:
        from installer import offline_checks

        offline_checks.check(plan, stages=False, mirror_check=False)
    return raise_for(_run("preflight.yml", plan, run or RunOptions(), display, tags=False), preflight=True)


def run_nodes(playbook: str, plan: Plan, run: RunOptions | None = None, display: Display | None = None) -> RunResult:
    """One node playbook after preflight (site.yml; uninstall.yml with run.removing()), --tags/--skip-tags honoured;
    raises on failed or unreachable hosts."""
    if playbook == "site.yml":
        _check_inputs(plan)
    return raise_for(_run(playbook, plan, run or RunOptions(), display, tags=True), preflight=False)
