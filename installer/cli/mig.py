"""`gpu-install mig label`: MIG layouts of the GPU nodes (nvidia.com/mig.config labels)."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import command, group, inventory_arg, kubeconfig_arg, quiet_arg, resolve_plan, say, site_args


def cmd_label(args: argparse.Namespace) -> int:
    from installer import mig

    results = mig.label_nodes(resolve_plan(args, need_inventory=True), args.kubeconfig, dry_run=args.dry_run,
                              progress=say(args))
    changed = sum(r.changed for r in results)
    verb = "would change" if args.dry_run else "changed"
    print(f"mig label: {len(results)} nodes, {changed} {verb}")
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
