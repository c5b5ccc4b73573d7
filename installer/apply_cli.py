"""`gpu-install preflight`, `apply` and `uninstall` (registered by installer.cli). Nothing heavy at import."""

from __future__ import annotations

import argparse

from installer.cliargs import inventory_arg, site_args


def _common(p: argparse.ArgumentParser) -> None:
    site_args(p)
    inventory_arg(p, required=True)
    p.add_argument("--limit", help="only these hosts (Ansible pattern)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-task progress lines (the recap stays)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also skipped tasks, errors a task ignores, and diffs of unchanged files")


def _options(args: argparse.Namespace):
    import sys

    from installer import apply
    from installer.progress import Display

    # live progress on stderr (a status line on a terminal, plain lines elsewhere); -q: nothing but the recap
    display = Display((lambda line: None) if args.quiet else sys.stderr, verbose=args.verbose)
    return apply.Options(
        inventory=args.inventory, limit=args.limit, tags=getattr(args, "tags", None),
        skip_tags=getattr(args, "skip_tags", None), check=getattr(args, "check", False),
        diff=getattr(args, "diff", False), progress=display.note, display=display,
    )


def _finish(opts) -> None:
    """Close the live display and print the per-host recap (also when a stage failed)."""
    opts.display.close()
    if opts.display.runs:
        print(opts.display.recap(), flush=True)


def _operator_options(args: argparse.Namespace):
    from installer.pipeline import OperatorOptions

    return OperatorOptions(enabled=not args.skip_operator, kubeconfig=args.kubeconfig, chart=getattr(args, "chart", None),
                           timeout=args.operator_timeout, wait=not getattr(args, "no_wait", False),
                           delete_namespace=getattr(args, "delete_namespace", False))


def _staged(args: argparse.Namespace, command: str) -> int:
    """apply / uninstall: stages run by installer.pipeline; recap and stage summary are printed also on failure."""
    from installer import pipeline
    from installer.config import load_site

    site = load_site(args.site, args.set)
    opts, op = _options(args), _operator_options(args)
    summary = pipeline.Summary(command)
    ok = False
    try:
        if command == "apply":
            pipeline.run_apply(site, opts, op, summary, progress=opts.progress)
        else:
            pipeline.run_uninstall(site, opts, op, args.yes, summary, progress=opts.progress)
        ok = True
    finally:
        _finish(opts)
        if summary.stages:
            print("\n".join(summary.lines()), flush=True)
    if ok:
        tail = "; ".join(f"{s.name} {s.outcome}" for s in summary.stages)
        print(f"{command} ok{' (check mode)' if opts.check else ''}: "
              f"nodes changed={summary.nodes_changed}; {tail}")
    return 0


def _run(args: argparse.Namespace, stage: str) -> int:
    from installer import apply
    from installer.config import load_site

    site = load_site(args.site, args.set)
    opts = _options(args)
    try:
        res = apply.preflight(site, opts)
    finally:
        _finish(opts)
    print(f"preflight ok ({len(res.hosts)} hosts); artifacts: {res.artifacts}")
    return 0


def _operator_args(p: argparse.ArgumentParser, install: bool) -> None:
    import os

    from installer.operator_cli import ENV_CHART, ENV_KUBECONFIG

    p.add_argument("--skip-operator", action="store_true",
                   help="nodes only: no Helm release " + ("install" if install else "removal"))
    p.add_argument("--kubeconfig", default=None,
                   help=f"kubeconfig of the cluster; env {ENV_KUBECONFIG} (first existing entry), else ~/.kube/config")
    p.add_argument("--operator-timeout", type=float, default=300, metavar="SECONDS",
                   help="how long helm waits for the operator's workloads (default 300)")
    if install:
        p.add_argument("--chart", default=os.environ.get(ENV_CHART),
                       help=f"GPU Operator chart: directory, .tgz or oci://…; env {ENV_CHART}; else the site's "
                            "operator.chart")
        p.add_argument("--no-wait", action="store_true", help="do not wait for the operator's workloads")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="read-only checks of inventory and GPU nodes (exit 3 on problems)")
    _common(p)
    p.set_defaults(func=lambda a: _run(a, "preflight"))
    p = sub.add_parser("apply", help="preflight, configure the GPU nodes (playbooks/site.yml), install the operator")
    _common(p)
    p.add_argument("--check", action="store_true", help="dry run: report what would change (nodes and Helm release)")
    p.add_argument("--diff", action="store_true", help="show file differences")
    p.add_argument("--tags", help="only tasks with these tags (e.g. runtime; `operator` selects the operator stage)")
    p.add_argument("--skip-tags", dest="skip_tags", help="skip tasks with these tags (`operator`: no operator stage)")
    _operator_args(p, install=True)
    p.set_defaults(func=lambda a: _staged(a, "apply"))
    p = sub.add_parser("uninstall", help="reverse apply: Helm release, runtime configs minus our keys (needs --yes)")
    _common(p)
    p.add_argument("--yes", action="store_true", help="confirm; without it the plan is printed and nothing changes (exit 2)")
    p.add_argument("--delete-namespace", action="store_true", help="also delete the operator's namespace")
    p.add_argument("--tags", help="only these roles' removal (e.g. docker_runtime)")
    p.add_argument("--skip-tags", dest="skip_tags", help="skip these roles' removal")
    _operator_args(p, install=False)
    p.set_defaults(func=lambda a: _staged(a, "uninstall"))
