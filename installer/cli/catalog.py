"""`gpu-install catalog list|show|diff`: the pinned GPU Operator releases."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import command, group, json_arg


def cmd_list(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog

    for rel in Catalog.default().releases():
        print(rel)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog
    from installer.jsonout import CATALOG_SHOW, json_document
    from installer.ui import print_table

    with json_document(args.json, CATALOG_SHOW, "catalog show") as rec:
        rec.doc.update(release=None, nfdChart=None, components=[], platforms=None)
        data = Catalog.default().show_data(args.release, cli=True)
        rec.doc.update(data)
    rows = []
    for comp in data["components"]:
        enabled = {True: "yes", False: "no", None: "-"}[comp["enabled"]]
        suffix = "  (+ -<osTag>)" if comp["osSuffix"] else ""
        rows.append((comp["name"], enabled, ",".join(comp["gates"]) or "-",
                     f"{comp['image'] or '(user supplied)'}{suffix}"))
    print_table(f"GPU Operator {data['release']}  (NFD chart {data['nfdChart']})",
                ["component", "enabled", "also needs", "image"], rows)
    plat = data["platforms"]
    if plat is None:
        print("platforms: not recorded for this release")
        return 0
    ks = plat["kubernetes"]
    works = ", ".join(x for x in (f"≥ {ks['min']}" if ks["min"] else "", f"≤ {ks['max']}" if ks["max"] else "") if x)
    print(f"Kubernetes: runs on {works or 'any'}" + (f" ({ks['reason']})" if ks["reason"] else "")
          + f"; NVIDIA validated {'–'.join(ks['validated']) if ks['validated'] else '-'}"
          + (f"  [{ks['source']}]" if ks["source"] else ""))
    if plat["driverOs"]:
        listed = ", ".join(f"{i} {'/'.join(v)}" for i, v in plat["driverOs"].items())
        print(f"driver images published for: {listed}"
              + (f"  [{plat['driverOsSource']}]" if plat["driverOsSource"] else ""))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog, diff_lines
    from installer.jsonout import CATALOG_DIFF, json_document

    with json_document(args.json, CATALOG_DIFF, "catalog diff") as rec:
        rec.doc.update(releaseFrom=None, releaseTo=None, components=[], defaults=[], valuesKeys=None,
                       kubernetes=None, driverOs=None)
        data = Catalog.default().diff_data(args.a, args.b, cli=True)
        rec.doc.update(data)
    for line in diff_lines(data):
        print(line)
    return 0


def register(sub: Any) -> None:
    csub = group(sub, "catalog", "pinned GPU Operator releases", "catalog_command")
    q = command(csub, "list", "list catalog releases")
    q.set_defaults(func=cmd_list)
    q = command(csub, "show", "show the components and platforms (Kubernetes, driver image OS) of a release")
    q.add_argument("release")
    json_arg(q, "gpu-install.catalog-show/v1")
    q.set_defaults(func=cmd_show)
    q = command(csub, "diff", "what changes from release A to release B: images, defaults, values keys, the "
                              "Kubernetes range and the OS NVIDIA publishes driver images for")
    q.add_argument("a", metavar="A")
    q.add_argument("b", metavar="B")
    json_arg(q, "gpu-install.catalog-diff/v1")
    q.set_defaults(func=cmd_diff)
