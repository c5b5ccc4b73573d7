"""`gpu-install mig label` (registered by installer.cli). Nothing heavy at import."""

from __future__ import annotations

import argparse

from installer.cliargs import inventory_arg, site_args


def cmd_label(args: argparse.Namespace) -> int:
    import sys

    from installer import mig
    from installer.config import load_site

    site = load_site(args.site, args.set)
    results = mig.label_nodes(site, args.inventory, args.kubeconfig, dry_run=args.dry_run,
                              progress=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    changed = sum(r.changed for r in results)
    verb = "would change" if args.dry_run else "changed"
    print(f"mig label: {len(results)} nodes, {changed} {verb}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mig", help="MIG layouts of the GPU nodes (nvidia.com/mig.config labels)")
    msub = p.add_subparsers(dest="mig_command", metavar="ACTION")
    msub.required = True
    q = msub.add_parser("label", help="label each GPU node nvidia.com/mig.config=<site mig.config or the host's "
                                      "gpu_install_mig_config>, checked against the release and the node's GPU")
    site_args(q)
    inventory_arg(q, required=True)
    q.add_argument("--kubeconfig", default=None,
                   help="kubeconfig of the cluster; env KUBECONFIG (first existing entry), else ~/.kube/config")
    q.add_argument("--dry-run", action="store_true", help="check and report, label nothing")
    q.add_argument("-q", "--quiet", action="store_true", help="no per-node lines on stderr")
    q.set_defaults(func=cmd_label)
