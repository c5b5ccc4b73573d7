"""Command-line layer: parse, call the core, print, map the result to an exit code.

This is the ONE place that exits. Everything heavy is imported inside the handlers so that
`gpu-install --help` and `gpu-install render` start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from installer import __version__
from installer.cliargs import inventory_arg, site_args
from installer.errors import EXIT_CANCELLED, EXIT_INTERNAL, EXIT_OK, GpuInstallError

def _output(text: str, path: str | None) -> None:
    if path and path != "-":
        from installer.util import atomic_write

        atomic_write(path, text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)


# ---------------------------------------------------------------- handlers


def cmd_render(args: argparse.Namespace) -> int:
    from installer.config import load_site
    from installer.facts import node_facts
    from installer.render.values import render_values, values_to_yaml

    site = load_site(args.site, args.set)
    nodes = node_facts(args.inventory, os_tags=args.os, kernels=args.kernel)
    values = render_values(site, nodes=nodes)
    _output(values_to_yaml(values, site), args.output)
    return EXIT_OK


def cmd_images(args: argparse.Namespace) -> int:
    import json

    from installer.artifacts import image_list
    from installer.config import load_site
    from installer.facts import node_facts

    site = load_site(args.site, args.set)
    nodes = node_facts(args.inventory, os_tags=args.os, kernels=args.kernel)
    images = image_list(site, nodes=nodes)
    if args.format == "json":
        text = json.dumps([i.as_dict() for i in images], indent=2) + "\n"
    else:
        text = "".join(f"{i.source} {i.destination}\n" for i in images)
    _output(text, args.output)
    return EXIT_OK


def cmd_config_schema(args: argparse.Namespace) -> int:
    import json

    from installer.config import site_schema

    _output(json.dumps(site_schema(), indent=2, sort_keys=True) + "\n", args.output)
    return EXIT_OK


def cmd_config_sample(args: argparse.Namespace) -> int:
    from installer.config import sample_site

    _output(sample_site(), args.output)
    return EXIT_OK


def cmd_config_check(args: argparse.Namespace) -> int:
    from installer.config import load_site

    site = load_site(args.site, args.set)
    print(f"{args.site}: ok (GPU Operator {site.operator.version}, registry {site.registry.host})")
    return EXIT_OK


def cmd_catalog_list(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog

    cat = Catalog.default()
    for rel in cat.releases():
        print(rel)
    return EXIT_OK


def cmd_catalog_show(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog

    rel = Catalog.default().get(args.release)
    print(f"GPU Operator {rel.version}  (NFD chart {rel.nfd_chart_version})")
    print(f"{'component':28} {'enabled':8} {'also needs':30} image")
    for comp in rel.components.values():
        enabled = {True: "yes", False: "no", None: "-"}[comp.enabled]
        gates = ",".join(g.removesuffix(".enabled") for g in comp.gates) or "-"
        suffix = "  (+ -<osTag>)" if comp.os_suffix else ""
        print(f"{comp.name:28} {enabled:8} {gates:30} {comp.image_ref or '(user supplied)'}{suffix}")
    return EXIT_OK


def cmd_catalog_diff(args: argparse.Namespace) -> int:
    from installer.catalog import Catalog

    cat = Catalog.default()
    for line in cat.diff(args.a, args.b):
        print(line)
    return EXIT_OK


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-install",
        description="Take the NVIDIA GPU nodes of a Kubernetes cluster from bare metal to validated.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-install {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        default=bool(os.environ.get("GPU_INSTALL_DEBUG")),
        help="show tracebacks for unexpected errors; env GPU_INSTALL_DEBUG",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def node_args(p: argparse.ArgumentParser) -> None:
        inventory_arg(p)
        p.add_argument(
            "--os",
            action="append",
            default=[],
            metavar="OSTAG",
            help="node OS as ID+VERSION_ID (ubuntu22.04, rhel9.4, centos7); repeatable; used without -i",
        )
        p.add_argument(
            "--kernel",
            action="append",
            default=[],
            metavar="KERNEL",
            help="node kernel (uname -r) for precompiled driver images; repeatable; used without -i",
        )
        p.add_argument("-o", "--output", help="write here instead of stdout")

    p = sub.add_parser("render", help="render Helm values for the pinned GPU Operator release")
    site_args(p)
    node_args(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("images", help="list every image the install will pull: source → destination")
    site_args(p)
    node_args(p)
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_images)

    p = sub.add_parser("config", help="site file: schema, sample, check")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    q = csub.add_parser("schema", help="print the JSON schema of site.yaml")
    q.add_argument("-o", "--output")
    q.set_defaults(func=cmd_config_schema)
    q = csub.add_parser("sample", help="print a commented sample site.yaml")
    q.add_argument("-o", "--output")
    q.set_defaults(func=cmd_config_sample)
    q = csub.add_parser("check", help="validate a site file")
    site_args(q)
    q.set_defaults(func=cmd_config_check)

    p = sub.add_parser("catalog", help="pinned GPU Operator releases")
    csub = p.add_subparsers(dest="catalog_command", metavar="ACTION")
    csub.required = True
    q = csub.add_parser("list", help="list catalog releases")
    q.set_defaults(func=cmd_catalog_list)
    q = csub.add_parser("show", help="show the components of a release")
    q.add_argument("release")
    q.set_defaults(func=cmd_catalog_show)
    q = csub.add_parser("diff", help="what changes between two releases")
    q.add_argument("a")
    q.add_argument("b")
    q.set_defaults(func=cmd_catalog_diff)

    _register_optional(sub, "installer.apply_cli")
    register_plugins(sub)
    _register_optional(sub, "installer.operator_cli")
    _register_optional(sub, "installer.mig_cli")
    return parser


def _register_optional(sub: argparse._SubParsersAction, module: str) -> None:
    """Sub-command groups that live in their own package expose register(subparsers)."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:  # package not there yet in this checkout
        if exc.name != module:
            raise
        return
    register: Callable[[argparse._SubParsersAction], None] = mod.register
    register(sub)


def register_plugins(sub: argparse._SubParsersAction) -> None:
    """Command groups shipped outside the product package (entry points "gpu_install.commands", e.g. `lab`
    from gpu_install_lab). One whose extra is not installed fails to load and adds no command."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="gpu_install.commands"):
        try:
            register = ep.load()
        except ModuleNotFoundError:  # e.g. gpu-install without [lab]
            continue
        register(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
