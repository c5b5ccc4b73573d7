"""`gpu-install operator install|status|uninstall` (registered by installer.cli). Nothing heavy at import."""

from __future__ import annotations

import argparse
import os

from installer.cliargs import site_args

ENV_CHART = "GPU_INSTALL_CHART"
ENV_KUBECONFIG = "KUBECONFIG"


def _common(p: argparse.ArgumentParser) -> None:
    site_args(p)
    p.add_argument("--kubeconfig", default=None,
                   help=f"kubeconfig of the cluster; env {ENV_KUBECONFIG} (first existing entry), else ~/.kube/config")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def _progress(args: argparse.Namespace):
    import sys

    return None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))


def cmd_install(args: argparse.Namespace) -> int:
    from installer import operator
    from installer.config import load_site

    site = load_site(args.site, args.set)
    report = operator.install(site, args.kubeconfig, args.chart or site.operator.chart, timeout=args.timeout,
                              progress=_progress(args), wait=not args.no_wait)
    print("\n".join(report.lines()))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from installer import operator
    from installer.config import load_site
    from installer.errors import EXIT_VALIDATION

    site = load_site(args.site, args.set)
    report = operator.status(site, args.kubeconfig)
    print("\n".join(report.lines()))
    return 0 if report.installed else EXIT_VALIDATION


def cmd_uninstall(args: argparse.Namespace) -> int:
    from installer import operator
    from installer.config import load_site

    site = load_site(args.site, args.set)
    report = operator.uninstall(site, args.kubeconfig, yes=args.yes, delete_namespace=args.delete_namespace,
                                timeout=args.timeout, progress=_progress(args))
    print("\n".join(report.lines()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="GPU Operator Helm release: install, status, uninstall")
    osub = p.add_subparsers(dest="operator_command", metavar="ACTION")
    osub.required = True

    q = osub.add_parser("install", help="namespace + pull Secret + helm upgrade --install with the rendered values")
    _common(q)
    q.add_argument("--chart", default=os.environ.get(ENV_CHART),
                   help=f"GPU Operator chart: directory, .tgz or oci://REGISTRY/PATH/gpu-operator; env {ENV_CHART}")
    q.add_argument("--timeout", type=float, default=300, metavar="SECONDS",
                   help="how long to wait for the release's workloads to be ready (default 300)")
    q.add_argument("--no-wait", action="store_true", help="do not wait for the workloads (helm without --wait)")
    q.set_defaults(func=cmd_install)

    q = osub.add_parser("status", help="namespace, pull Secret and release state (exit 6 when not deployed)")
    _common(q)
    q.set_defaults(func=cmd_status)

    q = osub.add_parser("uninstall", help="helm uninstall the release and delete gpu-install's pull Secret")
    _common(q)
    q.add_argument("--yes", action="store_true", help="confirm; without it nothing is removed (exit 2)")
    q.add_argument("--delete-namespace", action="store_true", help="also delete the namespace")
    q.add_argument("--timeout", type=float, default=300, metavar="SECONDS", help="helm uninstall --wait timeout")
    q.set_defaults(func=cmd_uninstall)
