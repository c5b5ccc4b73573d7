"""What we know about the GPU nodes before touching them: OS and kernel, from the inventory or flags.

Inventory host variables (set per host or per group, e.g. in group_vars/gpu_nodes.yml):
  gpu_install_os_id       os-release ID         (ubuntu, rhel, rocky, centos, debian …)
  gpu_install_os_version  os-release VERSION_ID ("22.04", "9.4", "7")
  gpu_install_os          shorthand for both: ID+VERSION_ID as in driver tags ("ubuntu22.04")
  gpu_install_kernel      `uname -r`, needed for precompiled driver images
GPU nodes are the hosts of the inventory group `gpu_nodes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from installer.catalog import parse_release
from installer.errors import ConfigError

GPU_GROUP = "gpu_nodes"
SITE_FILE_PATTERN = r"(^|/)site\.ya?ml$"
_OSTAG = re.compile(r"^([a-z][a-z-]*?)-?(\d[\w.\-]*)$")


@dataclass(frozen=True)
class Node:
    name: str
    os_id: str
    os_version: str
    kernel: str | None = None

    def os_tag(self, release: str) -> str:
        return os_tag(self.os_id, self.os_version, release)


def os_tag(os_id: str, version: str, release: str) -> str:
    """Driver image OS suffix for a node, following the operator's rule for that release.

    ≤ v25.10.x: ID+VERSION_ID verbatim (ubuntu22.04, rhel9.4, centos7).
    v26.3.x:    rocky → major only; rhel with major ≥ 10 → major only.
    ≥ v26.7.0:  rhel, rocky, ol → major only (rhel9, rocky9, ol9).
    """
    os_id, version = os_id.lower(), str(version)
    major = version.split(".")[0]
    rel = parse_release(release) or (0, 0, 0)
    if rel >= (26, 7, 0) and os_id in ("rhel", "rocky", "ol"):
        return f"{os_id}{major}"
    if (26, 3, 0) <= rel < (26, 7, 0):
        if os_id == "rocky" or (os_id == "rhel" and major.isdigit() and int(major) >= 10):
            return f"{os_id}{major}"
    return f"{os_id}{version}"


def split_os(value: str, where: str) -> tuple[str, str]:
    m = _OSTAG.match(value.strip().lower())
    if not m:
        raise ConfigError(
            f"{where}: {value!r} is not an OS tag (ID followed by VERSION_ID)",
            hint="e.g. ubuntu22.04, rhel9.4, rocky9.5, centos7",
        )
    return m[1], m[2]


def node_facts(inventory: str | None, os_tags: list[str] | None = None, kernels: list[str] | None = None) -> list[Node]:
    """Nodes from an Ansible inventory, or synthetic nodes from --os/--kernel flags."""
    if inventory:
        if os_tags or kernels:
            raise ConfigError("--os/--kernel are for use without an inventory", hint="set gpu_install_os / gpu_install_kernel in the inventory instead")
        return inventory_nodes(inventory)
    nodes = []
    kernels = kernels or []
    for i, tag in enumerate(os_tags or []):
        os_id, ver = split_os(tag, "--os")
        for j, kernel in enumerate(kernels or [None]):
            nodes.append(Node(f"os{i}-k{j}", os_id, ver, kernel))
    if kernels and not os_tags:
        raise ConfigError("--kernel needs --os", hint="e.g. --os ubuntu22.04 --kernel 5.15.0-105-generic")
    return nodes


def inventory_nodes(inventory: str) -> list[Node]:
    return [_node_from_vars(name, hv) for name, hv in gpu_host_vars(inventory)]


def gpu_host_vars(inventory: str) -> list[tuple[str, dict]]:
    """(host, its variables) for each host of group gpu_nodes, by name."""
    path = Path(inventory)
    if not path.exists():
        raise ConfigError(f"inventory {inventory} not found", hint="pass -i with an inventory file or directory")
    import os
    import warnings

    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")
    # An inventory directory may hold the site file next to hosts.yml: not an inventory source.
    os.environ.setdefault("ANSIBLE_INVENTORY_IGNORE_REGEX", SITE_FILE_PATTERN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        inv = InventoryManager(loader=loader, sources=[str(path)])
    except Exception as exc:  # ansible raises AnsibleError subclasses with a message
        raise ConfigError(f"inventory {inventory}: {exc}") from None
    if GPU_GROUP not in inv.groups:
        raise ConfigError(
            f"inventory {inventory}: no group '{GPU_GROUP}'",
            hint=f"put the GPU nodes in a group named {GPU_GROUP} (see inventories/sample/hosts.yml)",
        )
    vm = VariableManager(loader=loader, inventory=inv)
    hosts = [(host.name, vm.get_vars(host=host)) for host in sorted(inv.groups[GPU_GROUP].get_hosts(),
                                                                    key=lambda h: h.name)]
    if not hosts:
        raise ConfigError(f"inventory {inventory}: group '{GPU_GROUP}' has no hosts")
    return hosts


def _node_from_vars(name: str, hv: dict) -> Node:
    where = f"host {name}"
    kernel = hv.get("gpu_install_kernel")
    if hv.get("gpu_install_os_id") and hv.get("gpu_install_os_version") is not None:
        os_id, ver = str(hv["gpu_install_os_id"]).lower(), str(hv["gpu_install_os_version"])
    elif hv.get("gpu_install_os"):
        os_id, ver = split_os(str(hv["gpu_install_os"]), f"{where}: gpu_install_os")
    else:
        raise ConfigError(
            f"{where}: OS unknown (gpu_install_os is not set)",
            hint="set gpu_install_os (e.g. ubuntu22.04) or gpu_install_os_id + gpu_install_os_version "
            "for the host or its group",
        )
    return Node(name, os_id, ver, str(kernel) if kernel else None)
