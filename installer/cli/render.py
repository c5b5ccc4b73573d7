"""`gpu-install render`, `images` and `config schema|sample|check`: what the tool makes of a site file."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import (
    command,
    facts_arg,
    group,
    inventory_arg,
    kube_version_arg,
    node_flags,
    output,
    output_arg,
    resolve_plan,
    site_args,
)


def cmd_render(args: argparse.Namespace) -> int:
    from installer.render.values import values_to_yaml

    plan = resolve_plan(args)
    output(values_to_yaml(plan.values, plan.site), args.output)
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    import json

    plan = resolve_plan(args)
    if args.format == "json":
        text = json.dumps([i.as_dict() for i in plan.images], indent=2) + "\n"
    else:
        text = "".join(f"{i.source} {i.destination}\n" for i in plan.images)
    output(text, args.output)
    return 0


def cmd_config_schema(args: argparse.Namespace) -> int:
    import json

    from installer.config import site_schema

    output(json.dumps(site_schema(), indent=2, sort_keys=True) + "\n", args.output)
    return 0


def cmd_config_sample(args: argparse.Namespace) -> int:
    from installer.config import sample_site

    output(sample_site(), args.output)
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """Every check preflight and apply make before they contact anything (installer.offline_checks, the same
    functions they call), for a plain apply: exit 2 for bad input, 3 for a site apply refuses. Contacts nothing."""
    import os
    import sys

    from installer import offline_checks
    from installer.cli.common import ENV_CHART
    from installer.render.role_vars import host_driver

    plan = resolve_plan(args)  # the site against the release, the inventory, each node's OS and kernel, MIG names
    chart = os.environ.get(ENV_CHART) or plan.site.operator.chart  # what apply installs without --chart
    offline_checks.check(plan, stages=True, mirror_check=True, chart=chart)
    where = ""
    if plan.inventory is not None:
        oses = sorted({n.os_name or "OS unknown" for n in plan.nodes})
        where = f"; inventory {plan.inventory.path}: {len(plan.nodes)} GPU node(s), {', '.join(oses) or 'none'}"
    print(f"{args.site}: ok (GPU Operator {plan.release.version}, registry {plan.site.registry.host}{where})")
    hd = host_driver(plan.site, plan.release, plan.nodes)
    if hd is not None:  # driver.mode host/runfile: what the roles install and why
        what = f"branch {hd.version}" if "." not in hd.version else f"driver {hd.version}"
        print(f"driver: {plan.site.driver.mode} mode installs {what} ({hd.version_why}) with the {hd.module_type} "
              f"kernel modules ({hd.module_why})")
    if not chart and not getattr(args, "quiet", False):
        print(f"note: no operator.chart in the site and no {ENV_CHART}: apply needs --chart (checked then)",
              file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    p = command(sub, "render", "render Helm values for the pinned GPU Operator release")
    site_args(p)
    inventory_arg(p)
    node_flags(p)
    kube_version_arg(p)
    output_arg(p)
    p.set_defaults(func=cmd_render)

    p = command(sub, "images", "list every image the install will pull: source → destination")
    site_args(p)
    inventory_arg(p)
    node_flags(p)
    output_arg(p)
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_images)

    csub = group(sub, "config", "site file: schema, sample, check", "config_command")
    q = command(csub, "schema", "print the JSON schema of site.yaml")
    output_arg(q)
    q.set_defaults(func=cmd_config_schema)
    q = command(csub, "sample", "print a commented sample site.yaml")
    output_arg(q)
    q.set_defaults(func=cmd_config_sample)
    q = command(csub, "check", "validate a site file and, with -i, the inventory: every check preflight and apply "
                               "make before they contact anything (exit 2 bad input, 3 a site apply refuses); "
                               "contacts nothing")
    site_args(q)
    inventory_arg(q)
    facts_arg(q)
    kube_version_arg(q)
    q.set_defaults(func=cmd_config_check)
