"""Command-line layer: parse, call the core, print, map the result to an exit code.

One module per command group (render/images/config, catalog, preflight/apply/uninstall, operator, mig); the
options they share are defined once in installer.cli.common; main() is the ONE place that exits. Command groups
shipped outside the product (the lab, installed with the [lab] extra) register through the entry-point group
`gpu_install.commands`. Everything heavy is imported inside the handlers so that `gpu-install --help` and
`gpu-install render` start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from installer import __version__
from installer.cli import catalog, evidence, facts, mig, mirror, nodes, operator, render, upgrade, validate
from installer.cli.common import ENV_DEBUG
from installer.errors import EXIT_CANCELLED, EXIT_INTERNAL, EXIT_OK, GpuInstallError

PLUGIN_GROUP = "gpu_install.commands"
GROUPS = (render, catalog, nodes, facts, operator, mig, mirror, validate, upgrade, evidence)


def register_plugins(sub: Any) -> None:
    """Command groups from other distributions/packages (entry points); one whose dependencies are missing is left
    out (e.g. `lab` without the [lab] extra)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            register = ep.load()
        except ModuleNotFoundError:
            continue
        register(sub)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser. Given the command line, the entry-point groups are looked up only when its command is not
    one of the product's own (importlib.metadata's scan of every installed distribution is a tenth of a cold
    `render`)."""
    parser = argparse.ArgumentParser(
        prog="gpu-install",
        description="Take the NVIDIA GPU nodes of a Kubernetes cluster from bare metal to validated.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-install {__version__}")
    parser.add_argument("--debug", action="store_true", default=bool(os.environ.get(ENV_DEBUG)),
                        help=f"show tracebacks for unexpected errors (also after the command); env {ENV_DEBUG}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in GROUPS:
        mod.register(sub)
    command = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    if command is None or command not in sub.choices:
        register_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except GpuInstallError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return EXIT_CANCELLED
    except BrokenPipeError:  # `gpu-install … | head`: the reader went away, not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors are reported
        if args.debug:
            raise
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("  hint: re-run with --debug for a traceback and report it", file=sys.stderr)
        return EXIT_INTERNAL
    return int(rc or 0)
