"""`gpu-install mig label|plan|apply`: MIG layouts of the GPU nodes (nvidia.com/mig.config labels; plan and apply:
the rollout in installer/mig_rollout.py)."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import (
    command,
    group,
    inventory_arg,
    kubeconfig_arg,
    quiet_arg,
    resolve_plan,
    say,
    seconds,
    site_args,
)


def cmd_label(args: argparse.Namespace) -> int:
    from installer import mig

    results = mig.label_nodes(resolve_plan(args, need_inventory=True), args.kubeconfig, dry_run=args.dry_run,
                              progress=say(args))
    changed = sum(r.changed for r in results)
    verb = "would change" if args.dry_run else "changed"
    print(f"mig label: {len(results)} nodes, {changed} {verb}")
    return 0


def _rollout_plan(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from installer import kube, mig_rollout

    plan = resolve_plan(args, need_inventory=True)
    client = kube.api_client(kube.resolve_kubeconfig(args.kubeconfig))
    return plan, client, mig_rollout.plan_rollout(plan, client, drain_all=args.drain_all)


def _plan_table(steps: list[Any]) -> str:
    from installer.ui import table

    return table("MIG rollout plan", ["node", "now (state)", "wanted", "action", "MIG mode change", "would evict"],
                 [(s.node, f"{s.current or '-'} ({s.state or '-'})", s.desired, s.action +
                   (f": {s.problem}" if s.problem else "") + (" (cordoned by an admin)" if s.cordoned else ""),
                   s.mode_change + (" (GPU reset; some platforms reboot)" if s.mode_change == "yes" else ""),
                   ", ".join(s.pods) or "-") for s in steps])


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    _, _, steps = _rollout_plan(args)
    if args.format == "json":
        print(json.dumps({"schema": "gpu-install.mig-plan/v1", "nodes": [s.as_dict() for s in steps]}, indent=2))
    else:
        print(_plan_table(steps))
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from installer import mig_rollout

    plan, client, steps = _rollout_plan(args)
    if not args.quiet:
        print(_plan_table(steps))
    done = mig_rollout.Rollout(plan, client, drain_timeout=args.drain_timeout, state_timeout=args.state_timeout,
                               drain_all=args.drain_all, progress=say(args)).run(steps, batch=args.batch)
    print(f"mig apply: {len(done)} node(s) changed, {len(steps) - len(done)} already at their layout")
    return 0


def register(sub: Any) -> None:
    msub = group(sub, "mig", "MIG layouts of the GPU nodes (nvidia.com/mig.config labels)", "mig_command")
    q = command(msub, "label", "label each GPU node nvidia.com/mig.config=<site mig.config or the host's "
                               "gpu_install_mig_config>, checked against the release and the node's GPU")
    site_args(q)
    inventory_arg(q, required=True)
    kubeconfig_arg(q)
    q.add_argument("--dry-run", action="store_true", help="check and report, label nothing")
    quiet_arg(q, "no per-node lines on stderr")
    q.set_defaults(func=cmd_label)

    for name, func, text in (
            ("plan", cmd_plan, "read-only: per GPU node its MIG layout and mig-manager state now, the one the site "
                               "gives, whether MIG mode changes (a GPU reset), and the pods `mig apply` would evict"),
            ("apply", cmd_apply, "change the nodes' MIG layouts batch by batch: cordon, evict the GPU pods "
                                 "(PodDisruptionBudgets respected), label, wait for mig-manager's success, check the "
                                 "devices, uncordon; a failure stops with that node left cordoned")):
        q = command(msub, name, text)
        site_args(q)
        inventory_arg(q, required=True)
        kubeconfig_arg(q)
        q.add_argument("--drain-all", action="store_true",
                       help="evict every pod on the node (not DaemonSet/mirror pods), not only those using its GPUs")
        if name == "plan":
            q.add_argument("--format", choices=["text", "json"], default="text",
                           help="json: schema gpu-install.mig-plan/v1")
        else:
            q.add_argument("--batch", type=int, default=1, metavar="N", help="nodes changed at a time (default 1)")
            q.add_argument("--drain-timeout", type=seconds, default=300.0, metavar="S",
                           help="seconds to evict a node's pods (PodDisruptionBudgets may hold them; default 300)")
            q.add_argument("--state-timeout", type=seconds, default=900.0, metavar="S",
                           help="seconds for mig-manager to report success (default 900)")
            quiet_arg(q, "no plan table and no per-step lines on stderr")
        q.set_defaults(func=func)
