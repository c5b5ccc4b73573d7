"""The options every command group shares, defined once, and the glue from parsed arguments to a resolved Plan.

argparse and os only at import time: `gpu-install --help` stays fast. Everything heavy is imported in the helpers.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.progress import Display

ENV_SITE = "GPU_INSTALL_SITE"
ENV_INVENTORY = "GPU_INSTALL_INVENTORY"
ENV_KUBECONFIG = "KUBECONFIG"
ENV_CHART = "GPU_INSTALL_CHART"
ENV_DEBUG = "GPU_INSTALL_DEBUG"



def debug_parent() -> argparse.ArgumentParser:
    """--debug, accepted before or after the subcommand (the later one only sets it, never clears it)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help=f"show tracebacks for unexpected errors; env {ENV_DEBUG}")
    return p


def command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A leaf command parser (takes --debug too)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, parents=[debug_parent()])
    return parser


def group(sub: Any, name: str, help: str, dest: str) -> Any:
    """A command group (`gpu-install operator …`) and its sub-parsers."""
    p = sub.add_parser(name, help=help)
    gsub = p.add_subparsers(dest=dest, metavar="ACTION")
    gsub.required = True
    return gsub


def site_args(p: argparse.ArgumentParser) -> None:
    """-s/--site (env GPU_INSTALL_SITE) and repeatable --set overrides."""
    p.add_argument("-s", "--site", default=os.environ.get(ENV_SITE), required=not os.environ.get(ENV_SITE),
                   help=f"site file (site.yaml); env {ENV_SITE}")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a site field, e.g. --set registry.host=reg.local:5000 (repeatable; value is YAML)")


def inventory_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    """-i/--inventory (env GPU_INSTALL_INVENTORY)."""
    p.add_argument("-i", "--inventory", default=os.environ.get(ENV_INVENTORY),
                   required=required and not os.environ.get(ENV_INVENTORY),
                   help=f"Ansible inventory (file or directory); env {ENV_INVENTORY}")


def node_flags(p: argparse.ArgumentParser) -> None:
    """--os/--kernel: the nodes' OS and kernel when there is no inventory; with one, --kernel the next kernels."""
    p.add_argument("--os", action="append", default=[], metavar="OSTAG",
                   help="node OS as ID+VERSION_ID (ubuntu22.04, rhel9.4, centos7); repeatable; used without -i")
    p.add_argument("--kernel", action="append", default=[], metavar="[OSTAG=]KERNEL",
                   help="a node kernel (uname -r), for the precompiled driver image and the kernel headers of "
                        "driver.mode host/runfile: without -i the kernel of the --os nodes, with -i a kernel the "
                        "inventory's nodes boot next (besides their gpu_install_kernel); OSTAG= names the OS it is "
                        "for (rhel8.10=4.18.0-553.el8_10.x86_64), required when the nodes run several OSes; repeatable")
    facts_arg(p)


def facts_arg(p: argparse.ArgumentParser) -> None:
    """--facts FILE: the nodes as `gpu-install nodes facts` read them."""
    p.add_argument("--facts", metavar="FILE",
                   help="the nodes' facts as `gpu-install nodes facts -i INVENTORY -o FILE` wrote them (OS, kernels, "
                        "architecture, NVSwitches, GPUs): with -i they fill what the inventory leaves unset (a value "
                        "it contradicts is refused), without -i they are the nodes; the kernels installed besides the "
                        "running one count as kernels the nodes boot next")


def kubeconfig_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None,
                   help=f"kubeconfig of the cluster; env {ENV_KUBECONFIG} (first existing entry), else ~/.kube/config")


def kube_version_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kube-version", metavar="VERSION",
                   help="the cluster's Kubernetes version (e.g. 1.27): refuse (exit 3) a release that cannot run on "
                        "it, without contacting a cluster")


def output_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help="write here instead of stdout")


def json_arg(p: argparse.ArgumentParser, schema: str, what: str = "the result") -> None:
    """--json FILE: every command's machine-readable document (installer.jsonout), written also when it fails."""
    p.add_argument("--json", metavar="FILE", help=f"also write {what} as JSON (schema {schema}, docs/json.md), also "
                                                  "when the command fails")


def seconds(text: str) -> float:
    """A timeout in seconds: a positive number (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: a timeout must be a positive number of seconds")
    return value


def quiet_arg(p: argparse.ArgumentParser, what: str = "no progress lines on stderr") -> None:
    p.add_argument("-q", "--quiet", action="store_true", help=what)


def verbose_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also skipped tasks, errors a task ignores, and diffs of unchanged files")


# ---------------------------------------------------------------- from arguments to the core


def resolve_plan(args: argparse.Namespace, need_inventory: bool = False) -> Plan:
    """Load the site (-s, --set) and resolve it once with the inventory / --os / --kernel / --limit given."""
    from installer.config import load_site
    from installer.plan import Options, resolve

    site = load_site(args.site, args.set)
    opts = Options(inventory=getattr(args, "inventory", None), os_tags=tuple(getattr(args, "os", None) or ()),
                   kernels=tuple(getattr(args, "kernel", None) or ()), limit=getattr(args, "limit", None),
                   need_inventory=need_inventory, kube_version=getattr(args, "kube_version", None),
                   facts=getattr(args, "facts", None))
    plan = resolve(site, opts)
    if not getattr(args, "quiet", False):
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
    return plan


def display(args: argparse.Namespace) -> Display:
    """The live progress display on stderr (a status line on a terminal, plain lines elsewhere); -q: none."""
    from installer.progress import Display

    return Display((lambda line: None) if getattr(args, "quiet", False) else sys.stderr,
                   verbose=getattr(args, "verbose", False))


def say(args: argparse.Namespace) -> Any:
    """A line sink for progress on stderr, or None with -q."""
    return None if getattr(args, "quiet", False) else (lambda line: print(line, file=sys.stderr, flush=True))


def output(text: str, path: str | None) -> None:
    """Write a command's result to -o PATH (atomically) or stdout."""
    if path and path != "-":
        from pathlib import Path

        from installer.errors import ConfigError
        from installer.util import atomic_write

        target = Path(path).expanduser()
        if target.is_dir():
            raise ConfigError(f"-o {path}: is a directory", hint="give a file name")
        if not target.parent.is_dir():
            raise ConfigError(f"-o {path}: directory {target.parent} does not exist", hint="create it first")
        try:
            atomic_write(target, text)
        except OSError as exc:
            raise ConfigError(f"-o {path}: cannot write it ({exc.strerror or exc})",
                              hint="choose a writable path; nothing else was changed") from None
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
