"""The record of one `gpu-install upgrade apply` run (schema gpu-install.upgrade-state/v1, docs/upgrade.md "The state
file"): what `--resume` continues from and what `upgrade rollback` goes back to.

Where: `$GPU_INSTALL_STATE/upgrade/<namespace>.<release>.json` (default `~/.local/state/gpu-install/upgrade/`, beside
the `runs/` records of the node playbooks), one file per Helm release, or `--state FILE`. Written atomically (a temp
file in the same directory, fsync, rename: installer.util.atomic_write) after every step, so a `kill -9` leaves either
the state before a step or the state after it, never half a file; mode 0600 (it names nodes and the release, never
credentials: no values are stored, only their hash).

Fields (stable; `upgrade rollback` reads `release.previous` and `nodes.*.previousDriverVersion`):
- planHash, site, inventory, started, updated: the plan applied and when;
- target: {version, valuesHash} -- the release and sha256 of the rendered values the run deploys;
- driverMode: the site's driver.mode (host, runfile, operator, precompiled);
- release: {name, namespace, previous: {revision, chart} | null, applied: {revision, chart} | null} -- the revision
  deployed before the run, and the one `helm upgrade` made (null until it ran);
- phase: "checked" (nothing changed yet), "held" (operator mode: skip labels set), "upgrading" (helm upgrade
  started), "released" (helm upgrade done),
  "done" (every batch done), "failed" (a batch failed: see failure);
- nodes: {NODE: {previousDriverVersion: str | null, cordonedBefore: bool, bootIdBefore: str | null}};
- batches: [{index, nodes, canary, status: pending | in-progress | done | failed}];
- inProgress: {batch, node | null, step} | null -- the step running when the record was written;
- failure: {batch, nodes, exitCode, message} | null.

The file is untrusted input when read back (a hand edit, another version): load() checks every field's type and
refuses (exit 2, naming the field and the file) what does not fit.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from installer.errors import ConfigError

SCHEMA = "gpu-install.upgrade-state/v1"
MAX_BYTES = 16 << 20  # a record of thousands of nodes is a few MB

Phase = Literal["checked", "held", "upgrading", "released", "done", "failed"]
BatchStatus = Literal["pending", "in-progress", "done", "failed"]
PHASES = ("checked", "held", "upgrading", "released", "done", "failed")
BATCH_STATUSES = ("pending", "in-progress", "done", "failed")


def default_path(namespace: str, release: str) -> Path:
    from installer.ansible import state_dir

    return state_dir() / "upgrade" / f"{namespace}.{release}.json"


def values_hash(values: Any) -> str:
    raw = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(raw.encode()).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Revision:
    revision: int
    chart: str


@dataclass
class NodeRecord:
    previousDriverVersion: str | None
    cordonedBefore: bool
    bootIdBefore: str | None = None  # the Node's boot ID before the driver role ran (host modes: was it rebooted?)


@dataclass
class BatchRecord:
    index: int
    nodes: list[str]
    canary: bool
    status: BatchStatus = "pending"


@dataclass
class InProgress:
    batch: int
    node: str | None
    step: str


@dataclass
class Failure:
    batch: int | None
    nodes: list[str]
    exitCode: int
    message: str


@dataclass
class State:
    planHash: str
    site: str
    inventory: str | None
    targetVersion: str
    targetValuesHash: str
    driverMode: str
    releaseName: str
    releaseNamespace: str
    previous: Revision | None
    nodes: dict[str, NodeRecord]
    batches: list[BatchRecord]
    applied: Revision | None = None
    phase: Phase = "checked"
    inProgress: InProgress | None = None
    failure: Failure | None = None
    started: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)

    # ------------------------------------------------------------ queries

    def pending(self) -> list[BatchRecord]:
        """The batches still to run, in order (a batch in progress or failed runs again from its start)."""
        return [b for b in self.batches if b.status != "done"]

    def done_nodes(self) -> list[str]:
        return [n for b in self.batches if b.status == "done" for n in b.nodes]

    @property
    def touched(self) -> bool:
        """Something in the cluster was changed by this run (the plan hash no longer describes the cluster)."""
        return self.phase != "checked"

    # ------------------------------------------------------------ the file

    def to_doc(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "planHash": self.planHash,
            "site": self.site,
            "inventory": self.inventory,
            "started": self.started,
            "updated": self.updated,
            "target": {"version": self.targetVersion, "valuesHash": self.targetValuesHash},
            "driverMode": self.driverMode,
            "release": {"name": self.releaseName, "namespace": self.releaseNamespace,
                        "previous": None if self.previous is None else asdict(self.previous),
                        "applied": None if self.applied is None else asdict(self.applied)},
            "phase": self.phase,
            "nodes": {n: asdict(r) for n, r in self.nodes.items()},
            "batches": [asdict(b) for b in self.batches],
            "inProgress": None if self.inProgress is None else asdict(self.inProgress),
            "failure": None if self.failure is None else asdict(self.failure),
        }

    def save(self, path: Path) -> None:
        from installer.util import atomic_write

        self.updated = _now()
        atomic_write(path, json.dumps(self.to_doc(), indent=2, ensure_ascii=False) + "\n", mode=0o600)


# ---------------------------------------------------------------- reading it back (untrusted)


class _Bad(Exception):
    pass


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str, *, null: bool = False) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _Bad(f"{where}{key}: missing")
    value = obj[key]
    if value is None and null:
        return None
    if isinstance(value, bool) and kind is not bool and (kind is int or (isinstance(kind, tuple) and int in kind)):
        raise _Bad(f"{where}{key}: {value!r} is not a number")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise _Bad(f"{where}{key}: {type(value).__name__} where {names} belongs")
    return value


def _revision(obj: Any, where: str) -> Revision | None:
    if obj is None:
        return None
    return Revision(_get(obj, "revision", int, where), _get(obj, "chart", str, where))


def from_doc(doc: Any) -> State:
    """A State from the JSON document; _Bad naming the field when it does not fit."""
    if not isinstance(doc, dict):
        raise _Bad("the document is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise _Bad(f"schema {doc.get('schema')!r}, not {SCHEMA}")
    target = _get(doc, "target", dict, "")
    rel = _get(doc, "release", dict, "")
    nodes: dict[str, NodeRecord] = {}
    for name, rec in _get(doc, "nodes", dict, "").items():
        where = f"nodes.{name}."
        boot = rec.get("bootIdBefore") if isinstance(rec, dict) else None
        if boot is not None and not isinstance(boot, str):
            raise _Bad(f"{where}bootIdBefore: {type(boot).__name__} where str belongs")
        nodes[str(name)] = NodeRecord(_get(rec, "previousDriverVersion", str, where, null=True),
                                      _get(rec, "cordonedBefore", bool, where), boot)
    batches: list[BatchRecord] = []
    for i, b in enumerate(_get(doc, "batches", list, "")):
        where = f"batches[{i}]."
        status = _get(b, "status", str, where)
        if status not in BATCH_STATUSES:
            raise _Bad(f"{where}status: {status!r} is not one of {', '.join(BATCH_STATUSES)}")
        names = _get(b, "nodes", list, where)
        if not all(isinstance(n, str) for n in names):
            raise _Bad(f"{where}nodes: not a list of node names")
        batches.append(BatchRecord(_get(b, "index", int, where), names, _get(b, "canary", bool, where), status))
    phase = _get(doc, "phase", str, "")
    if phase not in PHASES:
        raise _Bad(f"phase: {phase!r} is not one of {', '.join(PHASES)}")
    prog = _get(doc, "inProgress", dict, "", null=True)
    fail = _get(doc, "failure", dict, "", null=True)
    return State(
        planHash=_get(doc, "planHash", str, ""), site=_get(doc, "site", str, ""),
        inventory=_get(doc, "inventory", str, "", null=True),
        targetVersion=_get(target, "version", str, "target."), targetValuesHash=_get(target, "valuesHash", str,
                                                                                      "target."),
        driverMode=_get(doc, "driverMode", str, ""), releaseName=_get(rel, "name", str, "release."),
        releaseNamespace=_get(rel, "namespace", str, "release."),
        previous=_revision(_get(rel, "previous", dict, "release.", null=True), "release.previous."),
        applied=_revision(_get(rel, "applied", dict, "release.", null=True), "release.applied."),
        nodes=nodes, batches=batches, phase=phase,
        inProgress=None if prog is None else InProgress(_get(prog, "batch", int, "inProgress."),
                                                        _get(prog, "node", str, "inProgress.", null=True),
                                                        _get(prog, "step", str, "inProgress.")),
        failure=None if fail is None else Failure(_get(fail, "batch", int, "failure.", null=True),
                                                  list(_get(fail, "nodes", list, "failure.")),
                                                  _get(fail, "exitCode", int, "failure."),
                                                  _get(fail, "message", str, "failure.")),
        started=_get(doc, "started", str, ""), updated=_get(doc, "updated", str, ""))


def load(path: Path) -> State | None:
    """The state recorded at path, None when there is none; ConfigError (exit 2) naming the file and the field for a
    file that is not a state record."""
    from installer.safefile import read_text

    if not path.exists():
        return None
    text = read_text(path, "upgrade state file", MAX_BYTES)
    try:
        return from_doc(json.loads(text))
    except ValueError as exc:
        raise ConfigError(f"upgrade state file {path}: not JSON ({exc})",
                          hint="restore it, or remove it to start over with a new plan") from None
    except _Bad as exc:
        raise ConfigError(f"upgrade state file {path}: {exc}",
                          hint="restore it, or remove it to start over with a new plan") from None
