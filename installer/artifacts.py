"""What an install pulls: computed from the same resolved components and values as the rendered values, never by hand.

Fail closed: an image we cannot resolve (a user-built image without coordinates, a driver tag
without the nodes' OS) is an error, not a warning. installer.plan.Plan.images calls images().
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from installer.catalog import Release
from installer.config import Site
from installer.errors import ConfigError
from installer.facts import Node
from installer.render.values import ResolvedComponent, deployed, destination_ref, destination_repository


@dataclass(frozen=True, order=True)
class Image:
    source: str
    destination: str
    component: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, "destination": self.destination}


def _tags(site: Site, release: Release, nodes: tuple[Node, ...], comp: ResolvedComponent) -> list[str]:
    version = comp.version or ""
    if not comp.spec.os_suffix or version.startswith("sha256:"):
        return [version]
    if not nodes:
        raise ConfigError(
            f"the {comp.name} image tag depends on the nodes' OS ({version}-<osTag>)",
            hint="pass -i inventory (hosts in group gpu_nodes with gpu_install_os) or --os ubuntu22.04",
        )
    precompiled = comp.name == "driver" and site.driver.mode == "precompiled"
    tags: set[str] = set()
    for node in nodes:
        if precompiled:
            if not node.kernel:
                raise ConfigError(
                    f"driver.mode precompiled: kernel of {node.name} unknown; precompiled images are tagged "
                    f"{version}-<kernel>-<osTag>",
                    hint="set gpu_install_kernel in the inventory (or pass --kernel with --os)",
                )
            # the running kernel's image, and one per kernel it boots next (--kernel with an inventory)
            tags.update(f"{version}-{k}-{node.os_tag(release.version)}" for k in node.kernels)
        else:
            tags.add(f"{version}-{node.os_tag(release.version)}")
    return sorted(tags)


def images(site: Site, release: Release, components: Iterable[ResolvedComponent], values: dict[str, Any],
           nodes: tuple[Node, ...]) -> list[Image]:
    """Every image the deployed components pull, source → destination in the private registry."""
    out: dict[str, Image] = {}
    for comp in components:
        if not deployed(values, release, comp):
            continue
        if not comp.repository or not comp.version:
            raise ConfigError(
                f"{comp.name} is enabled but its image is not published upstream (user-built)",
                hint=f"set components.{comp.name}.repository and components.{comp.name}.version in the site file",
            )
        dest_repo = destination_repository(comp.repository, site.registry)
        for tag in _tags(site, release, nodes, comp):
            src = comp.source_ref(tag)
            dst = src.replace(comp.repository, dest_repo, 1)
            out.setdefault(src, Image(src, dst, comp.name))
        if comp.name == "kataManager":  # the OCI artifacts of its runtime classes (kata_runtime_classes rewrites them)
            for rc in release.kata_runtime_classes:
                url = str((rc.get("artifacts") or {}).get("url") or "")
                if url:
                    out.setdefault(url, Image(url, destination_ref(url, site.registry), comp.name))
    return sorted(out.values())
