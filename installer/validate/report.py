"""The validate report: one Check per node x check (passing ones too), as a terminal table, versioned JSON and JUnit
XML. Exit code: 5 when a node could not be reached, else 6 when any check failed, else 0 (warnings do not fail).
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from installer.errors import EXIT_OK, EXIT_UNREACHABLE, EXIT_VALIDATION

SCHEMA = "gpu-install.validate/v1"
LAYERS = ("node", "runtime", "cluster", "smoke", "mig", "metrics")
CLUSTER = "(cluster)"  # the node column of checks about the cluster as a whole
Status = Literal["pass", "fail", "warn", "skip", "unreachable"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "warn", "skip", "unreachable")


@dataclass(frozen=True)
class Check:
    layer: str
    check: str  # stable id, e.g. cluster.node-ready
    node: str  # Kubernetes node name, or CLUSTER
    status: Status
    message: str
    fix: str = ""
    gpu: str | None = None  # index or UUID when the check is about one GPU
    seconds: float = 0.0


@dataclass
class Report:
    release: str
    layers: tuple[str, ...]
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    def add(self, *checks: Check) -> None:
        self.checks.extend(checks)

    def exit_code(self) -> int:
        if any(c.status == "unreachable" for c in self.checks):
            return EXIT_UNREACHABLE
        if any(c.status == "fail" for c in self.checks):
            return EXIT_VALIDATION
        return EXIT_OK

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def nodes(self) -> list[str]:
        return sorted({c.node for c in self.checks}, key=lambda n: (n != CLUSTER, n))

    def to_json(self) -> dict[str, Any]:
        """The documented JSON (docs/validate.md): the envelope every --json document has (schema, version, command,
        timing, exitCode, error), then release, layers, summary, checks."""
        from installer import __version__

        return {
            "schema": SCHEMA,
            "version": __version__,
            "command": "validate",
            "release": self.release,
            "layers": list(self.layers),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "seconds": round(self.seconds, 3),
            "exitCode": self.exit_code(),
            "error": None,
            "summary": self.counts(),
            "checks": [{k: (round(v, 3) if k == "seconds" else v) for k, v in asdict(c).items()} for c in self.checks],
        }

    def to_junit(self) -> str:
        """JUnit XML: one testsuite per layer, one testcase per node x check (classname = layer.node)."""
        root = ET.Element("testsuites", name="gpu-install validate", tests=str(len(self.checks)),
                          failures=str(sum(c.status in ("fail", "unreachable") for c in self.checks)),
                          time=f"{self.seconds:.3f}")
        for layer in self.layers:
            cases = [c for c in self.checks if c.layer == layer]
            suite = ET.SubElement(root, "testsuite", name=layer, tests=str(len(cases)),
                                  failures=str(sum(c.status in ("fail", "unreachable") for c in cases)),
                                  skipped=str(sum(c.status == "skip" for c in cases)),
                                  time=f"{sum(c.seconds for c in cases):.3f}")
            for c in cases:
                name = c.check + (f"[gpu {c.gpu}]" if c.gpu is not None else "")
                case = ET.SubElement(suite, "testcase", classname=f"{layer}.{c.node}", name=name,
                                     time=f"{c.seconds:.3f}")
                text = c.message + (f"\nfix: {c.fix}" if c.fix else "")
                if c.status in ("fail", "unreachable"):
                    ET.SubElement(case, "failure", message=c.message, type=c.status).text = text
                elif c.status == "skip":
                    ET.SubElement(case, "skipped", message=c.message)
                else:
                    ET.SubElement(case, "system-out").text = text
        ET.indent(root)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

    def render(self, console: Any) -> None:
        """The terminal view: a table node x layer (worst status per cell), then every finding with its fix."""
        from rich.table import Table

        style = {"pass": "green", "warn": "yellow", "fail": "red", "unreachable": "red", "skip": "dim"}
        rank = {"skip": 0, "pass": 1, "warn": 2, "fail": 3, "unreachable": 4}
        table = Table(title=f"gpu-install validate ({self.release})", title_justify="left")
        table.add_column("node")
        for layer in self.layers:
            table.add_column(layer)
        for node in self.nodes():
            row = [node]
            for layer in self.layers:
                cell = [c for c in self.checks if c.node == node and c.layer == layer]
                if not cell:
                    row.append("")
                    continue
                worst = max(cell, key=lambda c: rank[c.status]).status
                ok = sum(c.status == "pass" for c in cell)
                row.append(f"[{style[worst]}]{worst}[/] {ok}/{len(cell)}")
            table.add_row(*row)
        console.print(table)
        for c in self.checks:
            if c.status in ("fail", "warn", "unreachable"):
                gpu = f" GPU {c.gpu}" if c.gpu is not None else ""
                console.print(f"[{style[c.status]}]{c.status.upper()}[/] {c.node}{gpu} {c.check}: {c.message}",
                              markup=True, highlight=False, soft_wrap=True)
                if c.fix:
                    console.print(f"    fix: {c.fix}", markup=False, highlight=False, soft_wrap=True)
        n = self.counts()
        console.print(f"{len(self.checks)} checks: {n['pass']} passed, {n['fail']} failed, {n['warn']} warnings, "
                      f"{n['unreachable']} unreachable, {n['skip']} skipped ({self.seconds:.1f}s)", highlight=False)
