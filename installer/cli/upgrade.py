"""`gpu-install upgrade plan`: read-only, from the running GPU Operator release and GPU nodes to the target release
(installer/upgrade). Exit 0: nothing blocks; 3: blockers (each named with its fix); 5: the cluster cannot be
reached; 7: the API server or helm answered with an error."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from installer.cli.common import (
    ENV_CHART,
    command,
    group,
    inventory_arg,
    kubeconfig_arg,
    quiet_arg,
    resolve_plan,
    site_args,
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def _max_unavailable(text: str) -> str | int:
    from installer.errors import ConfigError
    from installer.upgrade.nodes import max_unavailable_arg

    try:
        return max_unavailable_arg(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def cmd_plan(args: argparse.Namespace) -> int:
    import json
    import time

    from installer import jsonout, kube
    from installer.upgrade import cluster
    from installer.upgrade import plan as upgrade_plan

    t0 = time.monotonic()
    to_file = args.output if args.output and args.output != "-" else None
    with jsonout.json_document(to_file, jsonout.UPGRADE_PLAN, "upgrade plan") as rec:
        rec.doc.update(kubernetesVersion=None, release=None, targetVersion=None, components=[], valuesDiff=[],
                       crdChanges=[], findings=[], nodes=[], batches=[], maxParallel=args.max_parallel,
                       maxUnavailable=str(args.max_unavailable), blockers=[], rollback=None, nothingToDo=False,
                       planHash=None, applyCommand=None)
        if args.to:
            args.set = [*args.set, f"operator.version={args.to}"]
        plan = resolve_plan(args, need_inventory=True)
        rec.secrets += jsonout.secret_values(plan)
        rec.doc["targetVersion"] = plan.release.version
        chart = args.chart
        if args.to and not chart and plan.site.operator.chart:
            from installer.errors import ConfigError

            raise ConfigError(f"--to {args.to}: operator.chart ({plan.site.operator.chart}) is the chart of the site's "
                              "own release, not necessarily of the target",
                              hint=f"give the target's chart with --chart (or ${ENV_CHART}), or set operator.version "
                                   "and operator.chart in the site file instead of --to")
        kubeconfig = kube.resolve_kubeconfig(args.kubeconfig)
        state, client = cluster.read(plan, kubeconfig)
        up = upgrade_plan.build(plan, state, client, site=args.site, inventory=args.inventory, chart=chart,
                                max_parallel=args.max_parallel, max_unavailable=args.max_unavailable, started=t0)
        rec.doc.update(upgrade_plan.to_doc_fields(up, to_file))
        rec.doc["exitCode"] = up.exit_code
    if args.format == "json" and not to_file:
        rec.finish(up.exit_code)
        doc = jsonout.redact(dict(rec.doc), rec.secrets)
        jsonout.check(doc)
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    elif args.format == "text":
        sys.stdout.write(upgrade_plan.to_text(up, to_file))
    if not args.quiet:
        print(f"upgrade plan: {len(up.blockers)} blocker(s), {sum(n.action != 'none' for n in up.nodes)} node(s) "
              f"change, {up.seconds:.2f} s", file=sys.stderr)
    return up.exit_code


def register(sub: Any) -> None:
    usub = group(sub, "upgrade", "move the running GPU Operator release (and the nodes' drivers) to the next one",
                 "upgrade_command")
    q = command(usub, "plan", "read-only: the running release, CRDs and GPU nodes against the target release: "
                              "component table, values diff, CRD changes, per-node action, evictions and blockers, "
                              "batches, plan hash; exit 3 when something blocks")
    site_args(q)
    inventory_arg(q, required=True)
    q.add_argument("--limit", help="only these GPU hosts (Ansible pattern): the nodes left out are not planned, "
                                   "and count for --max-unavailable no more")
    kubeconfig_arg(q)
    q.add_argument("--to", metavar="VERSION",
                   help="target GPU Operator release (e.g. v23.9.2); default: the site's operator.version")
    q.add_argument("--chart", default=os.environ.get(ENV_CHART),
                   help=f"the target's GPU Operator chart: directory, .tgz or oci://REGISTRY/PATH/gpu-operator; "
                        f"env {ENV_CHART}; default: the site's operator.chart (required with --to when that is set)")
    q.add_argument("--format", choices=["text", "json"], default="text",
                   help="text (default) or json (schema gpu-install.upgrade-plan/v1) on stdout")
    q.add_argument("-o", "--output", metavar="FILE",
                   help="also write the plan as JSON (gpu-install.upgrade-plan/v1) to FILE, the file `upgrade apply "
                        "--plan` reads (written also when the command fails, with the error); with --format json "
                        "instead of stdout")
    q.add_argument("--max-parallel", type=_positive, default=1, metavar="N",
                   help="nodes whose driver is reloaded at a time (default 1)")
    q.add_argument("--max-unavailable", type=_max_unavailable, default="25%", metavar="N[%]",
                   help="GPU nodes unavailable at once, those already cordoned or NotReady included (default 25%%, "
                        "like the operator's driver.upgradePolicy.maxUnavailable)")
    quiet_arg(q, "no summary line on stderr")
    q.set_defaults(func=cmd_plan)
