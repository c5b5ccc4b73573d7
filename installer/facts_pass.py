"""`gpu-install nodes facts`: one read-only pass over the inventory's GPU nodes (group gpu_nodes, after --limit),
installer.node_facts.SCRIPT run on each over SSH with validate's connection (installer/validate/probe.py: the
inventory's ansible_* connection variables, ssh args and known_hosts rules), all nodes at once, a timeout per node.

A node that cannot be reached is recorded with its error and the others are still read; the caller turns any such
node into exit 5 (HostsUnreachable) after the document is written.
"""

from __future__ import annotations

import getpass
import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from installer import node_facts
from installer.facts import NODE_NAME_VAR


@dataclass(frozen=True)
class HostFacts:
    host: str  # inventory host name
    node: str  # Kubernetes node name (gpu_install_node_name, else the host name)
    via: str  # ssh USER@ADDRESS:PORT (how it was read)
    read_at: str  # UTC, YYYY-MM-DDTHH:MM:SSZ, when the read started
    seconds: float
    facts: node_facts.NodeFacts | None  # None: unreachable
    error: str | None = None
    hint: str | None = None


def targets(inventory: Any) -> list[Any]:
    """The GPU nodes of an installer.plan.Inventory as validate's SSH targets (probe.Target)."""
    from installer.plan import gpu_host_vars
    from installer.validate.probe import Target

    return [Target(host, str(hv.get(NODE_NAME_VAR) or host), hv) for host, hv in gpu_host_vars(inventory)]


def command() -> str:
    """The command line sent to the node: the script given to sh (no Python, nothing written)."""
    return f"sh -c {shlex.quote(node_facts.SCRIPT)}"


def read(targets: Sequence[Any], timeout: float = 30.0, progress: Callable[[str], None] | None = None,
         *, runner: Callable[[Any, str, float, int], bytes] | None = None) -> list[HostFacts]:
    """Every target's facts, read at once; by host name. runner: how a command's output is read from a target
    (default: installer.validate.probe.run_bounded, at most node_facts.MAX_OUTPUT + 1 bytes)."""
    import paramiko

    from installer.validate import probe
    from installer.validate.knownhosts import HostKeyRefused

    run = runner or probe.run_bounded

    def one(t: Any) -> HostFacts:
        v = t.vars
        via = (f"ssh {v.get('ansible_user') or getpass.getuser()}@{v.get('ansible_host') or t.host}:"
               f"{v.get('ansible_port') or 22}")
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.monotonic()
        try:
            raw = run(t, command(), timeout, node_facts.MAX_OUTPUT)
        except (paramiko.SSHException, HostKeyRefused, OSError, ValueError, EOFError) as exc:
            message, hint = probe.unreachable(t, exc)
            if progress:
                progress(f"facts: {t.host}: unreachable: {message}")
            return HostFacts(t.host, t.node, via, started, round(time.monotonic() - t0, 3), None, message, hint)
        facts = node_facts.parse(raw)
        seconds = round(time.monotonic() - t0, 3)
        if progress:
            progress(f"facts: {t.host}: {node_facts.summary(facts)} ({seconds:.1f}s)")
            for p in facts.problems:
                progress(f"facts: {t.host}: problem: {p}")
        return HostFacts(t.host, t.node, via, started, seconds, facts)

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        return sorted(pool.map(one, targets), key=lambda h: h.host)


def host_json(h: HostFacts) -> dict[str, Any]:
    """A host's entry in gpu-install.node-facts/v1 (docs/json.md)."""
    return {"host": h.host, "node": h.node, "via": h.via, "readAt": h.read_at, "seconds": h.seconds,
            "error": None if h.error is None else {"message": h.error, "hint": h.hint},
            "facts": None if h.facts is None else node_facts.facts_json(h.facts)}
