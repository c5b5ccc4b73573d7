"""`gpu-install validate`: the post-install verdict (installer/validate/), as a table, JSON and JUnit XML."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import (
    command,
    inventory_arg,
    kubeconfig_arg,
    quiet_arg,
    resolve_plan,
    say,
    seconds,
    site_args,
)


def cmd_validate(args: argparse.Namespace) -> int:
    import json
    import sys

    from rich.console import Console

    from installer import validate
    from installer.util import atomic_write

    layers = validate.parse_only(args.only)
    plan = resolve_plan(args, need_inventory=True)
    report = validate.run(plan, args.kubeconfig, layers, keep_failed=args.keep_failed, timeout=args.timeout,
                          node_timeout=args.ssh_timeout, progress=say(args))
    report.render(Console(file=sys.stdout, soft_wrap=True))
    if args.json:
        atomic_write(args.json, json.dumps(report.to_json(), indent=2) + "\n")
    if args.junit:
        atomic_write(args.junit, report.to_junit())
    return report.exit_code()


def register(sub: Any) -> None:
    from installer.validate import AVAILABLE

    q = command(sub, "validate", "check the GPU nodes and the cluster after an install: a report per node x layer "
                                 "(exit 0 all passed, 6 a check failed, 5 a node unreachable)")
    site_args(q)
    inventory_arg(q, required=True)
    kubeconfig_arg(q)
    q.add_argument("--only", metavar="LAYERS",
                   help=f"comma-separated layers to run (default and available: {','.join(AVAILABLE)})")
    q.add_argument("--json", metavar="FILE", help="also write the report as JSON (schema gpu-install.validate/v1)")
    q.add_argument("--junit", metavar="FILE", help="also write the report as JUnit XML (one testcase per node x check)")
    q.add_argument("--keep-failed", action="store_true", help="keep the smoke pods that failed, for kubectl describe/logs")
    q.add_argument("--timeout", type=seconds, default=300.0,
                   help="seconds the smoke pods get to run (default 300)")
    q.add_argument("--ssh-timeout", type=seconds, default=30.0,
                   help="node layer: seconds to connect to a node and again to run its probe (default 30); a node "
                        "that does not answer is unreachable (exit 5)")
    quiet_arg(q)
    q.set_defaults(func=cmd_validate)
