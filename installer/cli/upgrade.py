"""`gpu-install upgrade plan`: read-only, from the running GPU Operator release and GPU nodes to the target release
(installer/upgrade). Exit 0: nothing blocks; 3: blockers (each named with its fix); 5: the cluster cannot be
reached; 7: the API server or helm answered with an error.

`gpu-install upgrade apply --plan FILE --yes [--resume]`: that plan applied batch by batch (installer.upgrade.apply).
Exit 0: done (or nothing to do); 2: bad flags, plan file or state file (with --resume also a state file whose
batches are not the plan's or that claims a batch done without its recorded steps), no --yes; 3: a stale plan,
blockers, images missing from the mirror, an unfinished run recorded; 4: a node step failed (drain, driver role,
reboot); 5: unreachable; 6: a batch's validation failed; 7: helm or the API server failed.

`gpu-install upgrade rollback [--to-revision N] [--yes]`: helm rollback to the revision before the upgrade (CRDs never
downgraded), host drivers back to their recorded version batch by batch (installer.upgrade.rollback); without --yes a
preview. Exit 0: done or previewed; 2: a bad --to-revision; 3: no release or nothing to roll back to; 4/5/6: a host
batch; 7: helm or the API server failed."""

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


def _host_batch_args(p: argparse.ArgumentParser) -> None:
    """The host-mode batch timeouts upgrade apply and upgrade rollback share (one batch runner)."""
    from installer.cli.common import seconds

    p.add_argument("--drain-timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="host modes: evictions a PodDisruptionBudget refuses are retried this long per node "
                        "(default 300)")
    p.add_argument("--node-timeout", type=seconds, default=900.0, metavar="SECONDS",
                   help="host modes: a rebooted node back Ready (default 900)")


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


def _apply_doc(rec: Any, outcome: Any, state: Any, path: Any) -> None:
    """The gpu-install.upgrade-apply/v1 fields from the state file's record (docs/json.md)."""
    if state is None:
        return
    rel = {"name": state.releaseName, "namespace": state.releaseNamespace,
           "previous": None if state.previous is None else {"revision": state.previous.revision,
                                                             "chart": state.previous.chart},
           "applied": None if state.applied is None else {"revision": state.applied.revision,
                                                           "chart": state.applied.chart}}
    secs = outcome.seconds if outcome is not None else {}
    rec.doc.update(planHash=state.planHash, statePath=str(path), phase=state.phase, release=rel, targetVersion=state.targetVersion,
                   batches=[{"index": b.index, "nodes": list(b.nodes), "canary": b.canary, "status": b.status,
                             "seconds": secs.get(b.index)} for b in state.batches],
                   failure=None if state.failure is None else {
                       "batch": state.failure.batch, "nodes": list(state.failure.nodes),
                       "exitCode": state.failure.exitCode, "message": state.failure.message})


def cmd_apply(args: argparse.Namespace) -> int:
    from installer import jsonout
    from installer.cli.common import display
    from installer.errors import ConfigError
    from installer.upgrade import apply as upgrade_apply
    from installer.validate import parse_only

    with jsonout.json_document(args.json, jsonout.UPGRADE_APPLY, "upgrade apply") as rec:
        rec.doc.update(planFile=args.plan, planHash=None, statePath=None, resumed=bool(args.resume),
                       nothingToDo=False, targetVersion=None, release=None, phase=None, batches=[], failure=None)
        if not args.yes:
            raise ConfigError("upgrade apply changes the cluster (helm upgrade, cordons, drains, driver reloads): "
                              "confirm with --yes",
                              hint=f"review the plan first (gpu-install upgrade plan), then: gpu-install upgrade "
                                   f"apply -s {args.site} -i {args.inventory} --plan {args.plan} --yes")
        plan = resolve_plan(args, need_inventory=True)
        rec.secrets += jsonout.secret_values(plan)
        disp = display(args)
        say = disp.note
        seen: dict[str, Any] = {}

        def on_state(state: Any, path: Any) -> None:
            seen.update(state=state, path=path)

        opts = upgrade_apply.Options(
            plan_file=args.plan, resume=args.resume, kubeconfig=args.kubeconfig, chart=args.chart,
            state_file=args.state, operator_timeout=args.operator_timeout, wait=not args.no_wait,
            drain_timeout=args.drain_timeout,
            node_timeout=args.node_timeout, batch_timeout=args.batch_timeout,
            validate_timeout=args.validate_timeout, validate_layers=parse_only(args.validate_only),
            mirror_check=not args.skip_mirror_check)
        outcome = None
        try:
            outcome = upgrade_apply.run(plan, opts, site=args.site, inventory=args.inventory, say=say, display=disp,
                                        on_state=on_state)
        finally:
            disp.close()
            _apply_doc(rec, outcome, seen.get("state"), seen.get("path"))
        rec.doc.update(planHash=outcome.plan_hash, nothingToDo=outcome.nothing_to_do, resumed=outcome.resumed)
        if outcome.state is not None:
            _apply_doc(rec, outcome, outcome.state, outcome.state_path)
        rec.doc["exitCode"] = outcome.exit_code
    if outcome.nothing_to_do:
        print("upgrade apply: nothing to do (the release is at the target and no node changes)")
    else:
        state = outcome.state
        assert state is not None
        print(f"upgrade apply ok: {state.targetVersion}, release revision "
              f"{state.applied.revision if state.applied else '-'}, {len(state.batches)} batch(es) done "
              f"({outcome.message}); state {outcome.state_path}")
    return outcome.exit_code


def cmd_rollback(args: argparse.Namespace) -> int:
    from installer import jsonout
    from installer.cli.common import display
    from installer.upgrade import rollback
    from installer.upgrade.plan import ROLLBACK_CANNOT
    from installer.validate import parse_only

    with jsonout.json_document(args.json, jsonout.UPGRADE_ROLLBACK, "upgrade rollback") as rec:
        rec.doc.update(applied=False, release=None, valuesDiff=[], cannotUndo=list(ROLLBACK_CANNOT), driverMode=None,
                       nodes=[], statePath=None, archivedState=None, orphans=[])
        plan = resolve_plan(args, need_inventory=True)
        rec.secrets += jsonout.secret_values(plan)
        rec.doc["driverMode"] = plan.site.driver.mode
        disp = display(args)
        opts = rollback.Options(to_revision=args.to_revision, yes=args.yes, kubeconfig=args.kubeconfig,
                                state_file=args.state, chart=args.chart, timeout=args.operator_timeout, wait=not args.no_wait,
                                drain_timeout=args.drain_timeout, node_timeout=args.node_timeout,
                                validate_timeout=args.validate_timeout, validate_layers=parse_only(args.validate_only))
        try:
            out = rollback.run(plan, opts, say=disp.note, display=disp)
        finally:
            disp.close()
        pv = out.preview
        rec.doc.update(applied=out.applied, valuesDiff=pv.values_diff, statePath=str(pv.state_path),
                       archivedState=str(out.archived) if out.archived else None,
                       release={"name": pv.release, "namespace": pv.namespace, "fromRevision": pv.current.revision,
                                "fromChart": pv.current.chart, "toRevision": pv.target.revision,
                                "toChart": pv.target.chart, "why": pv.why, "newRevision": out.revision if out.applied
                                else None},
                       nodes=[{"name": n.name, "batch": n.batch, "now": n.now, "to": n.to, "action": n.action}
                              for n in pv.nodes],
                       orphans=[{"apiVersion": o.api_version, "kind": o.kind, "name": o.name,
                                 "namespace": o.namespace, "action": o.action}
                                for o in (out.orphans if out.applied else pv.orphans)])
        rec.doc["exitCode"] = 0
    print("\n".join(pv.lines()))
    if not out.applied:
        print(f"preview only, nothing changed: run again with --yes to roll back (gpu-install upgrade rollback -s "
              f"{args.site} -i {args.inventory}" + (f" --to-revision {args.to_revision}" if args.to_revision else "")
              + " --yes)")
    else:
        print(f"upgrade rollback ok: release {pv.release} at revision {out.revision} ({pv.target.chart})"
              + (f", driver back on {', '.join(out.nodes_back)}" if out.nodes_back else "")
              + (f", {sum(o.action == 'deleted' for o in out.orphans)} leftover(s) of the newer revisions deleted"
                 if out.orphans else "")
              + "; CRDs stay as they are (never downgraded)")
    return 0


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

    from installer.cli.common import seconds

    a = command(usub, "apply", "apply an upgrade plan (upgrade plan -o FILE): refuse it when stale, mirror check, "
                               "CRDs, helm upgrade, then the nodes batch by batch (canary first), validated between; "
                               "--resume continues a stopped run")
    site_args(a)
    inventory_arg(a, required=True)
    a.add_argument("--plan", required=True, metavar="FILE",
                   help="the plan `upgrade plan -o FILE` wrote; refused when the cluster no longer matches its hash")
    a.add_argument("--yes", action="store_true", help="confirm; without it nothing changes (exit 2)")
    a.add_argument("--resume", action="store_true",
                   help="continue the run recorded in the state file for this plan (after a failure was fixed, or "
                        "the command was stopped): finished batches are not run again")
    a.add_argument("--limit", help="the same --limit the plan was made with (Ansible pattern)")
    kubeconfig_arg(a)
    a.add_argument("--chart", default=os.environ.get(ENV_CHART),
                   help=f"the target's chart, as given to upgrade plan; env {ENV_CHART}; default: operator.chart")
    a.add_argument("--state", metavar="FILE",
                   help="the state file (default $GPU_INSTALL_STATE/upgrade/NAMESPACE.RELEASE.json, "
                        "~/.local/state/gpu-install/upgrade/ by default)")
    a.add_argument("--operator-timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="helm upgrade's wait (default 300)")
    a.add_argument("--no-wait", action="store_true",
                   help="helm upgrade does not wait for the operator's workloads")
    _host_batch_args(a)
    a.add_argument("--batch-timeout", type=seconds, default=1800.0, metavar="SECONDS",
                   help="operator modes: a batch's nodes reach upgrade-done (default 1800)")
    a.add_argument("--validate-timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="a batch's validation (its smoke pods) (default 300)")
    a.add_argument("--validate-only", metavar="LAYERS", default="node,runtime,smoke",
                   help="the layers each batch is validated with (as validate --only; default node,runtime,smoke)")
    a.add_argument("--skip-mirror-check", action="store_true",
                   help="do not check that registry.host holds the target's images first")
    a.add_argument("--json", metavar="FILE",
                   help="also write the outcome as JSON (schema gpu-install.upgrade-apply/v1, docs/json.md), also "
                        "when it fails")
    quiet_arg(a)
    a.set_defaults(func=cmd_apply)

    r = command(usub, "rollback", "back to the Helm revision before the upgrade (its chart and values; CRDs are never "
                                  "downgraded), host drivers back to their recorded version batch by batch; without "
                                  "--yes a preview")
    site_args(r)
    inventory_arg(r, required=True)
    kubeconfig_arg(r)
    r.add_argument("--to-revision", type=_positive, metavar="N",
                   help="the Helm revision to go back to (helm history); default: the one before the recorded "
                        "upgrade run, else the previous revision")
    r.add_argument("--yes", action="store_true", help="roll back; without it a preview of what it would do (exit 0)")
    r.add_argument("--state", metavar="FILE", help="the upgrade state file (as upgrade apply --state)")
    r.add_argument("--chart", default=os.environ.get(ENV_CHART),
                   help="the chart of the revision rolled back to: used only where helm rollback refuses a resource "
                        "the current revision does not manage (then helm upgrade with it and that revision's values)")
    r.add_argument("--operator-timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="helm rollback's wait (default 300)")
    r.add_argument("--no-wait", action="store_true", help="helm rollback does not wait for the operator's workloads")
    _host_batch_args(r)
    r.add_argument("--validate-timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="host modes: a batch's validation (default 300)")
    r.add_argument("--validate-only", metavar="LAYERS", default="node,runtime,smoke",
                   help="host modes: the layers each batch is validated with (default node,runtime,smoke)")
    r.add_argument("--json", metavar="FILE",
                   help="also write the outcome as JSON (schema gpu-install.upgrade-rollback/v1, docs/json.md), also "
                        "when it fails")
    quiet_arg(r)
    r.set_defaults(func=cmd_rollback)
