"""`gpu-install evidence create|verify`: signed install evidence (installer/evidence, docs/evidence.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from installer.cli.common import (
    command,
    group,
    inventory_arg,
    json_arg,
    kubeconfig_arg,
    quiet_arg,
    resolve_plan,
    say,
    seconds,
)

KEY_HOME_HELP = ("the evidence key's directory (generated there on first use: ECDSA P-256, signing-key.pem 0600 and "
                 "signing-key.pub.pem); env GPU_INSTALL_EVIDENCE_KEY_HOME; default <state dir>/evidence-signing")


def write_evidence(plan: Any, args: argparse.Namespace, output: str, reports: list[str]) -> Any:
    """Make the evidence (also apply --evidence's last step) and say where it went."""
    from pathlib import Path

    from installer import evidence, jsonout, kube

    kc = kube.resolve_kubeconfig(args.kubeconfig)
    made = evidence.create(
        plan, args.site, Path(output).expanduser(), kubeconfig=kc,
        bundle=Path(args.bundle).expanduser() if getattr(args, "bundle", None) else None,
        chart=getattr(args, "chart", None), reports=[Path(r).expanduser() for r in reports],
        ticket=getattr(args, "ticket", None), key_home=getattr(args, "key_home", None),
        sigstore=getattr(args, "sigstore_bundle", False), timeout=getattr(args, "ssh_timeout", 30.0),
        secrets=jsonout.secret_values(plan), progress=say(args))
    if made.key_created:
        print(f"evidence key generated: fingerprint {made.fingerprint} (pin {made.public_key} where evidence is "
              "verified)", file=sys.stderr)
    print(f"wrote {made.path} ({made.subjects} subjects, signed by evidence key {made.fingerprint}), {made.markdown}, "
          f"{made.public_key}")
    return made


def cmd_create(args: argparse.Namespace) -> int:
    plan = resolve_plan(args, need_inventory=True)
    write_evidence(plan, args, args.output, args.validate_report)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from installer import evidence, jsonout, kube
    from installer.errors import ConfigError

    with jsonout.json_document(args.json, jsonout.EVIDENCE_VERIFY, "evidence verify") as rec:
        verdict = evidence.Verdict(args.evidence)
        rec.doc.update(verdict.doc())
        plan = None
        kc = None
        if args.live and not (args.site and args.inventory):
            raise ConfigError("evidence verify --live needs the site file (-s) and the inventory (-i)",
                              hint="give -s site.yaml -i inventory (and --kubeconfig) of the cluster the evidence is of")
        if args.site:
            plan = resolve_plan(args, need_inventory=bool(args.inventory))
            rec.secrets += jsonout.secret_values(plan)
        if args.live:
            kc = kube.resolve_kubeconfig(args.kubeconfig)
        try:
            evidence.verify(Path(args.evidence).expanduser(), args.key,
                            bundle=Path(args.bundle).expanduser() if args.bundle else None,
                            files=[Path(f).expanduser() for f in args.file], plan=plan, site_path=args.site,
                            kubeconfig=kc, timeout=args.ssh_timeout,
                            secrets=jsonout.secret_values(plan) if plan else [], progress=say(args), verdict=verdict)
        finally:
            rec.doc.update(verdict.doc())
            for c in verdict.checks:
                mark = {"ok": "ok", "not checked": "--", "mismatch": "MISMATCH", "drift": "DRIFT"}[c["result"]]
                print(f"{mark:9} {c['kind']:9} {c['name']}: {c['detail']}")
        evidence.fail_if_bad(verdict)
        print(f"{args.evidence}: valid (signed by {verdict.keyid}; {len(verdict.subjects)} subjects"
              + ("; the live cluster matches" if args.live else "") + ")")
    return 0


def evidence_args(p: argparse.ArgumentParser) -> None:
    """The options apply --evidence shares with evidence create."""
    p.add_argument("--key-home", metavar="DIR", default=os.environ.get("GPU_INSTALL_EVIDENCE_KEY_HOME"),
                   help=KEY_HOME_HELP)
    p.add_argument("--ticket", metavar="ID", help="the change ticket the evidence is for (recorded in it)")
    p.add_argument("--bundle", metavar="DIR", help="the bundle the site was installed from: its lock and chart become "
                                                   "subjects")
    p.add_argument("--sigstore-bundle", action="store_true",
                   help="write the DSSE envelope inside a Sigstore bundle v0.3 (public-key hint = the key's "
                        "fingerprint; no transparency log)")


def register(sub: Any) -> None:
    from installer.cli.common import site_args

    esub = group(sub, "evidence", "signed install evidence: what runs where, what was shipped and validated "
                                  "(in-toto statement, DSSE, ECDSA P-256)", "evidence_command")
    q = command(esub, "create", "collect the evidence of the installed release (files, running images by digest, "
                                "nodes, helm, validate reports) and sign it with the site's evidence key")
    site_args(q)
    inventory_arg(q, required=True)
    kubeconfig_arg(q)
    evidence_args(q)
    q.add_argument("--validate-report", action="append", default=[], metavar="FILE",
                   help="a validate report (validate --json, or apply's) to record with its summary (repeatable)")
    q.add_argument("--chart", help="the chart archive the release was installed from (default: the site's "
                                   "operator.chart, else the bundle's)")
    q.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the evidence file (e.g. evidence.json); FILE's .md and .pub.pem are written beside it")
    q.add_argument("--ssh-timeout", type=seconds, default=30.0,
                   help="seconds to connect to a GPU node and read its facts (default 30)")
    quiet_arg(q)
    q.set_defaults(func=cmd_create)

    q = command(esub, "verify", "check evidence: its signature against pinned keys, its subjects against the files "
                                "given, with --live the running cluster (exit 0 valid, 2 bad input, 6 a mismatch)")
    q.add_argument("evidence", help="the evidence file (DSSE envelope or Sigstore bundle)")
    q.add_argument("--key", action="append", default=[], required=True, metavar="PEM",
                   help="a pinned evidence public key (repeatable: the current one and, while rotating, the one "
                        "before)")
    q.add_argument("--bundle", metavar="DIR", help="check the bundle's lock and chart against the subjects")
    q.add_argument("--file", action="append", default=[], metavar="FILE",
                   help="a file to check against the subject of its name (a validate report, the chart); repeatable")
    q.add_argument("-s", "--site", default=None,
                   help="the site file: check the redacted site and the rendered values subjects (needed by --live)")
    q.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a site field as the evidence was made with (repeatable; value is YAML)")
    inventory_arg(q)
    kubeconfig_arg(q)
    q.add_argument("--live", action="store_true",
                   help="also compare the running cluster with the evidence: images running in the operator's "
                        "namespace by digest, the GPU nodes (OS, kernel, driver, GPUs), the helm revision")
    q.add_argument("--ssh-timeout", type=seconds, default=30.0, help="with --live: seconds per GPU node (default 30)")
    json_arg(q, "gpu-install.evidence-verify/v1", "the verdict")
    quiet_arg(q)
    q.set_defaults(func=cmd_verify)
