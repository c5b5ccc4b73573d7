"""`gpu-install preflight` and `gpu-install apply` (registered by installer.cli). Nothing heavy at import."""

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


def _run(args: argparse.Namespace, stage: str) -> int:
    import sys

    from installer import apply
    from installer.config import load_site

    from installer.progress import Display

    site = load_site(args.site, args.set)
    # live progress on stderr (a status line on a terminal, plain lines elsewhere); -q: nothing but the recap
    display = Display((lambda line: None) if args.quiet else sys.stderr, verbose=args.verbose)
    opts = apply.Options(
        inventory=args.inventory, limit=args.limit, tags=getattr(args, "tags", None),
        skip_tags=getattr(args, "skip_tags", None), check=getattr(args, "check", False),
        diff=getattr(args, "diff", False), progress=display.note, display=display,
    )
    try:
        if stage == "preflight":
            res = apply.preflight(site, opts)
            summary = f"preflight ok ({len(res.hosts)} hosts); artifacts: {res.artifacts}"
        else:
            _, res = apply.apply(site, opts)
            summary = (f"apply ok: {res.changed} changes{' (check mode)' if opts.check else ''}; "
                       f"artifacts: {res.artifacts}")
    finally:
        display.close()
        if display.runs:  # also when a stage failed: which hosts, how far, how long
            print(display.recap(), flush=True)
    print(summary)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="read-only checks of inventory and GPU nodes (exit 3 on problems)")
    _common(p)
    p.set_defaults(func=lambda a: _run(a, "preflight"))
    p = sub.add_parser("apply", help="preflight, then configure the GPU nodes (playbooks/site.yml)")
    _common(p)
    p.add_argument("--check", action="store_true", help="dry run: report what would change")
    p.add_argument("--diff", action="store_true", help="show file differences")
    p.add_argument("--tags", help="only tasks with these tags (e.g. runtime)")
    p.add_argument("--skip-tags", dest="skip_tags", help="skip tasks with these tags")
    p.set_defaults(func=lambda a: _run(a, "apply"))
