"""`gpu-install nodes facts`: what the GPU nodes are, read from the nodes (installer/facts_pass.py), as a
gpu-install.node-facts/v1 document (docs/nodes.md#node-facts, docs/json.md)."""

from __future__ import annotations

import argparse
from typing import Any

from installer.cli.common import command, group, inventory_arg, json_arg, quiet_arg, say, seconds


def cmd_facts(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from installer import facts_pass, jsonout, node_facts
    from installer.errors import HostsUnreachable
    from installer.plan import load_inventory

    paths = list(dict.fromkeys(p for p in (args.output, args.json) if p))
    for path in paths[1:]:
        jsonout.check_target(path)  # exit 2 before any node is contacted, as json_document does for the first
    with ExitStack() as stack:
        # -o FILE is the document `mirror plan/pull --facts` will read, --json FILE the same document where CI expects
        # every command's; both are written however the command ends (a refused inventory: no hosts, the error). The
        # copies are written once the first is finished (ExitStack: last in, first out), so all are the same bytes.
        first: list[jsonout.Recorder] = []
        stack.callback(_copies, paths[1:], first)
        first.append(stack.enter_context(jsonout.json_document(paths[0] if paths else None, jsonout.NODE_FACTS,
                                                               "nodes facts")))
        doc = first[0].doc
        doc.update(inventory=args.inventory, limit=args.limit, hosts=[])
        inventory = load_inventory(args.inventory, args.limit)
        targets = facts_pass.targets(inventory)
        progress = say(args)
        if progress:
            progress(f"facts: {len(targets)} GPU node(s) over SSH")
        hosts = facts_pass.read(targets, args.ssh_timeout, progress)
        doc["hosts"] = [facts_pass.host_json(h) for h in hosts]
        for h in hosts:
            print(f"{h.host}: unreachable: {h.error}" if h.facts is None else
                  f"{h.host}: {node_facts.summary(h.facts)}")
        down = [h for h in hosts if h.facts is None]
        if down:
            raise HostsUnreachable(
                f"{len(down)} of {len(hosts)} GPU node(s) could not be read: " + "; ".join(
                    h.error or h.host for h in down),
                hint=(down[0].hint or "") + (" (the other nodes' facts are recorded)" if len(down) < len(hosts)
                                             else ""))
    return 0


def _copies(paths: list[str], first: list[Any]) -> None:
    """The first document's copies (--json FILE beside -o FILE); none when the first could not even start."""
    import sys

    from installer import jsonout

    for path in paths if first else []:
        try:
            jsonout.write(path, first[0].doc, first[0].secrets)
        except OSError as exc:
            print(f"error: --json {path}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
            continue
        print(f"wrote {path}", file=sys.stderr)


def register(sub: Any) -> None:
    nsub = group(sub, "nodes", "what the GPU nodes are, read from the nodes", "nodes_command")
    q = command(nsub, "facts", "read-only: per GPU node its OS, running and installed kernels, architecture, Secure "
                               "Boot state, NVIDIA GPUs and NVSwitches on the PCI bus (no driver needed) and container "
                               "runtime, over SSH (exit 5 when a node cannot be read; the others are recorded)")
    inventory_arg(q, required=True)
    q.add_argument("--limit", help="only these hosts (Ansible pattern)")
    q.add_argument("-o", "--output", metavar="FILE",
                   help="write the facts as JSON (schema gpu-install.node-facts/v1) to FILE, also when a node cannot "
                        "be read (its error recorded, the others' facts kept)")
    json_arg(q, "gpu-install.node-facts/v1", "the facts (the same document as -o)")
    q.add_argument("--ssh-timeout", type=seconds, default=30.0,
                   help="seconds to connect to a node and again to read its facts (default 30); a node that does "
                        "not answer is unreachable (exit 5)")
    quiet_arg(q, "no progress lines on stderr")
    q.set_defaults(func=cmd_facts)

