"""What an install pulls: computed from the same Plan as the rendered values, never by hand.

Fail closed: an image we cannot resolve (a user-built image without coordinates, a driver tag
without the nodes' OS) is an error, not a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from installer.config import Site
from installer.errors import ConfigError
from installer.facts import Node
from installer.render.values import Plan, ResolvedComponent, destination_repository, plan


@dataclass(frozen=True, order=True)
class Image:
    source: str
    destination: str
    component: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, "destination": self.destination}


def _tags(p: Plan, comp: ResolvedComponent) -> list[str]:
    version = comp.version or ""
    if not comp.spec.os_suffix or version.startswith("sha256:"):
        return [version]
    if not p.nodes:
        raise ConfigError(
            f"the {comp.name} image tag depends on the nodes' OS ({version}-<osTag>)",
            hint="pass -i inventory (hosts in group gpu_nodes with gpu_install_os) or --os ubuntu22.04",
        )
    release = p.release.version
    precompiled = comp.name == "driver" and p.site.driver.mode == "precompiled"
    tags = set()
    for node in p.nodes:
        if precompiled:
            if not node.kernel:
                raise ConfigError(
                    f"driver.mode precompiled: kernel of {node.name} unknown; precompiled images are tagged "
                    f"{version}-<kernel>-<osTag>",
                    hint="set gpu_install_kernel in the inventory (or pass --kernel with --os)",
                )
            tags.add(f"{version}-{node.kernel}-{node.os_tag(release)}")
        else:
            tags.add(f"{version}-{node.os_tag(release)}")
    return sorted(tags)


def images_for(p: Plan) -> list[Image]:
    out: dict[str, Image] = {}
    for comp in p.components.values():
        if not p.deployed(comp):
            continue
        if not comp.repository or not comp.version:
            raise ConfigError(
                f"{comp.name} is enabled but its image is not published upstream (user-built)",
                hint=f"set components.{comp.name}.repository and components.{comp.name}.version in the site file",
            )
        dest_repo = destination_repository(comp.repository, p.site.registry)
        for tag in _tags(p, comp):
            src = comp.source_ref(tag)
            dst = src.replace(comp.repository, dest_repo, 1)
            out.setdefault(src, Image(src, dst, comp.name))
    return sorted(out.values())


def image_list(site: Site, nodes: list[Node] | None = None) -> list[Image]:
    return images_for(plan(site, nodes))
