"""What we know about a GPU node before touching it, and the driver-tag OS rule (pure functions).

Inventory host variables (set per host or per group, e.g. in group_vars/gpu_nodes.yml) read by installer.plan:
  gpu_install_os_id       os-release ID         (ubuntu, rhel, rocky, centos, debian …)
  gpu_install_os_version  os-release VERSION_ID ("22.04", "9.4", "7")
  gpu_install_os          shorthand for both: ID+VERSION_ID as in driver tags ("ubuntu22.04")
  gpu_install_kernel      `uname -r` of the kernel the node runs: the precompiled driver image tag (driver.mode
                          precompiled) and the kernel headers the mirror plan lists for DKMS (driver.mode host,
                          runfile); the roles themselves read the running kernel on the node
  gpu_install_node_name   the Kubernetes Node name when it differs from the inventory host name
GPU nodes are the hosts of the inventory group `gpu_nodes`.

`--kernel [OSTAG=]KERNEL` (render, images, mirror): without an inventory the kernel of the --os nodes, with one the
kernel the nodes of that OS boot next (Node.next_kernels: its headers and precompiled image are carried too). A
kernel belongs to one OS: unqualified, it is refused when the nodes run several (kernels_by_os).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
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
    # with an inventory: the kernels the node boots next (--kernel [OSTAG=]KERNEL), besides the running one
    next_kernels: tuple[str, ...] = ()
    arch: str | None = None  # `uname -m` (x86_64, aarch64): gpu_install_arch, else the facts file; None: unknown
    nvswitch: bool | None = None  # NVSwitches on its PCI bus: gpu_install_nvswitch, else the facts file
    gpu_architectures: tuple[str, ...] = ()  # its GPUs' architectures (Hopper, Blackwell …), from the facts file
    facts_from: str | None = None  # "facts file PATH (read at T)" when the facts file gave any of the above

    @property
    def node_name(self) -> str:
        return self.k8s_name or self.name

    @property
    def os_name(self) -> str | None:
        """ID+VERSION_ID as --os and gpu_install_os give it (ubuntu22.04, rhel8.10); None: unknown."""
        return f"{self.os_id}{self.os_version}" if self.os_id is not None and self.os_version is not None else None

    @property
    def kernels(self) -> tuple[str, ...]:
        """The running kernel (when known), then the kernels it boots next."""
        return tuple(dict.fromkeys([*([self.kernel] if self.kernel else []), *self.next_kernels]))

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


KERNEL_FORM = "OSTAG=KERNEL"


def parse_kernel(value: str, where: str = "--kernel") -> tuple[str | None, str]:
    """A --kernel value: KERNEL or OSTAG=KERNEL → (the OS as ID+VERSION_ID or None, the kernel release)."""
    os_part, eq, kernel = str(value).rpartition("=")
    if not eq:
        return None, kernel_release(value, where)
    os_id, ver = split_os(os_part, f"{where} {value.strip()}")
    return f"{os_id}{ver}", kernel_release(kernel, where)


def kernels_by_os(values: Sequence[str], os_names: Sequence[str], nodes: str, where: str = "--kernel") -> dict[str, list[str]]:
    """Which OS each --kernel belongs to: OSTAG=KERNEL to that OS (one of os_names, the nodes' OSes), an unqualified
    KERNEL to the only OS; with several OSes an unqualified kernel is refused (a kernel release is one distro's).
    nodes: how the message names where os_names come from (e.g. "--os", "the inventory's GPU nodes")."""
    names = list(dict.fromkeys(os_names))
    out: dict[str, list[str]] = {n: [] for n in names}
    for value in values:
        os_name, kernel = parse_kernel(value, where)
        if os_name is None:
            if len(names) > 1:
                raise ConfigError(
                    f"{where} {kernel}: {nodes} run {len(names)} OSes ({', '.join(names)}) and a kernel release "
                    "belongs to one of them",
                    hint=f"name its OS: {where} <os>={kernel}, <os> one of {', '.join(names)} ({KERNEL_FORM}, e.g. "
                         f"rhel8.10=4.18.0-553.el8_10.x86_64; one {where} per kernel and OS)")
            os_name = names[0] if names else None
            if os_name is None:
                continue  # no OS known at all: the caller gives it to every node
        elif os_name not in out:
            raise ConfigError(f"{where} {os_name}={kernel}: {nodes} run no {os_name} (their OSes: "
                              f"{', '.join(names) or 'none known'})",
                              hint=f"qualify the kernel with one of those OSes ({KERNEL_FORM}), or leave it out")
        if kernel not in out[os_name]:
            out[os_name].append(kernel)
    return out


def flag_nodes(os_tags: list[str] | tuple[str, ...], kernels: list[str] | tuple[str, ...]) -> list[Node]:
    """Synthetic nodes from --os/--kernel flags (commands used without an inventory): one per OS and kernel of it
    (--kernel OSTAG=KERNEL, or an unqualified KERNEL with a single --os)."""
    if kernels and not os_tags:
        raise ConfigError("--kernel needs --os", hint="e.g. --os ubuntu22.04 --kernel 5.15.0-105-generic")
    oses = list(dict.fromkeys(split_os(tag, "--os") for tag in os_tags))
    by_os = kernels_by_os(kernels, [f"{i}{v}" for i, v in oses], "the --os nodes")
    nodes = []
    for i, (os_id, ver) in enumerate(oses):
        for j, kernel in enumerate(by_os[f"{os_id}{ver}"] or [None]):
            nodes.append(Node(f"os{i}-k{j}", os_id, ver, kernel))
    return nodes


def with_next_kernels(nodes: Sequence[Node], kernels: Sequence[str]) -> tuple[Node, ...]:
    """The inventory's GPU nodes with --kernel's kernels as the kernels they boot next, each to the nodes of its OS
    (unqualified: of the one OS the nodes run, refused when they run several; every node when no OS is known)."""
    if not kernels:
        return tuple(nodes)
    names = sorted({n.os_name for n in nodes if n.os_name})
    by_os = kernels_by_os(kernels, names, "the inventory's GPU nodes")
    every = [] if names else [parse_kernel(k)[1] for k in kernels]  # no OS known: one list for all
    return tuple(replace(n, next_kernels=tuple(dict.fromkeys(
        [*n.next_kernels, *(k for k in by_os.get(n.os_name or "", every) if k != n.kernel)]))) for n in nodes)


def node_from_vars(name: str, hv: Mapping[str, Any]) -> Node:
    """A GPU node from its inventory variables (its OS may be unknown: see Node.os_tag)."""
    where = f"host {name}"
    removed = removed_vars()
    for var in sorted(set(removed) & {str(k) for k in hv}):
        raise ConfigError(f"inventory: {where}: variable '{var}' was removed; {removed[var]}", hint=INVENTORY_HINT)
    kernel = hv.get("gpu_install_kernel")
    os_id: str | None = None
    ver: str | None = None
    if hv.get("gpu_install_os_id") and hv.get("gpu_install_os_version") is not None:
        raw = hv["gpu_install_os_version"]
        if isinstance(raw, float):  # YAML made 20.10 into 20.1: never guess
            raise ConfigError(f"{where}: gpu_install_os_version is a YAML number ({raw!r}), which drops trailing zeros",
                              hint="quote it in the inventory, e.g. gpu_install_os_version: \"20.10\"")
        os_id, ver = str(hv["gpu_install_os_id"]).lower(), str(raw)
    elif hv.get("gpu_install_os") is not None:
        if not isinstance(hv["gpu_install_os"], str):  # as playbooks/tasks/validate_inventory.yml says it
            raise ConfigError(f"inventory: {where}: gpu_install_os must be a string like ubuntu22.04",
                              hint=INVENTORY_HINT)
        os_id, ver = split_os(str(hv["gpu_install_os"]), f"{where}: gpu_install_os")
    k8s = hv.get(NODE_NAME_VAR)
    kernel_text = kernel_release(kernel, f"{where}: gpu_install_kernel") if kernel else None
    overrides = {str(k): _plain(v) for k, v in hv.items() if str(k).startswith(PACKAGE_ROLE_PREFIXES)}
    dynamic = hv.get(MIG_DYNAMIC_VAR, True)
    if not isinstance(dynamic, bool):
        raise ConfigError(f"{where}: {MIG_DYNAMIC_VAR} must be true or false, not {dynamic!r}",
                          hint=f"{MIG_DYNAMIC_VAR}: false leaves the node out of mig.dynamic nos")
    arch = hv.get(ARCH_VAR)
    if arch is not None and arch not in ARCHES:
        raise ConfigError(f"inventory: {where}: {ARCH_VAR} is {arch!r}, not one of {', '.join(ARCHES)}",
                          hint="write it as `uname -m` prints it on the node (x86_64 for amd64, aarch64 for arm64), "
                               "or drop it and give --facts FILE from `gpu-install nodes facts`")
    nvswitch = hv.get(NVSWITCH_VAR)
    if nvswitch is not None and not isinstance(nvswitch, bool):
        raise ConfigError(f"inventory: {where}: {NVSWITCH_VAR} must be true or false, not {nvswitch!r}",
                          hint="true: the node has NVIDIA NVSwitches (HGX boards); or drop it and give --facts FILE")
    return Node(name, os_id, ver, kernel_text, str(k8s) if k8s else None, overrides, dynamic,
                arch=arch, nvswitch=nvswitch)


#: the node's architecture as the inventory may give it (`uname -m`), and whether it has NVSwitches
ARCH_VAR = "gpu_install_arch"
NVSWITCH_VAR = "gpu_install_nvswitch"
ARCHES = ("x86_64", "aarch64")


def with_facts(nodes: Sequence[Node], facts: Mapping[str, Any], source: str) -> tuple[Node, ...]:
    """The inventory's GPU nodes completed from a facts file (installer.node_facts.read_file: host -> FileFacts):
    what the inventory leaves unset (OS, running kernel, architecture, NVSwitch) is taken from the file, the GPUs'
    architectures always, and the other kernels installed on the node become kernels it boots next. A value the
    inventory gives that the file contradicts is refused (exit 2): the bundle would be built for a node that does not
    exist. A host the file does not hold keeps what the inventory says."""
    out = []
    for n in nodes:
        ff = facts.get(n.name)
        if ff is None:
            out.append(n)
            continue
        f = ff.facts
        where = f"{source} (read {ff.read_at})" if ff.read_at else source
        got_os = f.os_name
        nvs = bool(f.nvswitches)
        for var, given, found in (("gpu_install_os", n.os_name, got_os), ("gpu_install_kernel", n.kernel, f.kernel),
                                  (ARCH_VAR, n.arch, f.arch), (NVSWITCH_VAR, n.nvswitch, nvs)):
            if given is not None and found is not None and given != found:
                raise ConfigError(
                    f"host {n.name}: {var} is {_shown(given)} in the inventory, and the node had {_shown(found)} "
                    f"when it was read ({where})",
                    hint=f"correct {var} in the inventory (or drop it: the facts give it), or read the node again "
                         "with `gpu-install nodes facts` if it changed since")
        os_id, os_version = (n.os_id, n.os_version) if n.os_name else (f.os_id, f.os_version)
        kernel = n.kernel or f.kernel
        nxt = tuple(dict.fromkeys([*n.next_kernels, *(k for k in f.kernels_installed if k != kernel)]))
        out.append(replace(n, os_id=os_id, os_version=os_version, kernel=kernel, next_kernels=nxt,
                           arch=n.arch or f.arch, nvswitch=n.nvswitch if n.nvswitch is not None else nvs,
                           gpu_architectures=tuple(sorted({g.architecture for g in f.gpus if g.architecture})),
                           facts_from=where))
    return tuple(out)


def facts_nodes(facts: Mapping[str, Any], source: str) -> tuple[Node, ...]:
    """The GPU nodes of a facts file alone (no inventory): every host that was read, as it was read."""
    return with_facts([Node(host, None, None) for host in sorted(facts)], facts, source)


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


#: the hint of an inventory error found without contacting a host (the playbooks' "Inventory |" checks say the same)
INVENTORY_HINT = "fix the inventory; nothing was changed on any host"


@lru_cache(maxsize=1)
def removed_vars() -> dict[str, str]:
    """Inventory variables that were removed -> what to set instead: read from playbooks/tasks/validate_inventory.yml
    (the playbooks check the same list on their own, when run without gpu-install)."""
    import yaml

    from installer import content

    tasks = yaml.safe_load((content.playbooks_dir() / "tasks" / "validate_inventory.yml").read_text()) or []
    for task in tasks:
        found = (task.get("vars") or {}).get("gpu_install_removed_vars") if isinstance(task, dict) else None
        if isinstance(found, dict):
            return {str(k): str(v) for k, v in found.items()}
    raise ConfigError("playbooks/tasks/validate_inventory.yml: no gpu_install_removed_vars in it",
                      hint="reinstall gpu-install: its shipped playbooks are damaged")


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
