"""What we know about a GPU node before touching it, and the driver-tag OS rule (pure functions).

Inventory host variables (set per host or per group, e.g. in group_vars/gpu_nodes.yml) read by installer.plan:
  gpu_install_os_id       os-release ID         (ubuntu, rhel, rocky, centos, debian …)
  gpu_install_os_version  os-release VERSION_ID ("22.04", "9.4", "7")
  gpu_install_os          shorthand for both: ID+VERSION_ID as in driver tags ("ubuntu22.04")
  gpu_install_kernel      `uname -r`, needed for precompiled driver images
  gpu_install_node_name   the Kubernetes Node name when it differs from the inventory host name
GPU nodes are the hosts of the inventory group `gpu_nodes`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from installer.catalog import parse_release
from installer.errors import ConfigError

GPU_GROUP = "gpu_nodes"
CONTROL_PLANE_GROUP = "kube_control_plane"
NODE_NAME_VAR = "gpu_install_node_name"
_OSTAG = re.compile(r"^([a-z][a-z-]*?)-?(\d[\w.\-]*)\Z")
_KERNEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}\Z")  # `uname -r`: it becomes part of an image tag


def kernel_release(value: object, where: str) -> str:
    text = str(value)
    if not _KERNEL.match(text):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ConfigError(f"{where}: {shown!r} is not a kernel release (what `uname -r` prints)",
                          hint="e.g. 5.15.0-105-generic or 5.14.0-427.el9.x86_64")
    return text
_V26_3 = parse_release("v26.3.0")
_V26_7 = parse_release("v26.7.0")


@dataclass(frozen=True)
class Node:
    name: str  # inventory host name
    os_id: str | None  # None: the inventory does not say (only what needs it fails: the driver image tags)
    os_version: str | None
    kernel: str | None = None
    k8s_name: str | None = None  # the Kubernetes Node (gpu_install_node_name), default: name
    # the inventory's settings of the package roles' variables for this host (nvidia_driver_*,
    # nvidia_container_toolkit_*): what the roles install there, as installer.mirror reads it
    role_vars: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    mig_dynamic: bool = True  # gpu_install_mig_dynamic: false leaves the node out of mig.dynamic nos


    @property
    def node_name(self) -> str:
        return self.k8s_name or self.name

    def os_tag(self, release: str) -> str:
        if self.os_id is None or self.os_version is None:
            raise ConfigError(
                f"host {self.name}: OS unknown (gpu_install_os is not set)",
                hint="set gpu_install_os (e.g. ubuntu22.04) or gpu_install_os_id + gpu_install_os_version "
                "for the host or its group",
            )
        return os_tag(self.os_id, self.os_version, release)


def os_tag(os_id: str, version: str, release: str) -> str:
    """Driver image OS suffix for a node, following the operator's rule for that release.

    ≤ v25.10.x: ID+VERSION_ID verbatim (ubuntu22.04, rhel9.4, centos7).
    v26.3.x:    rocky → major only; rhel with major ≥ 10 → major only.
    ≥ v26.7.0:  rhel, rocky, ol → major only (rhel9, rocky9, ol9).
    """
    os_id, version = os_id.lower(), str(version)
    major = version.split(".")[0]
    rel = parse_release(release)
    if rel is not None and _V26_7 is not None and rel >= _V26_7 and os_id in ("rhel", "rocky", "ol"):
        return f"{os_id}{major}"
    if rel is not None and _V26_3 is not None and _V26_7 is not None and _V26_3 <= rel < _V26_7:
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


def flag_nodes(os_tags: list[str] | tuple[str, ...], kernels: list[str] | tuple[str, ...]) -> list[Node]:
    """Synthetic nodes from --os/--kernel flags (commands used without an inventory)."""
    if kernels and not os_tags:
        raise ConfigError("--kernel needs --os", hint="e.g. --os ubuntu22.04 --kernel 5.15.0-105-generic")
    nodes = []
    for i, tag in enumerate(os_tags):
        os_id, ver = split_os(tag, "--os")
        for j, kernel in enumerate(kernels or [None]):
            nodes.append(Node(f"os{i}-k{j}", os_id, ver, kernel_release(kernel, "--kernel") if kernel else None))
    return nodes


def node_from_vars(name: str, hv: Mapping[str, Any]) -> Node:
    """A GPU node from its inventory variables (its OS may be unknown: see Node.os_tag)."""
    where = f"host {name}"
    kernel = hv.get("gpu_install_kernel")
    os_id: str | None = None
    ver: str | None = None
    if hv.get("gpu_install_os_id") and hv.get("gpu_install_os_version") is not None:
        raw = hv["gpu_install_os_version"]
        if isinstance(raw, float):  # YAML made 20.10 into 20.1: never guess
            raise ConfigError(f"{where}: gpu_install_os_version is a YAML number ({raw!r}), which drops trailing zeros",
                              hint="quote it in the inventory, e.g. gpu_install_os_version: \"20.10\"")
        os_id, ver = str(hv["gpu_install_os_id"]).lower(), str(raw)
    elif hv.get("gpu_install_os"):
        os_id, ver = split_os(str(hv["gpu_install_os"]), f"{where}: gpu_install_os")
    k8s = hv.get(NODE_NAME_VAR)
    kernel_text = kernel_release(kernel, f"{where}: gpu_install_kernel") if kernel else None
    overrides = {str(k): _plain(v) for k, v in hv.items() if str(k).startswith(PACKAGE_ROLE_PREFIXES)}
    dynamic = hv.get(MIG_DYNAMIC_VAR, True)
    if not isinstance(dynamic, bool):
        raise ConfigError(f"{where}: {MIG_DYNAMIC_VAR} must be true or false, not {dynamic!r}",
                          hint=f"{MIG_DYNAMIC_VAR}: false leaves the node out of mig.dynamic nos")
    return Node(name, os_id, ver, kernel_text, str(k8s) if k8s else None, overrides, dynamic)


#: host var: false leaves a GPU node out of mig.dynamic nos (whole GPUs there, no MIG mode, no nos label)
MIG_DYNAMIC_VAR = "gpu_install_mig_dynamic"


#: the roles whose packages depend on inventory variables too (see Node.role_vars)
PACKAGE_ROLE_PREFIXES = ("nvidia_driver_", "nvidia_container_toolkit_")


def _plain(value: Any) -> Any:
    """An inventory value as plain Python (Ansible's string and container subclasses → str, list, dict)."""
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)
