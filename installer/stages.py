"""A command as a list of named stages, run in order by one small runner (apply and uninstall: installer.pipeline).

A Stage is a name, a precondition (`skip`: None when the stage runs, else the reason it does not) and `run`, which
does the work and returns a Result: its outcome word (ok, changed, unchanged, would change, removed, ...) and a
detail. A stage fails by raising a GpuInstallError, or by returning a Result with an error (it ran to its end and its
finding is a failure: validate's report).

The runner records one Row per stage, for EVERY stage of the list, whatever happened:

    the Result's outcome        the stage ran
    skipped   <reason>          its precondition said so
    failed    <message>         it raised (or returned an error)
    not run   <stage> failed    a stage before it failed

then raises the failure (the same exception, so the exit code is the stage's). The rows are the stage table printed
after the command (table(), also when a stage failed) and its machine-readable form (records()).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from installer.errors import GpuInstallError

OK, CHANGED, UNCHANGED, WOULD_CHANGE = "ok", "changed", "unchanged", "would change"
SKIPPED, FAILED, NOT_RUN = "skipped", "failed", "not run"
DETAIL_MAX = 300  # characters of a detail in the table (an error's full message is printed by the CLI)


def _runs() -> str | None:
    return None


def _message(exc: GpuInstallError) -> str:
    return exc.message


@dataclass(frozen=True)
class Result:
    """What a stage's run returns."""

    outcome: str
    detail: str = ""
    error: BaseException | None = None  # set: the stage failed with this detail, and the runner raises it


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[], Result]
    skip: Callable[[], str | None] = _runs  # the precondition: None, or why the stage does not run
    failure: Callable[[GpuInstallError], str] = _message  # the failed row's detail from the stage's error


@dataclass(frozen=True)
class Row:
    """One line of the stage table."""

    name: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        """The row as a --json output would carry it."""
        return {"name": self.name, "outcome": self.outcome, "reason": self.detail, "seconds": self.seconds}


def changed(n: int | bool, check: bool) -> str:
    """The outcome of a stage that changed n things (check mode: would have)."""
    return (WOULD_CHANGE if check else CHANGED) if n else UNCHANGED


def _failed(stage: Stage, exc: BaseException) -> Result:
    if isinstance(exc, GpuInstallError):
        return Result(FAILED, stage.failure(exc), exc)
    if isinstance(exc, KeyboardInterrupt):
        return Result(FAILED, "cancelled", exc)
    # the CLI prints the message (or, with --debug, the traceback); the table names only the kind of error
    return Result(FAILED, f"internal error: {type(exc).__name__}", exc)


def run(stages: Sequence[Stage], rows: list[Row]) -> list[Row]:
    """Run the stages in order, appending one Row per stage to rows (as each finishes, so a caller printing rows
    after an interruption sees them); after a failure the later stages are not run. Raises the failed stage's
    exception once every stage has its row."""
    failed: tuple[str, BaseException] | None = None
    for stage in stages:
        if failed is not None:
            rows.append(Row(stage.name, NOT_RUN, f"{failed[0]} failed"))
            continue
        start = time.monotonic()
        try:
            reason = stage.skip()
            res = Result(SKIPPED, reason) if reason is not None else stage.run()
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - recorded, then raised again below
            res = _failed(stage, exc)
        outcome = FAILED if res.error is not None else res.outcome
        rows.append(Row(stage.name, outcome, res.detail[:DETAIL_MAX],
                        0.0 if outcome == SKIPPED else round(time.monotonic() - start, 3)))
        if res.error is not None:
            failed = (stage.name, res.error)
    if failed is not None:
        raise failed[1]
    return rows


def table(title: str, rows: Sequence[Row]) -> str:
    """The stage table: stage, outcome, detail (a failed stage in capitals, to be found at a glance)."""
    from installer.ui import table as text_table

    return text_table(title, ["stage", "outcome", "detail"],
                      [(r.name, r.outcome.upper() if r.outcome == FAILED else r.outcome, r.detail) for r in rows])


def records(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [r.record() for r in rows]
