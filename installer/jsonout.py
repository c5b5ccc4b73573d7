"""The `--json FILE` documents of preflight, apply, operator status and catalog show|diff (validate's is
installer.validate.report): one TypedDict per schema, checked with pydantic before it is written, and the writer.

Every document carries the same envelope: `schema` (its versioned id, e.g. gpu-install.apply/v1), `version` (of
gpu-install), `command`, `started`, `seconds`, `exitCode` (the command's own exit code) and `error` (null, or what
made the command fail: the message the terminal shows, its hint and exit code). The file is written also when the
command fails, atomically (a temporary file in the same directory, then renamed), and never holds a credential:
the values of the site's secret variables (passwords and tokens -- a user name is not one) and the user:password part
of a URL are replaced with "***" in the document's string values, never in its keys or its envelope's own fields
(schema, version, command, started).

Versioning: a field may be added to a schema within its version (readers ignore fields they do not know); a field
removed, renamed or given another type or meaning makes a new version (…/v2). docs/json.md documents each schema.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from installer.errors import EXIT_CANCELLED, EXIT_INTERNAL, ConfigError, GpuInstallError
from installer.patterns import strip_userinfo

PREFLIGHT = "gpu-install.preflight/v1"
APPLY = "gpu-install.apply/v1"
OPERATOR_STATUS = "gpu-install.operator-status/v1"
CATALOG_SHOW = "gpu-install.catalog-show/v1"
CATALOG_DIFF = "gpu-install.catalog-diff/v1"
UPGRADE_PLAN = "gpu-install.upgrade-plan/v1"
UPGRADE_APPLY = "gpu-install.upgrade-apply/v1"
UPGRADE_ROLLBACK = "gpu-install.upgrade-rollback/v1"
EVIDENCE_VERIFY = "gpu-install.evidence-verify/v1"
VALIDATE = "gpu-install.validate/v1"
NODE_FACTS = "gpu-install.node-facts/v1"
REDACTED = "***"
_STRICT = ConfigDict(extra="forbid", strict=True)


# ---------------------------------------------------------------- the shapes (docs/json.md)


@with_config(_STRICT)
class ErrorInfo(TypedDict):
    type: str  # the error's class: ConfigError, PreflightError, ClusterError, ... (internal: InternalError)
    message: str
    hint: str | None
    exitCode: int


@with_config(_STRICT)
class HostResult(TypedDict):
    host: str
    ok: int
    changed: int
    failed: int
    unreachable: int
    skipped: int
    seconds: float


@with_config(_STRICT)
class PlaybookRun(TypedDict):
    playbook: str
    seconds: float
    hosts: list[HostResult]


@with_config(_STRICT)
class TaskFailure(TypedDict):
    playbook: str
    host: str
    task: str
    message: str
    unreachable: bool


@with_config(_STRICT)
class StageRecord(TypedDict):
    name: str
    outcome: str
    reason: str
    seconds: float


@with_config(_STRICT)
class _Envelope(TypedDict):
    schema: str
    version: str
    command: str
    started: str
    seconds: float
    exitCode: int
    error: ErrorInfo | None


@with_config(_STRICT)
class PreflightDoc(_Envelope):
    release: str | None
    notes: list[str]
    runs: list[PlaybookRun]
    failures: list[TaskFailure]


@with_config(_STRICT)
class ValidateCheck(TypedDict):
    layer: str
    check: str
    node: str
    status: Literal["pass", "fail", "warn", "skip", "unreachable"]
    message: str
    fix: str
    gpu: str | None
    seconds: float


@with_config(_STRICT)
class ValidateDoc(_Envelope):
    """gpu-install.validate/v1 (installer.validate.report.Report.to_json; docs/validate.md). A validate that fails
    before it checks anything (a site file it refuses, options that do not go together) still writes it: no checks,
    `error` set, `release` empty when the site was not read."""

    release: str
    layers: list[str]
    summary: dict[str, int]
    checks: list[ValidateCheck]


@with_config(_STRICT)
class ApplyDoc(_Envelope):
    release: str | None
    checkMode: bool
    stages: list[StageRecord]
    nodesChanged: int | None
    runs: list[PlaybookRun]
    failures: list[TaskFailure]
    validate: ValidateDoc | None


@with_config(_STRICT)
class NamespaceState(TypedDict):
    name: str
    phase: str | None


@with_config(_STRICT)
class PullSecretState(TypedDict):
    name: str
    present: bool
    type: str | None
    registries: list[str]
    managedByGpuInstall: bool


@with_config(_STRICT)
class HelmReleaseState(TypedDict):
    name: str
    installed: bool
    revision: int | None
    status: str | None
    chart: str | None


@with_config(_STRICT)
class OperatorStatusDoc(_Envelope):
    release: str | None
    namespace: NamespaceState | None
    pullSecret: PullSecretState | None
    helmRelease: HelmReleaseState | None
    deployed: bool


@with_config(_STRICT)
class KubeRange(TypedDict):
    min: str | None
    max: str | None
    reason: str
    validated: list[str] | None
    source: str


@with_config(_STRICT)
class Platforms(TypedDict):
    series: str
    kubernetes: KubeRange
    driverOs: dict[str, list[str]]
    driverOsSource: str


@with_config(_STRICT)
class ComponentInfo(TypedDict):
    name: str
    enabled: bool | None
    gates: list[str]
    image: str | None
    osSuffix: bool
    userSupplied: bool


@with_config(_STRICT)
class CatalogShowDoc(_Envelope):
    release: str | None
    nfdChart: str | None
    components: list[ComponentInfo]
    platforms: Platforms | None


@with_config(_STRICT)
class ComponentChange(TypedDict):
    name: str
    change: Literal["added", "removed", "changed"]
    imageFrom: str | None
    imageTo: str | None
    enabledFrom: bool | None
    enabledTo: bool | None


@with_config(_STRICT)
class DefaultChange(TypedDict):
    key: str
    valueFrom: Any
    valueTo: Any


@with_config(_STRICT)
class KeysChange(TypedDict):
    added: list[str]
    removed: list[str]


@with_config(_STRICT)
class KubeChange(TypedDict):
    changed: bool
    rangeFrom: KubeRange | None
    rangeTo: KubeRange | None


@with_config(_STRICT)
class DriverOsChange(TypedDict):
    added: dict[str, list[str]]
    removed: dict[str, list[str]]


@with_config(_STRICT)
class CatalogDiffDoc(_Envelope):
    releaseFrom: str | None
    releaseTo: str | None
    components: list[ComponentChange]
    defaults: list[DefaultChange]
    valuesKeys: KeysChange | None
    kubernetes: KubeChange | None
    driverOs: DriverOsChange | None


@with_config(_STRICT)
class UpgradeRelease(TypedDict):
    name: str
    namespace: str
    revision: int
    chart: str
    status: str | None


@with_config(_STRICT)
class UpgradeComponent(TypedDict):
    component: str
    current: str | None
    target: str | None


@with_config(_STRICT)
class UpgradeBlocker(TypedDict):
    where: str
    what: str
    fix: str


@with_config(_STRICT)
class UpgradeNode(TypedDict):
    name: str
    action: Literal["none", "operand-restart", "driver-reload", "host-reboot"]
    evicts: list[str]
    blockers: list[UpgradeBlocker]
    cordoned: bool
    ready: bool
    present: bool
    upgradeState: str | None


@with_config(_STRICT)
class UpgradeBatch(TypedDict):
    index: int
    nodes: list[str]
    canary: bool


@with_config(_STRICT)
class UpgradeRollback(TypedDict):
    can: list[str]
    cannot: list[str]


@with_config(_STRICT)
class UpgradePlanDoc(_Envelope):
    kubernetesVersion: str | None
    release: UpgradeRelease | None
    targetVersion: str | None
    components: list[UpgradeComponent]
    valuesDiff: list[str]
    crdChanges: list[str]
    findings: list[str]
    nodes: list[UpgradeNode]
    batches: list[UpgradeBatch]
    maxParallel: int
    maxUnavailable: str
    blockers: list[UpgradeBlocker]
    rollback: UpgradeRollback | None
    nothingToDo: bool
    planHash: str | None
    applyCommand: str | None


FactsPciDeviceDoc = TypedDict("FactsPciDeviceDoc", {  # noqa: UP013 - "class" cannot be a class-syntax field
    "address": str, "deviceId": str, "class": str, "kind": Literal["gpu", "nvswitch", "other"], "name": str | None,
    "chip": str | None, "architecture": str | None})
FactsPciDeviceDoc.__pydantic_config__ = _STRICT  # type: ignore[attr-defined]


@with_config(_STRICT)
class FactsRuntime(TypedDict):
    name: str
    version: str | None
    text: str


@with_config(_STRICT)
class NodeFactsValues(TypedDict):
    osId: str | None
    osVersion: str | None
    os: str | None
    kernel: str | None
    kernelsInstalled: list[str]
    architecture: str | None
    secureBoot: Literal["on", "off", "off (no EFI)", "unknown"]
    gpuCount: int
    gpuModels: dict[str, int]
    gpuArchitectures: list[str]
    nvswitchCount: int
    pciDevices: list[FactsPciDeviceDoc]
    runtimes: list[FactsRuntime]
    problems: list[str]


@with_config(_STRICT)
class FactsError(TypedDict):
    message: str
    hint: str | None


@with_config(_STRICT)
class FactsHost(TypedDict):
    host: str
    node: str
    via: str
    readAt: str
    seconds: float
    error: FactsError | None
    facts: NodeFactsValues | None


@with_config(_STRICT)
class NodeFactsDoc(_Envelope):
    """gpu-install.node-facts/v1 (`gpu-install nodes facts -o FILE`; docs/json.md, docs/nodes.md)."""

    inventory: str | None
    limit: str | None
    hosts: list[FactsHost]


@with_config(_STRICT)
class EvidenceCheck(TypedDict):
    kind: Literal["signature", "subject", "live"]
    name: str  # the key's fingerprint, a subject (kind:name), or a live fact (image:…, node:…/driver, helm)
    result: Literal["ok", "mismatch", "drift", "not checked"]
    detail: str


@with_config(_STRICT)
class EvidenceVerifyDoc(_Envelope):
    file: str
    keyid: str | None  # the pinned key that verified the signature
    predicateType: str | None
    subjects: int
    live: bool
    valid: bool
    checks: list[EvidenceCheck]


@with_config(_STRICT)
class UpgradeRevision(TypedDict):
    revision: int
    chart: str


@with_config(_STRICT)
class UpgradeApplyRelease(TypedDict):
    name: str
    namespace: str
    previous: UpgradeRevision | None
    applied: UpgradeRevision | None


@with_config(_STRICT)
class UpgradeApplyBatch(TypedDict):
    index: int
    nodes: list[str]
    canary: bool
    status: str
    seconds: float | None


@with_config(_STRICT)
class UpgradeApplyFailure(TypedDict):
    batch: int | None
    nodes: list[str]
    exitCode: int
    message: str


@with_config(_STRICT)
class UpgradeApplyDoc(_Envelope):
    planFile: str
    planHash: str | None
    statePath: str | None
    resumed: bool
    nothingToDo: bool
    targetVersion: str | None
    release: UpgradeApplyRelease | None
    phase: str | None
    batches: list[UpgradeApplyBatch]
    failure: UpgradeApplyFailure | None


@with_config(_STRICT)
class UpgradeRollbackRelease(TypedDict):
    name: str
    namespace: str
    fromRevision: int
    fromChart: str
    toRevision: int
    toChart: str
    why: str
    newRevision: int | None


@with_config(_STRICT)
class UpgradeRollbackNode(TypedDict):
    name: str
    batch: int
    now: str | None
    to: str | None
    action: str


@with_config(_STRICT)
class UpgradeRollbackOrphan(TypedDict):
    apiVersion: str
    kind: str
    name: str
    namespace: str | None
    action: str


@with_config(_STRICT)
class UpgradeRollbackDoc(_Envelope):
    applied: bool
    release: UpgradeRollbackRelease | None
    valuesDiff: list[str]
    cannotUndo: list[str]
    driverMode: str | None
    nodes: list[UpgradeRollbackNode]
    statePath: str | None
    archivedState: str | None
    orphans: list[UpgradeRollbackOrphan]


SHAPES: dict[str, Any] = {
    PREFLIGHT: PreflightDoc,
    APPLY: ApplyDoc,
    OPERATOR_STATUS: OperatorStatusDoc,
    CATALOG_SHOW: CatalogShowDoc,
    CATALOG_DIFF: CatalogDiffDoc,
    UPGRADE_PLAN: UpgradePlanDoc,
    UPGRADE_APPLY: UpgradeApplyDoc,
    UPGRADE_ROLLBACK: UpgradeRollbackDoc,
    EVIDENCE_VERIFY: EvidenceVerifyDoc,
    VALIDATE: ValidateDoc,
    NODE_FACTS: NodeFactsDoc,
}


def json_schema(schema: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a document, from its TypedDict."""
    from pydantic import TypeAdapter

    out: dict[str, Any] = TypeAdapter(SHAPES[schema]).json_schema()
    out["properties"]["schema"] = {"const": schema, "title": "Schema", "type": "string"}
    return out


def check(doc: Mapping[str, Any]) -> None:
    """The document has its schema's shape (pydantic, strict: no missing, unknown or mistyped field)."""
    from pydantic import TypeAdapter

    TypeAdapter(SHAPES[str(doc["schema"])]).validate_python(doc)


# ---------------------------------------------------------------- building and writing


def envelope(schema: str, command: str) -> dict[str, Any]:
    """A document's envelope at the start of the command (exitCode 0, no error until one happens)."""
    from installer import __version__

    return {"schema": schema, "version": __version__, "command": command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": 0.0, "exitCode": 0,
            "error": None}


def error_info(exc: BaseException) -> ErrorInfo:
    if isinstance(exc, GpuInstallError):
        return {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint, "exitCode": exc.exit_code}
    if isinstance(exc, KeyboardInterrupt):
        return {"type": "Cancelled", "message": "cancelled", "hint": None, "exitCode": EXIT_CANCELLED}
    return {"type": "InternalError", "message": f"{type(exc).__name__}: {exc}",
            "hint": "re-run with --debug for a traceback and report it", "exitCode": EXIT_INTERNAL}


def secret_values(plan: Any) -> list[str]:
    """The values of the site's secret variables set now: registry.pullSecret.passwordEnv (a user name is not a
    secret: hiding it turned every 'gpu' of a document into '***' when the user was gpu)."""
    ps = getattr(plan, "pull_secret", None) if plan is not None else None
    name = ps.passwordEnv if ps else None
    value = os.environ.get(name) if name else None
    return [value] if value else []


#: a secret at least this long is hidden wherever it appears in a text; a shorter one only where it is a whole
#: value or a whole word (not glued to letters or digits): replacing "abc" inside every text would mangle messages
#: and paths while hiding nothing a guess would not find
MIN_EMBEDDED = 4
#: the envelope's fields gpu-install writes itself, never a secret: left as they are, so that a secret that happens
#: to be a part of the schema name or the command cannot break the document
_OWN_FIELDS = ("schema", "version", "command", "started")


def hide(text: str, secrets: Iterable[str] = ()) -> str:
    """text with each secret replaced with *** (a whole value, a whole word, or -- MIN_EMBEDDED characters or
    more -- anywhere inside it) and every URL's user:password@ with ***@."""
    hidden = sorted({s for s in secrets if s}, key=len, reverse=True)
    if text in hidden:
        return REDACTED
    for s in hidden:
        if len(s) >= MIN_EMBEDDED:
            text = text.replace(s, REDACTED)
        else:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(s)}(?![A-Za-z0-9])", REDACTED, text)
    return strip_userinfo(text)


def redact(value: Any, secrets: Iterable[str] = ()) -> Any:
    """value with secrets hidden (hide()) in its string leaves -- never in a mapping's keys, and not in a document
    envelope's own fields (schema, version, command, started)."""
    hidden = [s for s in secrets if s]

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return hide(v, hidden)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    if isinstance(value, dict) and value.get("schema") in SHAPES:  # a document: its envelope's own fields stay
        return {k: x if k in _OWN_FIELDS else walk(x) for k, x in value.items()}
    return walk(value)


def check_target(path: str) -> Path:
    """--json FILE can be written: checked before the command does anything (exit 2)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"--json {path}: is a directory", hint="give a file name")
    if not target.parent.is_dir():
        raise ConfigError(f"--json {path}: directory {target.parent} does not exist", hint="create it first")
    if not os.access(target.parent, os.W_OK):
        raise ConfigError(f"--json {path}: directory {target.parent} is not writable", hint="choose a writable path")
    return target


def write(path: str | os.PathLike[str], doc: Mapping[str, Any], secrets: Iterable[str] = ()) -> None:
    """Check the document against its schema, then write it as JSON atomically (temporary file + rename)."""
    from installer.util import atomic_write

    clean = redact(dict(doc), secrets)
    check(clean)
    atomic_write(path, json.dumps(clean, indent=2, ensure_ascii=False) + "\n")


class Recorder:
    """One --json document being filled while its command runs: the command sets fields on `doc` (and may add the
    credential values to hide to `secrets`); json_document() writes it however the command ends."""

    def __init__(self, schema: str, command: str):
        self.doc: dict[str, Any] = envelope(schema, command)
        self.secrets: list[str] = []
        self._t0 = time.monotonic()

    def finish(self, exit_code: int, exc: BaseException | None = None) -> None:
        self.doc["seconds"] = round(time.monotonic() - self._t0, 3)
        self.doc["exitCode"] = exit_code
        self.doc["error"] = error_info(exc) if exc is not None else None


@contextmanager
def json_document(path: str | None, schema: str, command: str) -> Iterator[Recorder]:
    """`with json_document(args.json, SCHEMA, "apply") as rec: ... rec.doc["exitCode"] = rc`: without --json a recorder that
    writes nothing; with it the file is written when the block ends -- also when it raises (the error, its exit code
    and what was filled in by then), and then the exception goes on to the CLI's exit code."""
    target = check_target(path) if path else None
    rec = Recorder(schema, command)
    try:
        yield rec
    except BaseException as exc:
        if target is not None and isinstance(exc, Exception | KeyboardInterrupt):
            rec.finish(error_info(exc)["exitCode"], exc)
            _write_or_warn(target, rec)
        raise
    else:
        rec.finish(int(rec.doc["exitCode"]))
        if target is not None:
            _write_or_warn(target, rec)


def _write_or_warn(target: Path, rec: Recorder) -> None:
    try:
        write(target, rec.doc, rec.secrets)
    except OSError as exc:  # the command's own outcome stays its exit code; the file's problem is said
        print(f"error: --json {target}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
        return
    print(f"wrote {target}", file=sys.stderr)


# ---------------------------------------------------------------- pieces several documents share


def playbook_runs(runs: Iterable[tuple[str, Mapping[str, Any], float]]) -> list[PlaybookRun]:
    """installer.progress.Display.runs (playbook, host -> HostRecap, seconds) as documented PlaybookRun entries."""
    out: list[PlaybookRun] = []
    for playbook, hosts, seconds in runs:
        out.append({"playbook": playbook, "seconds": round(float(seconds), 3), "hosts": [
            {"host": h, "ok": r.ok, "changed": r.changed, "failed": r.failed, "unreachable": r.unreachable,
             "skipped": r.skipped, "seconds": round(float(r.seconds), 3)} for h, r in sorted(hosts.items())]})
    return out


def recording_display(out: Any, verbose: bool = False) -> Any:
    """An installer.progress.Display that also keeps each task failure of the runs it is shown (the rule
    installer.ansible uses for a run's failures: failed or unreachable, errors the task ignores left out), for the
    documents' `failures`: a run that fails raises before its RunResult reaches the command."""
    from installer.progress import Display, message

    class RecordingDisplay(Display):
        def __init__(self) -> None:
            super().__init__(out, verbose=verbose)
            self.failures: list[TaskFailure] = []
            self._playbook = ""

        def start_run(self, playbook: str, *args: Any, **kwargs: Any) -> None:
            self._playbook = playbook
            super().start_run(playbook, *args, **kwargs)

        def event(self, event: dict[str, Any]) -> None:
            kind = event.get("event", "")
            data = event.get("event_data") or {}
            if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
                self.failures.append({"playbook": self._playbook, "host": str(data.get("host")),
                                      "task": str(data.get("task", "")), "message": message(data.get("res") or {}),
                                      "unreachable": kind == "runner_on_unreachable"})
            super().event(event)

    return RecordingDisplay()
