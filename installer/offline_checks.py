"""Every check `preflight` and `apply` make before they contact anything, in one place: `config check` runs the same
functions, so it can say what apply would refuse without a cluster, a registry or a node.

What resolve() checks (installer.plan: the site against the catalog release, the inventory's groups and host
variables, each node's OS and kernel, MIG layout names, registry.ca) happens before these; then:

inputs (ConfigError, exit 2)
  - the inventory's required groups (gpu_install_required_groups, default gpu_nodes; playbooks/tasks/
    validate_inventory.yml checks the same on its own when the playbooks run without gpu-install),
  - the site package repository's key and every node's OS with packages.url (installer.plan.check_package_repo),
  - what the active features read on this machine (a metrics CSV; with their stages, a chart given as a path),
  - the GPU Operator chart when given (a path exists; its version is operator.version's),
  - the pull Secret's credentials where the site file holds them (registry.pullSecret.dockerConfigFile, or neither
    it nor usernameEnv + passwordEnv); the environment variables are read where apply runs, not here,
  - with an inventory, the artifacts the run reads: every image the operator stage deploys (a driver image per node
    OS and kernel) and, with packages.url, every OS package root the roles install -- apply checks that the registry
    and the repository hold them, and cannot ask for what it cannot name;
conflicts (PreflightError, exit 3)
  - what in the site (and the inventory's MIG layouts) contradicts an active feature (installer.features.check).

Nothing here opens a connection: only the site, the inventory and the files they name are read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError
from installer.facts import GPU_GROUP, INVENTORY_HINT

if TYPE_CHECKING:
    from installer.plan import Inventory, Plan

#: the inventory variable naming more groups that must exist and have hosts (validate_inventory.yml reads it too)
REQUIRED_GROUPS_VAR = "gpu_install_required_groups"


def check(plan: Plan, *, stages: bool = True, mirror_check: bool = True, chart: str | None = None) -> None:
    """inputs() then conflicts(): what `config check` runs (as for a plain apply: its stages and its mirror check).
    apply runs inputs() before its first stage and conflicts() first in its preflight stage; preflight runs both."""
    inputs(plan, stages=stages, mirror_check=mirror_check, chart=chart)
    conflicts(plan)


def inputs(plan: Plan, *, stages: bool, mirror_check: bool, chart: str | None = None) -> None:
    """The exit-2 checks (see the module's docstring). stages: the operator stage (and with it the features' stages)
    is to run; mirror_check: apply checks the registry and the package repository (not --skip-mirror-check);
    chart: the GPU Operator chart apply installs (--chart, else operator.chart)."""
    from installer import features
    from installer.plan import check_package_repo

    if plan.inventory is not None:
        required_groups(plan.inventory)
    check_package_repo(plan.site, plan.nodes if plan.inventory is not None else ())
    features.check_inputs(plan.site, stages=stages)
    ps = plan.site.registry.pullSecret
    if stages and ps is not None and (ps.dockerConfigFile or not (ps.usernameEnv and ps.passwordEnv)):
        from installer.kube import docker_config_json

        docker_config_json(plan.site.registry)  # the file the site names (read, never shown), as apply reads it
    if chart:
        from installer.operator import check_chart_version, load_chart

        loaded = load_chart(plan, chart)  # read once, held against operator.chartSha256 / a bundle's signed lock
        check_chart_version(plan, loaded.ref, loaded.source)
    if plan.inventory is not None and mirror_check:
        artifacts(plan, images=stages)


def conflicts(plan: Plan) -> None:
    """The exit-3 checks: the site's feature conflicts."""
    from installer import features

    features.check(plan)


def required_groups(inv: Inventory) -> None:
    """Each required group exists and has hosts (the whole inventory's, as the playbooks' check sees it before
    --limit applies to the plays)."""
    wanted = [GPU_GROUP, *(g for g in _required_var(inv) if g != GPU_GROUP)]
    for group in wanted:
        if not inv.all_groups.get(group):
            raise ConfigError(f"inventory: inventory group '{group}' is missing or empty: add it (see "
                              "inventories/sample/hosts.yml)", hint=INVENTORY_HINT)


def _required_var(inv: Inventory) -> list[str]:
    """gpu_install_required_groups as the playbooks read it (the first host's variables: the check runs once)."""
    manager = inv._manager
    if manager is None or not inv.hosts:
        return []
    from ansible.vars.manager import VariableManager

    host = manager.get_host((inv.all_groups.get("all") or inv.hosts)[0])
    value: Any = VariableManager(loader=inv._loader, inventory=manager).get_vars(host=host).get(REQUIRED_GROUPS_VAR)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise ConfigError(f"inventory: {REQUIRED_GROUPS_VAR} must be a list of group names, not {value!r}",
                          hint=INVENTORY_HINT)
    return [str(g) for g in value]


def artifacts(plan: Plan, *, images: bool) -> None:
    """What apply's registry and package repository checks will ask for, named from the plan (exit 2 when it cannot
    be): the operator stage's images (per node OS, and kernel for precompiled drivers; of every GPU node, as the
    operator is cluster-wide, whatever --limit says), and with packages.url the package roots of the nodes the run
    is about. Reads the plan only."""
    if images:
        from installer.plan import cluster_wide

        _ = cluster_wide(plan).images
    if plan.role_vars.get("package_repo_enabled"):
        _ = plan.artifacts().packages


__all__ = ["REQUIRED_GROUPS_VAR", "artifacts", "check", "conflicts", "inputs", "required_groups"]
