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
- batches: [{index, nodes, canary, status: pending | in-progress | done | failed, steps}] -- steps: the steps of
  the batch's last attempt as they ran, [{step, node | null, outcome: ok | failed}] (a step is recorded ok when the
  next one starts or the batch ends; the one that raised, failed);
- inProgress: {batch, node | null, step} | null -- the step running when the record was written;
- failure: {batch, nodes, exitCode, message} | null.

The file is untrusted input when read back (a hand edit, another version): load() reads it through
installer.safefile.read_json (size, depth, duplicate keys), checks every field's type and refuses (exit 2, naming the
field and the file) what does not fit; check_history() refuses a record the run cannot have written (a batch done
without its recorded validation, a batch done after one that is not).
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
STEP_OUTCOMES = ("ok", "failed")
#: the steps of a host-mode batch (installer.upgrade.host_rollout.HostBatch.run), per node or for the whole batch
HOST_STEPS = ("cordon", "drain", "driver", "reboot", "validate", "uncordon")


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
class StepRecord:
    step: str
    node: str | None
    outcome: Literal["ok", "failed"]


@dataclass
class BatchRecord:
    index: int
    nodes: list[str]
    canary: bool
    status: BatchStatus = "pending"
    steps: list[StepRecord] = field(default_factory=list)  # the last attempt's steps, in the order they ran


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
        steps: list[StepRecord] = []
        raw_steps = b.get("steps", [])  # absent in a record of an earlier version: no step recorded
        if not isinstance(raw_steps, list):
            raise _Bad(f"{where}steps: {type(raw_steps).__name__} where list belongs")
        for j, s in enumerate(raw_steps):
            at = f"{where}steps[{j}]."
            outcome = _get(s, "outcome", str, at)
            if outcome not in STEP_OUTCOMES:
                raise _Bad(f"{at}outcome: {outcome!r} is not one of {', '.join(STEP_OUTCOMES)}")
            steps.append(StepRecord(_get(s, "step", str, at), _get(s, "node", str, at, null=True), outcome))
        batches.append(BatchRecord(_get(b, "index", int, where), names, _get(b, "canary", bool, where), status,
                                   steps))
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
    file that is not a state record (read through installer.safefile.read_json: at most MAX_BYTES, nested at most
    64 levels, no key given twice)."""
    from installer.safefile import read_json

    if not path.exists():
        return None
    hint = "restore it, or remove it to start over with a new plan"
    doc = read_json(path, "upgrade state file", MAX_BYTES, hint=hint)
    try:
        return from_doc(doc)
    except _Bad as exc:
        raise ConfigError(f"upgrade state file {path}: {exc}", hint=hint) from None


# ---------------------------------------------------------------- what the run can have written


def redo_hint(rec: State, path: Path) -> str:
    """The way out of a record that does not hold together: the file the run wrote, a rollback, or starting over."""
    inv = f" -i {rec.inventory}" if rec.inventory else ""
    return (f"put back the file the run wrote; or undo the run: gpu-install upgrade rollback -s {rec.site}{inv} "
            f"--state {path} --yes; or, to abandon it, move the record aside (mv {path} {path}.abandoned) and plan "
            f"again (gpu-install upgrade plan -s {rec.site}{inv} -o FILE). Nothing was changed")


def expected_steps(driver_mode: str, nodes: list[str], reboot: bool) -> list[tuple[str, str | None]]:
    """The steps a batch passes, in the order the run records them (host_rollout.HostBatch.run; operator modes:
    apply._operator_batch's one step)."""
    if driver_mode not in ("host", "runfile"):
        return [("release", None)]
    def per_node(step: str) -> list[tuple[str, str | None]]:
        return [(step, n) for n in nodes]

    return [*per_node("cordon"), *per_node("drain"), ("driver", None), *(per_node("reboot") if reboot else []),
            ("validate", None), *per_node("uncordon")]


def _steps_text(steps: list[StepRecord]) -> str:
    return ", ".join(f"{s.step}{' ' + s.node if s.node else ''} {s.outcome}" for s in steps) or "none"


def check_history(rec: State, path: Path) -> None:
    """A record the run can have written, or ConfigError (exit 2) naming the file, the batch and what is wrong: the
    batches ran in order (done ones first, then at most one in progress or failed, then pending ones), a batch is
    done only with every step of it recorded passed (its validation included: the only way from failed to done),
    and phase done only with every batch done."""
    problems: list[str] = []
    seen_open: BatchRecord | None = None
    for b in rec.batches:
        where = f"batch {b.index} ({', '.join(b.nodes)})"
        if seen_open is not None and b.status != "pending":
            problems.append(f"{where} is recorded {b.status} after batch {seen_open.index} is {seen_open.status}: "
                            "the run does batches strictly in order")
            break
        if b.status != "done":
            seen_open = b
            continue
        got = [(s.step, s.node) for s in b.steps]
        options = [expected_steps(rec.driverMode, b.nodes, reboot) for reboot in (False, True)]
        passed = "validate" if rec.driverMode in ("host", "runfile") else "release"
        if not b.steps:
            problems.append(f"{where} is recorded done, but no step of it is recorded (its {passed} among them)")
        elif any(s.outcome != "ok" for s in b.steps) or got not in options:
            problems.append(f"{where} is recorded done, but its recorded steps are not a passed run of the batch "
                            f"(recorded: {_steps_text(b.steps)}; a done batch has every step ok, its {passed} "
                            "included)")
        if problems:
            break
    if not problems and rec.phase == "done" and any(b.status != "done" for b in rec.batches):
        problems.append("phase is done, but batch(es) " + ", ".join(str(b.index) for b in rec.batches
                                                                  if b.status != "done") + " are not")
    if problems:
        raise ConfigError(f"upgrade state file {path}: {problems[0]}", hint=redo_hint(rec, path))
