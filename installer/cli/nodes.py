"""`gpu-install preflight`, `apply` and `uninstall`: the stages of installer.pipeline on a resolved Plan."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from installer.cli.common import (
    ENV_CHART,
    command,
    inventory_arg,
    json_arg,
    kubeconfig_arg,
    quiet_arg,
    resolve_plan,
    seconds,
    site_args,
    verbose_arg,
)


def _hosts_args(p: argparse.ArgumentParser) -> None:
    site_args(p)
    inventory_arg(p, required=True)
    p.add_argument("--limit", help="only these hosts (Ansible pattern)")
    quiet_arg(p, "no per-task progress lines (the recap stays)")
    verbose_arg(p)


def _run_options(args: argparse.Namespace) -> Any:
    from installer.apply import RunOptions

    return RunOptions(tags=getattr(args, "tags", None), skip_tags=getattr(args, "skip_tags", None),
                      check=getattr(args, "check", False), diff=getattr(args, "diff", False),
                      keep_packages=getattr(args, "keep_packages", False))


def _operator_options(args: argparse.Namespace) -> Any:
    from installer.pipeline import OperatorOptions

    return OperatorOptions(enabled=not args.skip_operator, kubeconfig=args.kubeconfig, chart=getattr(args, "chart", None),
                           timeout=args.operator_timeout, wait=not getattr(args, "no_wait", False),
                           delete_namespace=getattr(args, "delete_namespace", False),
                           purge_crds=getattr(args, "purge_crds", False),
                           with_limit=getattr(args, "include_operator", False),
                           validate=not getattr(args, "skip_validate", False),
                           mirror_check=not getattr(args, "skip_mirror_check", False))


def _finish(disp: Any) -> None:
    """Close the live display and print the per-host recap (also when a stage failed)."""
    disp.close()
    if disp.runs:
        disp.print_recap()


def _display(args: argparse.Namespace) -> Any:
    """The progress display (installer.cli.common.display) that also keeps the runs' task failures for --json."""
    from installer.jsonout import recording_display

    return recording_display((lambda line: None) if getattr(args, "quiet", False) else sys.stderr,
                             verbose=getattr(args, "verbose", False))


def _node_results(rec: Any, disp: Any) -> None:
    """The playbook runs' per-host results and task failures into the --json document."""
    from installer.jsonout import playbook_runs

    rec.doc["runs"] = playbook_runs(disp.runs)
    rec.doc["failures"] = list(disp.failures)


def cmd_preflight(args: argparse.Namespace) -> int:
    from installer import apply, jsonout

    with jsonout.json_document(args.json, jsonout.PREFLIGHT, "preflight") as rec:
        rec.doc.update(release=None, notes=[], runs=[], failures=[])
        plan = resolve_plan(args, need_inventory=True)
        rec.secrets += jsonout.secret_values(plan)
        rec.doc.update(release=plan.release.version, notes=list(plan.notes))
        if args.kubeconfig:  # also the cluster: its Kubernetes version must suit the release (read-only)
            from installer import kube, operator

            kc = kube.resolve_kubeconfig(args.kubeconfig)
            kube.api_client(kc)  # a malformed kubeconfig is exit 2 before any host
            note = operator.check_cluster(plan, kc)
            if note:
                rec.doc["notes"].append(note)
                if not args.quiet:
                    print(f"note: {note}", file=sys.stderr)
        disp = _display(args)
        try:
            res = apply.preflight(plan, _run_options(args), disp)
        finally:
            _finish(disp)
            _node_results(rec, disp)
    print(f"preflight ok ({len(res.hosts)} hosts); artifacts: {res.artifacts}")
    return 0


def _staged(args: argparse.Namespace, command_name: str) -> int:
    """apply / uninstall: stages run by installer.pipeline; recap and stage summary are printed also on failure."""
    from installer import jsonout, pipeline

    json_path = getattr(args, "json", None)
    with jsonout.json_document(json_path, jsonout.APPLY, command_name) as rec:
        rec.doc.update(release=None, checkMode=bool(getattr(args, "check", False)), stages=[], nodesChanged=None,
                       runs=[], failures=[], validate=None)
        plan = resolve_plan(args, need_inventory=True)
        rec.secrets += jsonout.secret_values(plan)
        rec.doc["release"] = plan.release.version
        run, op = _run_options(args), _operator_options(args)
        disp = _display(args)
        summary = pipeline.Summary(command_name)
        ok = False
        try:
            if command_name == "apply":
                pipeline.run_apply(plan, run, op, summary, disp)
            else:
                pipeline.run_uninstall(plan, run, op, args.yes, summary, disp)
            ok = True
        finally:
            _finish(disp)
            _node_results(rec, disp)
            rec.doc.update(stages=summary.records(), nodesChanged=summary.nodes_changed,
                           validate=summary.report.to_json() if summary.report is not None else None)
            if summary.report is not None and getattr(args, "junit", None):
                from installer.util import atomic_write

                atomic_write(args.junit, summary.report.to_junit())
            if summary.report is not None:
                from rich.console import Console

                summary.report.render(Console(file=sys.stdout, soft_wrap=True))
            if summary.stages:
                print(summary.table(), flush=True)
    if ok:
        tail = "; ".join(f"{s.name} {s.outcome}" for s in summary.stages)
        print(f"{command_name} ok{' (check mode)' if run.check else ''}: "
              f"nodes changed={summary.nodes_changed}; {tail}")
    if ok and getattr(args, "evidence", None):
        _evidence(args, plan, summary)
    return 0


def _evidence(args: argparse.Namespace, plan: Any, summary: Any) -> None:
    """apply --evidence FILE: after the validate stage, its report beside FILE (FILE-validate.json) and the signed
    evidence of what now runs (gpu-install evidence create, docs/evidence.md)."""
    import json
    from pathlib import Path

    from installer.cli.evidence import write_evidence
    from installer.util import atomic_write

    reports = []
    if summary.report is not None:
        target = Path(args.evidence).expanduser()
        report = target.with_name(target.stem + "-validate.json")
        atomic_write(report, json.dumps(summary.report.to_json(), indent=2) + "\n")
        reports.append(str(report))
    write_evidence(plan, args, args.evidence, reports)


def cmd_apply(args: argparse.Namespace) -> int:
    if getattr(args, "evidence", None):  # checked before anything runs (exit 2)
        from installer.errors import ConfigError
        from installer.jsonout import check_target

        if args.check:
            raise ConfigError("--evidence records what runs after an apply: not with --check",
                              hint="leave out --evidence, or --check")
        check_target(args.evidence)
    return _staged(args, "apply")


def cmd_uninstall(args: argparse.Namespace) -> int:
    return _staged(args, "uninstall")


def _operator_args(p: argparse.ArgumentParser, install: bool) -> None:
    p.add_argument("--skip-operator", action="store_true",
                   help="nodes only: no Helm release " + ("install" if install else "removal"))
    p.add_argument("--include-operator", action="store_true",
                   help="with --limit, also " + ("install/upgrade" if install else "remove") + " the cluster-wide "
                        "operator (a limited run leaves it alone otherwise)")
    kubeconfig_arg(p)
    p.add_argument("--operator-timeout", type=seconds, default=300, metavar="SECONDS",
                   help="how long helm waits for the operator's workloads (default 300)" if install else
                   "how long helm uninstall waits for the release's resources to go (default 300)")
    if install:
        p.add_argument("--chart", default=os.environ.get(ENV_CHART),
                       help=f"GPU Operator chart: directory, .tgz or oci://…; env {ENV_CHART}; else the site's "
                            "operator.chart; its CRDs are applied server-side before helm upgrade --install")
        p.add_argument("--no-wait", action="store_true", help="do not wait for the operator's workloads (and so no "
                                                                  "validate stage)")
        p.add_argument("--skip-mirror-check", action="store_true",
                       help="do not check, before any host is touched, that every image the operator stage deploys "
                            "is in registry.host (e.g. a pull-through registry that fetches on demand)")
        p.add_argument("--skip-validate", action="store_true",
                       help="no validate stage: by default apply ends with `gpu-install validate` (every layer) once "
                            "the operator stage has run and waited")
    else:
        purge_args(p)


def purge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--purge-crds", action="store_true",
                   help="after the release is gone, delete the CRDs the chart carries -- only when no custom resource "
                        "of theirs is left (else exit 3 naming them, no CRD deleted); without it the CRDs stay")
    p.add_argument("--chart", default=os.environ.get(ENV_CHART),
                   help=f"with --purge-crds: the chart whose CRDs are deleted (directory, .tgz or oci://…); env "
                        f"{ENV_CHART}; else the site's operator.chart")


def register(sub: Any) -> None:
    p = command(sub, "preflight", "read-only checks of inventory and GPU nodes (exit 3 on problems)")
    _hosts_args(p)
    p.add_argument("--kubeconfig", default=None,
                   help="also check the cluster: its Kubernetes version must be one the release runs on "
                        "(without it only the nodes are checked)")
    json_arg(p, "gpu-install.preflight/v1", "the per-host results and problems")
    p.set_defaults(func=cmd_preflight)

    p = command(sub, "apply", "preflight, configure the GPU nodes (playbooks/site.yml), install the operator, "
                              "label MIG layouts")
    _hosts_args(p)
    p.add_argument("--check", action="store_true", help="dry run: report what would change (nodes and Helm release)")
    p.add_argument("--diff", action="store_true", help="show file differences")
    p.add_argument("--tags", help="only tasks with these tags (e.g. runtime; `operator` selects the operator stage)")
    p.add_argument("--skip-tags", dest="skip_tags", help="skip tasks with these tags (`operator`: no operator stage)")
    _operator_args(p, install=True)
    json_arg(p, "gpu-install.apply/v1", "the stage table, the per-host results and the validate report")
    p.add_argument("--junit", metavar="FILE", help="also write the validate stage's report as JUnit XML (one testcase "
                                                   "per node x check, as `gpu-install validate --junit`), also when "
                                                   "it fails; nothing when the stage did not run")
    p.add_argument("--evidence", metavar="FILE",
                   help="after a successful apply (its validate stage passed), write signed install evidence to FILE "
                        "(as `gpu-install evidence create`, with the validate report as FILE-validate.json)")
    from installer.cli.evidence import evidence_args

    evidence_args(p)
    p.set_defaults(func=cmd_apply)

    p = command(sub, "uninstall", "reverse apply: Helm release, runtime configs minus our keys (needs --yes)")
    _hosts_args(p)
    p.add_argument("--yes", action="store_true", help="confirm; without it the plan is printed and nothing changes (exit 2)")
    p.add_argument("--delete-namespace", action="store_true", help="also delete the operator's namespace")
    p.add_argument("--keep-packages", action="store_true",
                   help="keep the NVIDIA driver and container toolkit packages gpu-install installed (by default "
                        "they are removed; packages that were there before apply always stay)")
    p.add_argument("--tags", help="only these roles' removal (e.g. docker_runtime)")
    p.add_argument("--skip-tags", dest="skip_tags", help="skip these roles' removal")
    _operator_args(p, install=False)
    json_arg(p, "gpu-install.apply/v1", "the stage table and the per-host results")
    p.set_defaults(func=cmd_uninstall)
