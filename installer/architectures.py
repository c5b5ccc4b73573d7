"""CPU architectures of the GPU nodes (installer.facts.Node.arch: `uname -m`, from gpu_install_arch or a facts file):
which image platform the mirror copies, and what is refused because it cannot exist or is not supported yet on
aarch64 (Grace Hopper / Grace Blackwell nodes) -- never an x86 artifact for an arm64 node.

Facts (../shared/upstream/driver-facts.md, "Architectures"): GPU Operator images are multi-arch indexes; precompiled
driver containers are x86-64 only; runfiles are per architecture (NVIDIA-Linux-aarch64-<version>.run); NVIDIA's
repositories name aarch64 server `sbsa`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from installer.errors import ConfigError

if TYPE_CHECKING:
    from installer.config import Site
    from installer.facts import Node
    from installer.mirror.plan import OsPackages

#: `uname -m` -> the OCI platform of the images a node of that architecture runs
PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
#: `uname -m` -> the architecture in NVIDIA's repository paths (CUDA repositories: x86_64, sbsa) and runfile names
NVIDIA_REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
RUNFILE_ARCH = {"x86_64": "x86_64", "aarch64": "aarch64"}
ALL_PLATFORMS = "all"  # installer.mirror.common.ALL_PLATFORMS (kept equal; this module sits below the mirror)
HOW = "gpu_install_arch in the inventory, or --facts FILE from `gpu-install nodes facts`"


def node_arches(nodes: Sequence[Node]) -> dict[str, list[str]]:
    """Known architecture -> the nodes of it (nodes whose architecture is unknown are not listed)."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        if n.arch:
            out.setdefault(n.arch, []).append(n.name)
    return out


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check(site: Site, nodes: Sequence[Node]) -> None:
    """What the site asks that cannot exist on its aarch64 nodes: ConfigError (exit 2) naming the nodes and the fix."""
    arm = [n.name for n in nodes if n.arch == "aarch64"]
    if not arm:
        return
    mode = site.driver.mode
    if mode == "precompiled":
        raise ConfigError(f"driver.mode precompiled: NVIDIA publishes precompiled driver images for x86_64 only, and "
                          f"node(s) {_some(arm)} are aarch64",
                          hint="use driver.mode operator (the driver container builds the module on the node) for "
                               "those nodes, or a separate site for the x86_64 nodes")
    if mode == "runfile" and site.driver.runfile:
        name = site.driver.runfile.rsplit("/", 1)[-1]
        m = re.match(r"NVIDIA-Linux-([A-Za-z0-9_]+)-", name)
        if m and m.group(1) != RUNFILE_ARCH["aarch64"]:
            raise ConfigError(f"driver.runfile {name} is the {m.group(1)} runfile, and node(s) {_some(arm)} are "
                              "aarch64: a runfile per architecture is not supported yet",
                              hint="put the aarch64 nodes in a site of their own with NVIDIA-Linux-aarch64-<version>.run, "
                                   "or use driver.mode operator for them")


def check_packages(nodes: Sequence[Node], packages: Sequence[OsPackages]) -> None:
    """OS packages are resolved for x86_64 only (yet): refuse listing or pulling them for an aarch64 node (`mirror
    plan`, `mirror pull` without --skip-packages; images alone, `mirror sync`, are not concerned)."""
    for os_packages in packages:
        hosts = set(os_packages.hosts)
        arm = [n.name for n in nodes if n.arch == "aarch64" and n.os_name == os_packages.os
               and (n.name in hosts or not hosts)]
        if not arm:
            continue
        raise ConfigError(f"{os_packages.os} packages: OS packages for aarch64 nodes ({_some(arm)}) are not resolved "
                          "yet (the mirror "
                          "resolves x86_64 packages; NVIDIA's repositories name aarch64 server 'sbsa')",
                          hint="for those nodes use driver.mode operator with the site's own OS mirror (packages."
                               "osMirror), or keep them out of this inventory's gpu_nodes")


def platform_for(nodes: Sequence[Node], given: str | None, all_platforms: bool) -> tuple[str, str | None]:
    """The platform `mirror pull`/`sync` copy multi-arch images for, and a note worth printing (or None).
    given: --platform; all_platforms: --all-platforms. Nodes of one known architecture: its platform; of several:
    every platform (indexes kept whole). A --platform that leaves a node without its images is refused (exit 2)."""
    if all_platforms:
        return ALL_PLATFORMS, None
    arches = node_arches(nodes)
    wanted = {PLATFORMS.get(a, f"linux/{a}"): names for a, names in arches.items()}
    if given is not None:
        missing = {p: names for p, names in wanted.items() if p != given}
        if missing:
            p, names = next(iter(missing.items()))
            raise ConfigError(f"--platform {given}: node(s) {_some(names)} run {p} images; they would get images "
                              "they cannot run",
                              hint=("drop --platform (the nodes' architectures choose it)" if len(wanted) == 1
                                    else "pass --all-platforms: the nodes run several architectures"))
        return given, None
    if not wanted:
        return PLATFORMS["x86_64"], (f"the nodes' architecture is not known: images are copied for linux/amd64 "
                                     f"(give {HOW})") if nodes else None
    if len(wanted) == 1:
        return next(iter(wanted)), None
    return ALL_PLATFORMS, (f"the nodes run {len(wanted)} architectures ({', '.join(sorted(wanted))}): multi-arch "
                           "images are copied whole (every platform)")
