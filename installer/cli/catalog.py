"""`gpu-install catalog list|show|diff`: the pinned GPU Operator releases."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import command, group


def cmd_list(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog

    for rel in Catalog.default().releases():
        print(rel)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from installer import platforms
    from installer.catalog import Catalog
    from installer.ui import print_table

    rel = Catalog.default().get(args.release)
    rows = []
    for comp in rel.components.values():
        enabled = {True: "yes", False: "no", None: "-"}[comp.enabled]
        gates = ",".join(g.removesuffix(".enabled") for g in comp.gates) or "-"
        suffix = "  (+ -<osTag>)" if comp.os_suffix else ""
        rows.append((comp.name, enabled, gates, f"{comp.image_ref or '(user supplied)'}{suffix}"))
    print_table(f"GPU Operator {rel.version}  (NFD chart {rel.nfd_chart_version})",
                ["component", "enabled", "also needs", "image"], rows)
    s = platforms.series(rel.version, rel.catalog_dir)
    if s is None:
        print("platforms: not recorded for this release")
        return 0
    ks = s.kube
    print(f"Kubernetes: runs on {ks.works_text()}" + (f" ({ks.reason})" if ks.reason else "")
          + f"; NVIDIA validated {ks.validated_text()}" + (f"  [{ks.source}]" if ks.source else ""))
    if s.driver_os:
        listed = ", ".join(f"{i} {'/'.join(v)}" for i, v in sorted(s.driver_os.items()))
        print(f"driver images published for: {listed}" + (f"  [{s.driver_os_source}]" if s.driver_os_source else ""))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog

    for line in Catalog.default().diff(args.a, args.b):
        print(line)
    return 0


def register(sub: Any) -> None:
    csub = group(sub, "catalog", "pinned GPU Operator releases", "catalog_command")
    q = command(csub, "list", "list catalog releases")
    q.set_defaults(func=cmd_list)
    q = command(csub, "show", "show the components of a release")
    q.add_argument("release")
    q.set_defaults(func=cmd_show)
    q = command(csub, "diff", "what changes between two releases")
    q.add_argument("a")
    q.add_argument("b")
    q.set_defaults(func=cmd_diff)
