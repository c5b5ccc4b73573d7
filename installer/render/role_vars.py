"""Site → the variables the Ansible roles get (pure). installer.plan.resolve calls role_vars() once per command;
tests/unit/test_ansible_apply.py keeps every variable declared in the roles' meta/argument_specs.yml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from installer.catalog import Release
from installer.config import Site, runfile_version
from installer.errors import ConfigError

CERTS_D = "/etc/containerd/certs.d"
DOCKER_CERTS_D = "/etc/docker/certs.d"


_PKG_VERSION = re.compile(r"^v?(\d+(?:\.\d+)+(?:-\d[0-9A-Za-z.+~]*)?)(?:-[A-Za-z][0-9A-Za-z.+~-]*)?\Z")


def toolkit_package_version(tag: str) -> str:
    """The toolkit's package version from an image tag or version: v1.17.4-ubuntu20.04 -> 1.17.4, v1.18.0 -> 1.18.0,
    1.17.4-1 (a package revision) stays."""
    m = _PKG_VERSION.match(tag.strip())
    if not m:
        raise ConfigError(f"toolkit.version {tag!r} is not a toolkit version",
                          hint="use the toolkit release, e.g. 1.17.4 or v1.17.4-ubuntu20.04")
    return m.group(1)


def _toolkit_version(site: Site, release: Release) -> str:
    if site.toolkit.version:
        return toolkit_package_version(site.toolkit.version)
    comp = release.components.get("toolkit")
    if not comp or not comp.version:
        raise ConfigError(f"operator {site.operator.version}: the catalog pins no toolkit version",
                          hint="set toolkit.version in the site file")
    return toolkit_package_version(comp.version)


def role_vars(site: Site, release: Release) -> dict[str, Any]:
    """The variables Python hands to the roles (each declared in a role's meta/argument_specs.yml)."""
    from installer import features

    host_toolkit = site.toolkit.mode == "host"  # operator mode: the toolkit container configures the runtime
    # with CDI, pods pick the runtime through a RuntimeClass; a feature may need plain runc as the default (its
    # default_runtime; one needing nvidia refuses CDI on in its conflicts)
    nvidia_default = site.cdi.enabled is not True and features.default_runtime(site) != "runc"
    trust = bool(site.registry.ca or site.registry.insecure)
    return {
        "gpu_install_action": "deploy",
        "preflight_runtime": site.runtime,
        "preflight_driver_mode": site.driver.mode,
        "preflight_sharing_mode": site.sharing.mode,
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
        "registry_trust_restart_containerd": site.runtime == "containerd",
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
        # the site's signed package repository (mirror push --repo-dir) wherever the roles install packages
        "package_repo_enabled": bool(site.packages.url) and (host_toolkit or site.driver.mode in ("host", "runfile")),
        "package_repo_url": site.packages.url or "",
        "package_repo_key_src": str(Path(site.packages.key).expanduser().absolute()) if site.packages.key else "",
        "nvidia_container_toolkit_enabled": host_toolkit,
        **({"nvidia_container_toolkit_version": _toolkit_version(site, release)} if host_toolkit else {}),
        # the features' own (e.g. the mig_mode role's, for dynamic MIG)
        **features.role_vars(site),
        # control plane: no extenders -> the role does nothing; the site's, then the active features'
        "scheduler_policy_extenders": [e.model_dump(exclude_none=True, exclude_defaults=True) | {"urlPrefix": e.urlPrefix}
                                       for e in features.extenders(site)],
        "scheduler_policy_format": site.scheduler.format,
        "scheduler_policy_kubernetes_version": site.scheduler.kubernetesVersion or "",
    }
