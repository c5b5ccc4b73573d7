"""Terminal output on `rich`: a console for a stream, tables, and the progress of long transfers.

rich is imported inside the functions and classes that draw, never at import time (`gpu-install --help` and
`render` stay fast). Off a terminal (CI, pipes, files, TERM=dumb) everything here is plain text: no escape codes,
no colour, no box-drawing. Characters a stream cannot encode become '?', and a closed stream or a broken pipe never
raises: output is best effort and must not stop an install.

- make_console(stream, tty=...): a rich Console writing to a stream through SafeStream;
- table(title, columns, rows) -> str: aligned columns as plain text (the recap, stage summaries, catalog listings);
  print_table(...) prints the same table, with a bold header and a rule under it when the stream is a terminal;
- TransferProgress: bytes or items of long transfers (mirror copying images): rich's progress bars with size,
  speed and time left on a terminal; elsewhere a plain line per transfer at every `step` percent or after
  `interval` seconds, whichever comes first, and one when it is done.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console

# control characters (ESC, CR, BEL, ...) in text from elsewhere: a task name, a message from a remote host
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

ColumnSpec = str | tuple[str, str]  # a header, or (header, "left" | "right" | "center")


def printable(text: str) -> str:
    """Text made safe to print: a tab becomes a space, other control characters (escape sequences) '?'.

    Newlines stay (the callers split lines)."""
    return _CONTROL.sub("?", text.replace("\t", " "))


def is_terminal(stream: Any) -> bool:
    """A stream the live displays may draw on: a tty, and TERM is not 'dumb'."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
    except (OSError, ValueError):  # a closed stream
        return False


class SafeStream:
    """A text stream as rich's Console (and the plain writers) see it: characters the stream's encoding lacks become
    '?', and a closed stream or broken pipe is ignored (rich would otherwise exit the process on a broken pipe)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        try:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:
                enc = getattr(self.stream, "encoding", None) or "ascii"
                self.stream.write(text.encode(enc, errors="replace").decode(enc))
        except (OSError, ValueError):  # broken pipe, closed stream
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return is_terminal(self.stream)


def make_console(stream: TextIO | None = None, *, tty: bool | None = None, width: int | None = None) -> Console:
    """A rich Console on stream (default stderr). tty None: ask the stream. Off a terminal: no colour, no escape codes.

    Markup, emoji codes and highlighting are off: what is printed is the text given, never interpreted."""
    from rich.console import Console

    stream = sys.stderr if stream is None else stream
    if tty is None:
        tty = is_terminal(stream)
    return Console(file=SafeStream(stream),  # type: ignore[arg-type]
                   force_terminal=tty, force_interactive=tty, width=width,
                   color_system="auto" if tty else None, no_color=None if tty else True,
                   highlight=False, markup=False, emoji=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------------------- tables


def _cell(value: Any) -> str:
    return "" if value is None else printable(str(value))


def _rich_table(columns: Sequence[ColumnSpec], rows: list[Sequence[Any]], *, styled: bool,
                ascii_only: bool = True) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    rule = None
    if styled:  # a rule under the header; ASCII where the stream cannot show box-drawing characters
        rule = box.SIMPLE_HEAD if not ascii_only else box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n",
                                                              ascii=True)
    # two spaces between columns: the padding either side, or (with a rule) the padding on the right and the box's
    # column divider (a space): the same layout with and without the rule
    t = Table(box=rule, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0) if styled else (0, 1),
              header_style="bold" if styled else "", highlight=False)
    for i, col in enumerate(columns):
        name, justify = (col, "") if isinstance(col, str) else col
        if not justify:  # numbers to the right
            cells = [r[i] for r in rows if i < len(r) and r[i] is not None and r[i] != ""]
            numeric = cells and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in cells)
            justify = "right" if numeric else "left"
        t.add_column(Text(printable(name)), justify=justify, no_wrap=not styled)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(*(Text(_cell(c)) for c in r))
    return t


def table(title: str, columns: Sequence[ColumnSpec], rows: Iterable[Sequence[Any]]) -> str:
    """Rows in aligned columns under a header (and the title above, when given), as plain text: no escape codes,
    no box-drawing, no trailing spaces, never wrapped. columns: headers, or (header, "left"|"right"|"center")
    pairs; a column given by its header alone is right-aligned when all its cells are numbers. Cells: str(value)."""
    from rich.console import Console

    rows = [list(r) for r in rows]
    buf = io.StringIO()
    # wide enough for any table: rendered at its natural width, never wrapped (rows are not padded to the width)
    console = Console(file=buf, width=1_000_000, force_terminal=False, color_system=None, no_color=True,
                      highlight=False, markup=False, emoji=False)
    console.print(_rich_table(columns, rows, styled=False))
    lines = [ln.rstrip() for ln in buf.getvalue().splitlines()]
    return "\n".join(([printable(title)] if title else []) + lines)


def print_table(title: str, columns: Sequence[ColumnSpec], rows: Iterable[Sequence[Any]],
                file: TextIO | Console | None = None, *, tty: bool | None = None) -> None:
    """Print table(title, columns, rows) on file (default stdout) or a rich Console. On a terminal the title and
    header are bold with a rule under the header (ASCII when the stream's encoding is not UTF); elsewhere exactly
    table()'s text."""
    from rich.console import Console
    from rich.text import Text

    rows = [list(r) for r in rows]
    if isinstance(file, Console):
        console = file
    else:
        stream = sys.stdout if file is None else file
        if not (is_terminal(stream) if tty is None else tty):
            out = SafeStream(stream)
            out.write(table(title, columns, rows) + "\n")
            out.flush()
            return
        console = make_console(stream, tty=True)
    if not console.is_terminal:
        console.print(Text(table(title, columns, rows)), soft_wrap=True)
        return
    if title:
        console.print(Text(printable(title), style="bold"))
    console.print(_rich_table(columns, rows, styled=True, ascii_only=not console.encoding.lower().startswith("utf")))


# ---------------------------------------------------------------------------------------------------- transfers


def _clock_text(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on."""
    s = max(int(seconds + 0.5), 0)
    h, rest = divmod(s, 3600)
    return f"{h:d}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:d}:{rest % 60:02d}"


def _size(n: float) -> str:
    from rich.filesize import decimal

    return decimal(int(n))


class Transfer:
    """One transfer of a TransferProgress (from add()): advance()/update() as it goes, done() at the end.

    As a context manager: done() when the block ends, a "stopped at" line when it raises."""

    def __init__(self, owner: TransferProgress, description: str, total: int | None):
        self._owner = owner
        self.description = printable(description).replace("\n", " ")
        self.total = total
        self.completed = 0
        self.started = owner._clock()
        self.finished = False
        self._last_line = self.started
        self._last_step = 0
        self._task: Any = None  # rich TaskID on a terminal

    def advance(self, n: int = 1) -> None:
        """n more bytes (or items) done."""
        self._owner._update(self, self.completed + n, None)

    def update(self, completed: int | None = None, *, total: int | None = None) -> None:
        """Set what is done so far (and the total, when it became known)."""
        self._owner._update(self, self.completed if completed is None else completed, total)

    def done(self) -> None:
        """The transfer finished: its line "<description>: done, <amount> in <time> (<speed>)"."""
        self._owner._finish(self, ok=True)

    def stop(self) -> None:
        """The transfer ends unfinished (an error): its line "<description>: stopped at <amount>"."""
        self._owner._finish(self, ok=False)

    def __enter__(self) -> Transfer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.done()
        else:
            self.stop()

    # the plain-line texts
    def _rate(self, now: float) -> float | None:
        elapsed = now - self.started
        return self.completed / elapsed if elapsed > 0 and self.completed else None

    def _amount(self) -> str:
        unit = self._owner.unit
        if unit == "bytes":
            if self.total is None:
                return _size(self.completed)
            return f"{_size(self.completed)} / {_size(self.total)} ({self._percent()}%)"
        if self.total is None:
            return f"{self.completed} {unit}"
        return f"{self.completed}/{self.total} {unit} ({self._percent()}%)"

    def _percent(self) -> int:
        return min(self.completed * 100 // self.total, 100) if self.total else 100

    def progress_line(self, now: float) -> str:
        """'<description>: 120.0 MB / 1.2 GB (10%), 12.0 MB/s, ETA 1:30' (items: '3/40 images (7%), ETA 0:12')."""
        parts = [self._amount()]
        rate = self._rate(now)
        if self._owner.unit == "bytes":
            parts.append(f"{_size(rate)}/s" if rate else "? B/s")
        if self.total is not None:
            parts.append(f"ETA {_clock_text((self.total - self.completed) / rate)}" if rate else "ETA ?")
        return f"{self.description}: " + ", ".join(parts)

    def done_line(self, now: float) -> str:
        elapsed = now - self.started
        if self._owner.unit == "bytes":
            rate = self.completed / elapsed if elapsed > 0 else None
            speed = f" ({_size(rate)}/s)" if rate else ""
            return f"{self.description}: done, {_size(self.completed)} in {_clock_text(elapsed)}{speed}"
        return f"{self.description}: done, {self.completed} {self._owner.unit} in {_clock_text(elapsed)}"

    def stopped_line(self) -> str:
        return f"{self.description}: stopped at {self._amount()}"


class TransferProgress:
    """Progress of long transfers, in bytes (unit="bytes") or items (unit names them: "images", "layers").

    out: a stream (default stderr), a rich Console, or a callable taking one line (then never a terminal).
    On a terminal: rich progress bars, one per transfer in flight (description, bar, amount, speed for bytes,
    time left), redrawn every `tick` seconds (0: at every update); a finished transfer leaves its done line.
    Elsewhere: plain lines, a transfer's line when it reaches the next `step` percent or `interval` seconds after
    its last line, whichever comes first (at most one line an update), and its done line.

        with TransferProgress(unit="bytes") as progress:
            with progress.add("nvcr.io/nvidia/driver:550.144.03-ubuntu22.04", total=size) as t:
                for chunk in chunks:
                    t.advance(len(chunk))
    """

    def __init__(self, out: TextIO | Console | Callable[[str], None] | None = None, *, unit: str = "bytes",
                 tty: bool | None = None, width: int | None = None, interval: float = 10.0, step: int = 10,
                 tick: float = 0.1, clock: Callable[[], float] = time.monotonic):
        if not 1 <= step <= 100:
            raise ValueError(f"step is a percentage (1-100), not {step!r}")
        self.unit = unit
        self.interval = interval
        self.step = step
        self._tick = tick
        self._clock = clock
        self._lock = threading.RLock()
        self._sink: Callable[[str], None] | None = None
        self._console: Any = None
        self._stream: SafeStream | None = None
        self._progress: Any = None  # rich.progress.Progress while shown
        if out is not None and not hasattr(out, "write") and not hasattr(out, "is_terminal") and callable(out):
            self._sink = out
            self.tty = False
        elif out is not None and hasattr(out, "is_terminal") and hasattr(out, "print"):  # a rich Console
            self._console = out
            self.tty = bool(out.is_terminal) if tty is None else tty
        else:
            stream = sys.stderr if out is None else out
            self.tty = is_terminal(stream) if tty is None else tty
            if self.tty:
                self._console = make_console(stream, tty=True, width=width)  # type: ignore[arg-type]
            else:
                self._stream = SafeStream(stream)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ plain output

    def _line(self, line: str) -> None:
        if self._sink is not None:
            self._sink(line)
        elif self._stream is not None:
            self._stream.write(line + "\n")
            self._stream.flush()
        else:  # a console that is not a terminal
            from rich.text import Text

            self._console.print(Text(line), soft_wrap=True)

    # ------------------------------------------------------------------ transfers

    def add(self, description: str, total: int | None = None) -> Transfer:
        """A new transfer of total bytes (items); None: not known (yet)."""
        with self._lock:
            t = Transfer(self, description, total)
            if self.tty:
                bar = self._bars()
                t._task = bar.add_task(t.description, total=total)
                self._redraw()
            return t

    def _bars(self) -> Any:
        if self._progress is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            amount = ([DownloadColumn(), TransferSpeedColumn()] if self.unit == "bytes"
                      else [MofNCompleteColumn(), TextColumn(self.unit, markup=False)])
            self._progress = Progress(
                TextColumn("{task.description}", markup=False), BarColumn(), *amount, TimeRemainingColumn(compact=True),
                console=self._console, auto_refresh=self._tick > 0,
                refresh_per_second=1 / self._tick if self._tick > 0 else 10,
                transient=False, redirect_stdout=False, redirect_stderr=False, get_time=self._clock)
            self._progress.start()
        return self._progress

    def _redraw(self) -> None:
        if self._progress is not None and self._tick <= 0:
            self._progress.refresh()

    def _update(self, t: Transfer, completed: int, total: int | None) -> None:
        with self._lock:
            if t.finished:
                return
            t.completed = max(int(completed), 0)
            if total is not None:
                t.total = total
            if self.tty:
                self._bars().update(t._task, completed=t.completed, total=t.total)
                self._redraw()
                return
            now = self._clock()
            step = (t._percent() // self.step) if t.total else 0
            if t.total and t.completed >= t.total:
                step = t._last_step  # 100%: the done line says it
            if step > t._last_step or now - t._last_line >= self.interval:
                t._last_step, t._last_line = max(step, t._last_step), now
                self._line(t.progress_line(now))

    def _finish(self, t: Transfer, ok: bool) -> None:
        with self._lock:
            if t.finished:
                return
            t.finished = True
            line = t.done_line(self._clock()) if ok else t.stopped_line()
            if self.tty and self._progress is not None:
                from rich.text import Text

                self._progress.remove_task(t._task)
                self._progress.refresh()  # the bar goes before its line is printed above the others
                self._progress.console.print(Text(line), soft_wrap=True)
            else:
                self._line(line)

    def close(self) -> None:
        """Stop drawing (a transfer still in flight keeps its last bar on the screen)."""
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    def __enter__(self) -> TransferProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
