"""`gpu-install validate`: the post-install verdict (installer/validate/), as a table, JSON and JUnit XML."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from installer.cli.common import command, json_arg, kubeconfig_arg, quiet_arg, resolve_plan, say, seconds

if TYPE_CHECKING:
    from installer.validate.report import Report


def cmd_validate(args: argparse.Namespace) -> int:
    import sys

    from rich.console import Console

    from installer import jsonout, validate
    from installer.errors import ConfigError
    from installer.util import atomic_write
    from installer.validate.report import STATUSES

    # --json is written however validate ends: with the report, or -- when it stops before checking anything (a site
    # file or options it refuses) -- with no checks and the error (docs/json.md)
    with jsonout.json_document(args.json, jsonout.VALIDATE, "validate") as rec:
        rec.doc.update(release="", layers=[], summary=dict.fromkeys(STATUSES, 0), checks=[])
        layers = validate.parse_only(args.only, local=args.local)
        rec.doc["layers"] = list(layers)
        if args.local:
            report = _local(args, layers)
        else:
            if not args.site or not args.inventory:
                raise ConfigError("validate needs the site file (-s) and the inventory (-i) of the nodes to check",
                                  hint="give -s site.yaml -i inventory, or --local to check this machine")
            plan = resolve_plan(args, need_inventory=True)
            rec.doc["release"] = plan.release.version
            rec.secrets += jsonout.secret_values(plan)
            report = validate.run(plan, args.kubeconfig, layers, keep_failed=args.keep_failed, timeout=args.timeout,
                                  node_timeout=args.ssh_timeout, progress=say(args))
        report.render(Console(file=sys.stdout, soft_wrap=True))
        rec.doc.update(report.to_json())
        if args.junit:
            atomic_write(args.junit, report.to_junit())
    return report.exit_code()


def _local(args: argparse.Namespace, layers: tuple[str, ...]) -> Report:
    """validate --local: this machine, NVML in-process; the site file (optional) gives the driver pin and runtime."""
    import socket
    import time

    from installer import validate
    from installer.errors import ConfigError
    from installer.validate import local
    from installer.validate.node import Expectations
    from installer.validate.report import Report

    if args.inventory:
        raise ConfigError("--local checks this machine: leave out -i", hint="or leave out --local to check the nodes")
    plan = resolve_plan(args) if args.site else None
    if plan is None and "runtime" in layers and args.only:
        raise ConfigError("--local --only runtime needs the site file (-s): its `runtime` says which one to check")
    host = socket.gethostname()
    expect = validate.expectations(plan, host) if plan else Expectations()
    rt = validate.runtime_expectations(plan, {}) if plan else None
    if plan is None:
        layers = tuple(layer for layer in layers if layer != "runtime")
    report = Report(plan.release.version if plan else "no site file", layers)
    t0 = time.monotonic()
    report.add(*local.run(expect, rt, layers, timeout=args.ssh_timeout))
    report.seconds = time.monotonic() - t0
    return report


def register(sub: Any) -> None:
    from installer.cli.common import ENV_INVENTORY, ENV_SITE
    from installer.validate import AVAILABLE, LOCAL

    q = command(sub, "validate", "check the GPU nodes and the cluster after an install: a report per node x layer "
                                 "(exit 0 all passed, 6 a check failed, 5 a node unreachable)")
    q.add_argument("-s", "--site", default=os.environ.get(ENV_SITE),
                   help=f"site file (site.yaml); env {ENV_SITE}; required unless --local")
    q.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a site field, e.g. --set driver.version=550.144.03 (repeatable; value is YAML)")
    q.add_argument("-i", "--inventory", default=os.environ.get(ENV_INVENTORY),
                   help=f"Ansible inventory of the GPU nodes (file or directory); env {ENV_INVENTORY}; required unless "
                        "--local")
    kubeconfig_arg(q)
    q.add_argument("--local", action="store_true",
                   help="check THIS machine instead (node layer through NVML in-process, and the runtime layer with "
                        "-s); no inventory, no cluster")
    q.add_argument("--only", metavar="LAYERS",
                   help=f"comma-separated layers to run (default and available: {','.join(AVAILABLE)}; --local: "
                        f"{','.join(LOCAL)})")
    json_arg(q, "gpu-install.validate/v1", "the report")
    q.add_argument("--junit", metavar="FILE", help="also write the report as JUnit XML (one testcase per node x check)")
    q.add_argument("--keep-failed", action="store_true", help="keep the smoke pods that failed, for kubectl describe/logs")
    q.add_argument("--timeout", type=seconds, default=300.0,
                   help="seconds the smoke pods get to run (default 300)")
    q.add_argument("--ssh-timeout", type=seconds, default=30.0,
                   help="node layer: seconds to connect to a node and again to run its probe (default 30); a node "
                        "that does not answer is unreachable (exit 5)")
    quiet_arg(q)
    q.set_defaults(func=cmd_validate)
