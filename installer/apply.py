"""`gpu-install preflight` and `apply`: site → role variables → playbooks through the Ansible seam.

role_vars() is the single source of the variables Python hands to the roles (all declared in the roles'
meta/argument_specs.yml; tests/unit/test_ansible_apply.py keeps it so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from installer.ansible import RunResult, run_playbook
from installer.catalog import Catalog
from installer.config import Site, runfile_version
from installer.errors import ConfigError, HostFailures, HostsUnreachable, PreflightError

CERTS_D = "/etc/containerd/certs.d"
DOCKER_CERTS_D = "/etc/docker/certs.d"
VALIDATE_PREFIX = "Inventory |"


_PKG_VERSION = re.compile(r"^v?(\d+(?:\.\d+)+(?:-\d[0-9A-Za-z.+~]*)?)(?:-[A-Za-z][0-9A-Za-z.+~-]*)?$")


def toolkit_package_version(tag: str) -> str:
    """The toolkit's package version from an image tag or version: v1.17.4-ubuntu20.04 -> 1.17.4, v1.18.0 -> 1.18.0,
    1.17.4-1 (a package revision) stays."""
    m = _PKG_VERSION.match(tag.strip())
    if not m:
        raise ConfigError(f"toolkit.version {tag!r} is not a toolkit version",
                          hint="use the toolkit release, e.g. 1.17.4 or v1.17.4-ubuntu20.04")
    return m.group(1)


def _toolkit_version(site: Site) -> str:
    if site.toolkit.version:
        return toolkit_package_version(site.toolkit.version)
    comp = Catalog.default().get(site.operator.version).components.get("toolkit")
    if not comp or not comp.version:
        raise ConfigError(f"operator {site.operator.version}: the catalog pins no toolkit version",
                          hint="set toolkit.version in the site file")
    return toolkit_package_version(comp.version)


def role_vars(site: Site) -> dict[str, Any]:
    host_toolkit = site.toolkit.mode == "host"  # operator mode: the toolkit container configures the runtime
    nvidia_default = site.cdi.enabled is not True  # with CDI, pods pick the runtime through a RuntimeClass
    trust = bool(site.registry.ca or site.registry.insecure)
    return {
        "gpu_install_action": "deploy",
        "preflight_runtime": site.runtime,
        "preflight_driver_mode": site.driver.mode,
        "docker_runtime_enabled": site.runtime == "docker" and host_toolkit,
        "docker_runtime_default_runtime": "nvidia" if nvidia_default else "",
        "docker_runtime_insecure_registries": [site.registry.host] if site.registry.insecure else [],
        "containerd_runtime_enabled": site.runtime == "containerd" and host_toolkit,
        "containerd_runtime_set_default": nvidia_default,
        "containerd_runtime_registry_config_path": CERTS_D if trust else "",
        "registry_trust_enabled": trust,
        "registry_trust_host": site.registry.host,
        # a path on the controller (load_site made a relative one relative to the site file)
        "registry_trust_ca_src": str(Path(site.registry.ca).expanduser().absolute()) if site.registry.ca else "",
        "registry_trust_insecure": site.registry.insecure,
        "registry_trust_docker_certs_d": DOCKER_CERTS_D if site.runtime == "docker" else "",
        "registry_trust_containerd_config_path": CERTS_D if site.runtime == "containerd" else "",
        # every mode: host installs; operator/precompiled refuse host driver packages; preinstalled checks nvidia-smi
        "nvidia_driver_mode": site.driver.mode,
        "nvidia_driver_reboot": site.driver.rebootPolicy,
        "nvidia_driver_serial": str(site.driver.serial),
        # site driver.version, else the role's default branch (the catalog's driver is the operator's container)
        **({"nvidia_driver_package_version": site.driver.version} if site.driver.version else {}),
        # driver.mode runfile: the .run installer (URL in the site's file mirror or a controller path), its sha256 and
        # the exact version (driver.version, else the one in the file name; the site model checked they agree)
        **({"nvidia_driver_runfile": site.driver.runfile,
            "nvidia_driver_runfile_sha256": site.driver.runfileSha256 or "",
            "nvidia_driver_package_version": site.driver.version or runfile_version(site.driver.runfile or "")}
           if site.driver.mode == "runfile" else {}),
        "nvidia_container_toolkit_enabled": host_toolkit,
        **({"nvidia_container_toolkit_version": _toolkit_version(site)} if host_toolkit else {}),
        # control plane: no extenders -> the role does nothing
        "scheduler_policy_extenders": [e.model_dump(exclude_none=True, exclude_defaults=True) | {"urlPrefix": e.urlPrefix}
                                       for e in site.scheduler.extenders],
        "scheduler_policy_format": site.scheduler.format,
        "scheduler_policy_kubernetes_version": site.scheduler.kubernetesVersion or "",
    }


def scrub_names(site: Site) -> list[str]:
    """Env vars holding the site's credentials: removed from the environment ansible-runner sees."""
    ps = site.registry.pullSecret
    return [n for n in ((ps.usernameEnv, ps.passwordEnv) if ps else ()) if n]


@dataclass
class Options:
    inventory: str
    limit: str | None = None
    tags: str | None = None
    skip_tags: str | None = None
    check: bool = False
    diff: bool = False
    progress: Callable[[str], None] | None = None
    display: Any = None  # installer.progress.Display: the live per-host progress (gets every job event)
    extra: dict[str, Any] | None = None  # variables for tests/labs, merged over role_vars()


def _run(playbook: str, site: Site, opts: Options, tags: bool) -> RunResult:
    ev = role_vars(site) | (opts.extra or {})
    return run_playbook(playbook, opts.inventory, ev, limit=opts.limit, tags=opts.tags if tags else None,
                        skip_tags=opts.skip_tags if tags else None, check=opts.check, diff=opts.diff,
                        progress=opts.progress, scrub_env=scrub_names(site), display=opts.display)


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


def preflight(site: Site, opts: Options) -> RunResult:
    return raise_for(_run("preflight.yml", site, opts, tags=False), preflight=True)


def apply(site: Site, opts: Options) -> tuple[RunResult, RunResult]:
    """Preflight (read-only, always whole) then site.yml; raises on the first stage that does not pass."""
    pre = preflight(site, opts)
    return pre, raise_for(_run("site.yml", site, opts, tags=True), preflight=False)


def run_nodes(playbook: str, site: Site, opts: Options) -> RunResult:
    """One node playbook after preflight (site.yml; uninstall.yml with gpu_install_action=remove in opts.extra),
    --tags/--skip-tags honoured; raises on failed or unreachable hosts."""
    return raise_for(_run(playbook, site, opts, tags=True), preflight=False)
