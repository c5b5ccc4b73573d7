"""`gpu-install operator install|status|uninstall`: the GPU Operator Helm release on its own."""

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
    json_arg,
    kubeconfig_arg,
    node_flags,
    quiet_arg,
    resolve_plan,
    say,
    seconds,
    site_args,
)
from installer.cli.nodes import purge_args


def _common(p: argparse.ArgumentParser) -> None:
    site_args(p)
    kubeconfig_arg(p)
    quiet_arg(p)


def cmd_install(args: argparse.Namespace) -> int:
    from installer import operator

    plan = resolve_plan(args)
    prepared = operator.prepare(plan, args.kubeconfig, args.chart or plan.site.operator.chart)
    note = operator.check_cluster(plan, prepared.kubeconfig)
    if note and not args.quiet:
        print(f"note: {note}", file=sys.stderr)
    report = operator.install(plan, prepared, timeout=args.timeout, progress=say(args), wait=not args.no_wait)
    print("\n".join(report.lines()))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from installer import jsonout, operator
    from installer.errors import EXIT_VALIDATION

    with jsonout.json_document(args.json, jsonout.OPERATOR_STATUS, "operator status") as rec:
        rec.doc.update(release=None, namespace=None, pullSecret=None, helmRelease=None, deployed=False)
        plan = resolve_plan(args)
        rec.secrets += jsonout.secret_values(plan)
        rec.doc["release"] = plan.release.version
        report = operator.status(plan, args.kubeconfig)
        rec.doc.update(report.to_json())
        rc = 0 if report.installed else EXIT_VALIDATION
        rec.doc["exitCode"] = rc
    print("\n".join(report.lines()))
    return rc


def cmd_uninstall(args: argparse.Namespace) -> int:
    from installer import operator

    plan = resolve_plan(args)
    report = operator.uninstall(plan, args.kubeconfig, yes=args.yes,
                                delete_namespace=args.delete_namespace, timeout=args.timeout, progress=say(args),
                                purge_crds=args.purge_crds, chart_ref=args.chart or plan.site.operator.chart)
    print("\n".join(report.lines()))
    return 0


def register(sub: Any) -> None:
    osub = group(sub, "operator", "GPU Operator Helm release: install, status, uninstall", "operator_command")

    q = command(osub, "install", "namespace + pull Secret + the chart's CRDs (server-side apply) + helm upgrade "
                                 "--install --skip-crds with the rendered values")
    _common(q)
    # the GPU nodes' OSes: driver.mode operator with packages.url writes one package source per node OS
    inventory_arg(q)
    node_flags(q)
    q.add_argument("--chart", default=os.environ.get(ENV_CHART),
                   help=f"GPU Operator chart: directory, .tgz or oci://REGISTRY/PATH/gpu-operator; env {ENV_CHART}")
    q.add_argument("--timeout", type=seconds, default=300, metavar="SECONDS",
                   help="how long to wait for the release's workloads to be ready (default 300)")
    q.add_argument("--no-wait", action="store_true", help="do not wait for the workloads (helm without --wait)")
    q.set_defaults(func=cmd_install)

    q = command(osub, "status", "namespace, pull Secret and release state (exit 6 when not deployed)")
    _common(q)
    json_arg(q, "gpu-install.operator-status/v1", "the state")
    q.set_defaults(func=cmd_status)

    q = command(osub, "uninstall", "helm uninstall the release and delete gpu-install's pull Secret (CRDs stay "
                                   "unless --purge-crds)")
    _common(q)
    q.add_argument("--yes", action="store_true", help="confirm; without it nothing is removed (exit 2)")
    q.add_argument("--delete-namespace", action="store_true", help="also delete the namespace")
    q.add_argument("--timeout", type=seconds, default=300, metavar="SECONDS", help="helm uninstall --wait timeout")
    purge_args(q)
    q.set_defaults(func=cmd_uninstall)
