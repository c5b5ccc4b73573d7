#!/usr/bin/env python3
"""Generate docs/cli.md, the command reference, from the CLI's own parser (every command, flag, default and
environment variable). tests/unit/test_cli_reference.py fails when the file and the parser drift apart.

    .venv/bin/python scripts/gen-cli-doc.py [-o docs/cli.md]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent

# Every environment variable gpu-install (and its lab) reads; tests/unit/test_cli_reference.py checks that each
# GPU_INSTALL_* name used in the code is here.
ENVIRONMENT = {
    "GPU_INSTALL_SITE": "default for `-s/--site` (the site file)",
    "GPU_INSTALL_INVENTORY": "default for `-i/--inventory`",
    "GPU_INSTALL_CHART": "default for `--chart` (apply, operator install); else the site's `operator.chart`",
    "KUBECONFIG": "kubeconfig when `--kubeconfig` is not given (first existing entry), else `~/.kube/config`",
    "GPU_INSTALL_DEBUG": "any value: like `--debug` (tracebacks for unexpected errors)",
    "GPU_INSTALL_CATALOG": "a catalog directory to use instead of the shipped one (`<release>.yaml` + `keys/`)",
    "GPU_INSTALL_HELM": "a helm binary to use instead of the sha256-verified helm 3.18.0 fetched into the cache",
    "GPU_INSTALL_CACHE": "cache root (default `$XDG_CACHE_HOME/gpu-install`, i.e. `~/.cache/gpu-install`): "
                         "`tools/` (helm), `collections/` (the link Ansible finds gpu_install.node through), and for the lab "
                         "`rootfs/`, `kubernetes/`, `packages/`",
    "GPU_INSTALL_STATE": "state root (default `$XDG_STATE_HOME/gpu-install`, i.e. `~/.local/state/gpu-install`): "
                         "`runs/<time>-<playbook>/`, one 0700 ansible-runner record per node run",
    "GPU_INSTALL_SIGNING_HOME": "GnuPG home of the site's package signing key (`mirror push --repo-dir`; generated "
                                "there on first use and kept; default `<state root>/signing`)",
    "GPU_INSTALL_STAGING_DIR": "where `mirror push` makes its private staging directory (0700, removed afterwards; "
                               "every bundle file is copied there and checked before it is used; needs as much free "
                               "space as the bundle's files; default the system's temporary directory; "
                               "`--staging-dir` overrides it)",
    "GPU_INSTALL_BUNDLE_KEY_HOME": "directory of the bundle signing key (Ed25519) that `mirror pull` signs the bundle lock "
                                   "with (generated there on first use and kept; its public half `signing-key.pub.pem` is "
                                   "what the air-gapped side pins in `mirror.trustedKeys`; default "
                                   "`<state root>/bundle-signing`; `--key-home` overrides it)",
    "GPU_INSTALL_EVIDENCE_KEY_HOME": "directory of the evidence key (ECDSA P-256) that `evidence create` and `apply "
                                     "--evidence` sign install evidence with (generated there on first use and kept; "
                                     "its public half `signing-key.pub.pem`, exported beside each evidence file, is "
                                     "what verifiers pin; default `<state root>/evidence-signing`; `--key-home` "
                                     "overrides it)",
    "GPU_INSTALL_API_TIMEOUT": "seconds every Kubernetes API request may take: `CONNECT,READ` (or one number for both; "
                               "default `10,30`); a request with no answer is exit 5 naming the API server",
    "GPU_INSTALL_HELM_TIMEOUT": "seconds a helm command that waits for nothing (status, template, show chart) may run "
                                "before it is stopped (default 600; install/upgrade/uninstall: `--timeout` + 120)",
    "GPU_INSTALL_ANSIBLE_TIMEOUT": "seconds one playbook run may take before it is stopped, exit 4 naming the hosts "
                                   "still running and their task (default 14400)",
    "GPU_INSTALL_LAB_DIR": "lab: default for `--lab-dir` (default `/var/lib/gpu-install/lab`)",
    "GPU_INSTALL_LAB_MIRROR": "lab: Debian mirror for the first node rootfs build (default `http://deb.debian.org/debian`)",
}
# set by scripts and CI, read by the scripts/tests rather than by gpu-install itself
DEVELOPMENT = {
    "GPU_INSTALL_DEMO_DIR": "scripts/demo: where the demo keeps its lab, site file, bundle and run records "
                            "(default `/var/lib/gpu-install/demo`)",
    "GPU_INSTALL_HAMI_CHART": "tests: HAMi's chart (its charts/hami directory or a .tgz) to render gpu-install's "
                              "HAMi values with (default `../shared/upstream/charts/hami-2.10.0.tgz`)",
    "GPU_INSTALL_NOS_CHART": "tests: nos' chart (its helm-charts/nos directory at tag 0.1.2, or a .tgz) to render "
                             "gpu-install's nos values with (default `../shared/upstream/charts/nos-0.1.2.tgz`)",
    "GPU_INSTALL_NO_APT": "scripts/bootstrap: skip the system packages",
    "GPU_INSTALL_NO_KUBERNETES": "scripts/bootstrap: do not build the lab's Kubernetes binaries",
    "GPU_INSTALL_REQUIRE_LAB": "tests: a missing lab prerequisite fails instead of skipping (set by CI)",
    "GPU_INSTALL_REQUIRE_KUBERNETES": "tests: a missing lab control plane fails instead of skipping (set by CI)",
    "GPU_INSTALL_REQUIRE_TOOLS": "tests: a missing tool (helm, containerd, ansible-lint) fails instead of skipping "
                                 "(set by CI)",
    "GPU_INSTALL_TEST_LAB_DIR": "tests: use this lab directory for the session lab",
    "GPU_INSTALL_LAB_WORKERS": "tests: how many lab test modules `scripts/test` runs at once (default 2; 1: one at a time)",
    "GPU_INSTALL_WHEELHOUSE": "tests: the wheelhouse `scripts/gpu-check --prepare DIR` filled, for the `gpu` test to "
                              "install gpu-install offline (else it builds the wheel and installs online)",
    "GPU_INSTALL_UPDATE_GOLDEN": "tests: rewrite the golden values files (review the diff)",
    "GPU_INSTALL_FACTS_ROOT": "tests: read by the `nodes facts` script (where it runs, not by gpu-install): a directory "
                              "put before every file path it reads (/etc, /usr/lib, /lib/modules, /boot, /sys), so a "
                              "test points it at a tree it made; unset on real nodes",
    "GPU_INSTALL_PCI_IDS": "tests: a pci.ids file to re-derive installer/data/nvidia-pci-ids.tsv from (default "
                           "`/usr/share/misc/pci.ids`; byte for byte when it is the file the table names)",
}


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return []


def _option(action: argparse.Action) -> tuple[str, str, str]:
    if action.option_strings:
        flag = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.nargs != 0:
            metavar = action.metavar or (action.dest.upper() if not action.choices else "{" + ",".join(action.choices) + "}")
            flag += f" {metavar}"
    else:
        flag = f"`{action.metavar or action.dest}`"
    default = action.default
    if default is argparse.SUPPRESS or default in (None, False, [], ""):
        shown = "required" if action.required and action.option_strings else "-"
    else:
        shown = f"`{default}`"
    if not action.option_strings:
        shown = "required"
    help_text = (action.help or "").replace("|", "\\|").replace("%%", "%")
    if action.choices and action.option_strings:
        help_text += f" (one of: {', '.join(map(str, action.choices))})"
    return flag, shown, help_text


def _section(out: list[str], path: str, help_text: str, parser: argparse.ArgumentParser) -> None:
    subs = _subcommands(parser)
    actions = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction,
                                                                   argparse._VersionAction)) and a.dest != "debug"]
    if actions or not subs:
        out.append(f"### `{path}`\n")
        if help_text:
            out.append(help_text[0].upper() + help_text[1:] + ".\n")
        out.append("| option | default | meaning |")
        out.append("|---|---|---|")
        for a in actions:
            out.append("| {} | {} | {} |".format(*_option(a)))
        out.append("")
    for name, sub_help, sub in subs:
        _section(out, f"{path} {name}", sub_help, sub)


def reference() -> str:
    """docs/cli.md as the parser defines it (built without any GPU_INSTALL_* variables set: defaults as shipped)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPU_INSTALL_") and k != "KUBECONFIG"}
    with mock.patch.dict(os.environ, clean, clear=True):
        sys.path.insert(0, str(ROOT))
        from installer.cli import build_parser

        parser = build_parser()
    out = ["# gpu-install command reference", "",
           "Generated from the parser by `scripts/gen-cli-doc.py`; `tests/unit/test_cli_reference.py` fails when it "
           "drifts. Exit codes: see the README. `--debug` is accepted before or after a command.", "",
           "## Commands", ""]
    for name, help_text, _ in _subcommands(parser):
        out.append(f"- `gpu-install {name}` — {help_text}")
    out += ["", "## Environment variables", "", "| variable | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in ENVIRONMENT.items()]
    out += ["", "Development and CI only:", "", "| variable | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in DEVELOPMENT.items()]
    out += ["", "## Options", ""]
    top = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    out += ["### `gpu-install`\n", "| option | default | meaning |", "|---|---|---|"]
    out += ["| {} | {} | {} |".format(*_option(a)) for a in top]
    out.append("")
    for name, help_text, sub in _subcommands(parser):
        _section(out, f"gpu-install {name}", help_text, sub)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "cli.md")
    args = ap.parse_args()
    args.output.write_text(reference())
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
