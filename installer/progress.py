"""The live per-host progress display of `preflight` / `apply`, fed with ansible-runner job events.

No ansible_runner import (installer/ansible.py feeds the events). Output, on stderr:

    == Container runtime (8 hosts)
    [node1] ok          Registry trust | Copy the CA  (0.2s)
    [node3] changed     Containerd | Write the drop-in  (0.4s)
    [node2] failed      Containerd | Restart  (12.0s)
    [node2]   containerd did not come back: ...
    [node1] ok          Driver | Report  (0.0s)
    [node1]   REBOOT REQUIRED (no NVIDIA kernel module is loaded); ...

- one line per task result; `skipped`, failures a task ignores and the ok results of bookkeeping tasks
  (argument validation, include_tasks/include_vars, set_fact, meta) only with verbose;
- messages of tasks named "<Role> | Report…" always, failures and unreachable hosts with their message,
  file diffs of changed tasks when the run has them (--diff);
- on a terminal (rich's Live display): the same lines, the status word coloured (NO_COLOR respected), and under
  them a one-line live status (hosts done/total for the current task, changed, failed, the current task, elapsed
  time) redrawn in place, gone when the run ends; anywhere else (CI, pipes, files, TERM=dumb) plain lines only,
  no escape codes, no colour;
- characters the stream cannot encode become '?', control characters in event text (escape sequences from a
  remote host) '?'; a closed stream or broken pipe never raises;
- recap(): the per-host table (ok/changed/failed/unreachable/skipped + time spent on the host), plain text;
  print_recap(): the same table printed, with a bold header and a rule on a terminal.

What is printed comes only from a fixed set of event fields (host, task, play, status, duration, and the
result's msg/diff): never task arguments, module invocations, extravars or the environment. Results of
no_log tasks print no message and no diff. rich is imported only when drawing on a terminal (installer/ui.py).
"""

from __future__ import annotations

import atexit
import difflib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from installer import ui

if TYPE_CHECKING:
    from rich.console import Console

REPORT_TASK = re.compile(r"\|\s*Report\b")
STATUS_WIDTH = 11  # len("unreachable")
HIDDEN = "(output hidden: no_log)"
# bookkeeping, not work on the host: their ok results are shown only with verbose
QUIET_ACTIONS = {f"ansible.builtin.{a}" for a in ("validate_argument_spec", "include_tasks", "include_role",
                                                   "include_vars", "set_fact", "meta")}
RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


def _hidden(res: dict[str, Any]) -> bool:
    """A no_log result: Ansible sends {'censored': ...} (or flags it); nothing of it is shown."""
    return bool(res.get("_ansible_no_log") or "censored" in res)


def result_status(event: dict[str, Any]) -> str | None:
    """ok | changed | failed | ignored | unreachable | skipped for a task-result event, else None."""
    status = RESULT_EVENTS.get(event.get("event", ""))
    if status is None:
        return None
    data = event.get("event_data") or {}
    res = data.get("res") or {}
    if status == "ok" and res.get("changed"):
        return "changed"
    if status == "failed" and data.get("ignore_errors"):
        return "ignored"
    return status


def message(res: dict[str, Any]) -> str:
    """The one-line reason of a failed/unreachable result (a loop's failing items, not 'One or more items failed')."""
    if _hidden(res):
        return HIDDEN
    items = [r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if items:
        return "; ".join(_item_label(r) + message(r) for r in items)[:1000]
    msg = res.get("msg") or res.get("stderr") or res.get("module_stderr") or res.get("module_stdout") or ""
    if isinstance(msg, list):
        msg = " ".join(map(str, msg))
    return " ".join(untraced(str(msg)).split())[:500]


TRACEBACK = "Traceback (most recent call last):"


def untraced(text: str) -> str:
    """A Python traceback from the host (a module that died there: the node stopped or the link cut mid-task, and
    Ansible relays the module's stderr) reduced to the exception it ended with. Printed whole it reads as gpu-install's
    own crash, and cut at 500 characters it loses the one line that matters. The full text stays in the run's
    artifacts."""
    while TRACEBACK in text:
        before, _, rest = text.partition(TRACEBACK)
        lines = rest.splitlines()
        # the frames are indented ("  File …", "    code"); the first line that is not is the exception
        end = next((i for i, line in enumerate(lines) if line.strip() and not line[:1].isspace()), None)
        if end is None:
            exc, after = "cut off before the exception", []
        else:
            exc, after = lines[end].strip(), lines[end + 1:]
        text = "\n".join([f"{before}(a Python traceback from the host, ending in: {exc})", *after])
    return text


def _item_label(res: dict[str, Any]) -> str:
    """'item: ' for a loop item whose label is a plain string or number (a dict item may hold anything)."""
    label = res.get("_ansible_item_label", res.get("item"))
    if isinstance(label, (str, int, float)) and not _hidden(res):
        return f"{str(label)[:60]}: "
    return ""


def report_lines(res: dict[str, Any]) -> list[str]:
    """A debug task's msg as lines (a list msg: one line per item)."""
    if _hidden(res):
        return [HIDDEN]
    msg = res.get("msg")
    if msg is None or msg == "":
        return []
    items = msg if isinstance(msg, list) else [msg]
    return [" ".join(str(m).split()) for m in items if str(m).strip()]


def diff_lines(res: dict[str, Any]) -> list[str]:
    """Ansible's diff of a result (before/after or prepared text) as unified-diff lines."""
    if _hidden(res):
        return []
    diffs = res.get("diff")
    if isinstance(diffs, dict):
        diffs = [diffs]
    out: list[str] = []
    for d in diffs or []:
        if not isinstance(d, dict):
            continue
        if d.get("prepared"):
            out += str(d["prepared"]).splitlines()
            continue
        before, after = d.get("before"), d.get("after")
        if isinstance(before, str) and isinstance(after, str) and before != after:
            out += difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="",
                                        fromfile=str(d.get("before_header") or "before"),
                                        tofile=str(d.get("after_header") or "after"))
        elif isinstance(before, dict) and isinstance(after, dict) and before != after:  # e.g. file state
            for key in sorted(set(before) | set(after)):
                if before.get(key) != after.get(key):
                    out.append(f"{key}: {before.get(key)} -> {after.get(key)}")
    return out


@dataclass
class HostRecap:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    seconds: float = 0.0  # sum of the host's task durations


RECAP_COLUMNS = (("host", "left"), ("ok", "right"), ("changed", "right"), ("failed", "right"),
                 ("unreachable", "right"), ("skipped", "right"), ("time", "right"))


def recap_rows(hosts: dict[str, HostRecap]) -> list[tuple[Any, ...]]:
    """One row a host (RECAP_COLUMNS), failed/unreachable hosts first, then by name."""
    order = sorted(hosts, key=lambda h: (not (hosts[h].failed or hosts[h].unreachable), h))
    rows = []
    for h in order:
        s = hosts[h]
        rows.append((h, s.ok, s.changed, s.failed, s.unreachable, s.skipped, f"{s.seconds:.1f}s"))
    return rows


def recap_table(hosts: dict[str, HostRecap], title: str = "") -> str:
    """The per-host recap as plain text: the title line (when given), the header, one row a host, failed/unreachable
    hosts first, then by name."""
    return ui.table(title, RECAP_COLUMNS, recap_rows(hosts))


class _Line(NamedTuple):
    """A line of output, with the styles of its parts on a terminal: (start, end, rich style) spans."""
    text: str
    spans: tuple[tuple[int, int, str], ...] = ()


STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "bold red",
                "skipped": "cyan", "ignored": "cyan"}


class _StatusLine:
    """The renderable of the live status (rich calls it at every redraw): one line, cut to the width, or nothing."""

    def __init__(self, display: Display):
        self.display = display

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        text = ui.printable(self.display.status_text()).replace("\n", " ")
        if not text:
            if self.display._closing:  # one empty line for rich to remove: before rich 14.3 stop() leaves a blank
                yield Text("")         # line under a display of no lines
            return
        width = options.max_width
        if len(text) > width - 1:  # the last column left free: no terminal wraps the status line
            text = text[: max(width - 4, 10)] + "..."
        yield Text(text, no_wrap=True, overflow="crop")


@dataclass
class _Run:
    playbook: str = ""
    started: float = 0.0
    hosts: dict[str, HostRecap] = field(default_factory=dict)
    bad_hosts: set[str] = field(default_factory=set)
    changed: int = 0
    play: str = ""
    play_total: int | None = None
    task: str = ""
    task_done: set[str] = field(default_factory=set)
    retry: str = ""
    stats_seen: bool = False
    finished: bool = False


class Display:
    """Feed it job events (event()); it writes progress lines and, on a terminal, a live status line.

    out: the stream (default stderr) or a callable taking one line (then never a terminal).
    tty: None = ask the stream (and TERM != dumb). width: the terminal's columns (None: ask the terminal).
    tick: seconds between redraws of the status line's clock (0: only at events). host_count: play pattern ->
    number of hosts (the seam resolves it from the inventory), for the play headers and the status line.
    """

    def __init__(self, out: TextIO | Callable[[str], None] | None = None, *, verbose: bool = False,
                 tty: bool | None = None, width: int | None = None, tick: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self._sink: Callable[[str], None] | None = None
        self._stream: ui.SafeStream | None = None
        if callable(out) and not hasattr(out, "write"):
            self._sink = out
            self.tty = False
        else:
            stream: TextIO = out if out is not None else sys.stderr  # type: ignore[assignment]
            self._stream = ui.SafeStream(stream)
            self.tty = ui.is_terminal(stream) if tty is None else tty
        self.verbose = verbose
        self._width = width
        self._clock = clock
        self._lock = threading.RLock()
        self._console: Any = None  # rich Console, on a terminal (made at the first line drawn)
        self._live: Any = None  # rich Live while the status line is shown
        self._closing = False
        self._run = _Run()
        self._host_count: Callable[[str], int | None] = lambda pattern: None
        self._host_width = 0
        self.runs: list[tuple[str, dict[str, HostRecap], float]] = []  # finished runs: playbook, hosts, seconds
        self._tick = tick

    # ------------------------------------------------------------------ output primitives

    def _emit(self, lines: list[_Line]) -> None:
        """Print lines; on a terminal above the status line, which rich redraws under them."""
        if not lines:
            return
        if self._sink is not None:
            for line in lines:
                self._sink(line.text)
            return
        assert self._stream is not None
        texts = [ui.printable(line.text) for line in lines]
        if not self.tty:
            self._stream.write("".join(t + "\n" for t in texts))
            self._stream.flush()
            return
        from rich.text import Text

        out = Text()
        for i, (line, text) in enumerate(zip(lines, texts, strict=True)):
            if i:
                out.append("\n")
            start = len(out)
            out.append(text)
            for a, b, style in line.spans:
                if style:
                    out.stylize(style, start + a, start + b)
        self._show().console.print(out)

    def _show(self) -> Any:
        """The rich Live display of the status line, started when first needed (it hides the cursor until close())."""
        if self._live is None:
            from rich.live import Live

            if self._console is None:
                assert self._stream is not None
                self._console = ui.make_console(self._stream.stream, tty=True, width=self._width)
            self._live = Live(_StatusLine(self), console=self._console, transient=True,
                              auto_refresh=self._tick > 0, refresh_per_second=1 / self._tick if self._tick > 0 else 1,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
            atexit.register(self.close)  # the cursor comes back even when a caller forgets close()
        return self._live

    def _draw_status(self) -> None:
        if self.tty and self._stream is not None and (self._live is not None or self.status_text()):
            self._show().refresh()

    def note(self, line: str) -> None:
        """A line from elsewhere (another stage): printed above the status line."""
        with self._lock:
            if self._sink is not None:
                self._sink(line)
            else:
                self._emit([_Line(ln) for ln in str(line).split("\n")])

    def close(self) -> None:
        """Stop the clock and remove the status line (call in a finally)."""
        with self._lock:
            live, self._live = self._live, None
            if live is not None:
                atexit.unregister(self.close)
                self._closing = True
                try:
                    live.stop()
                finally:
                    self._closing = False

    # ------------------------------------------------------------------ runs

    def start_run(self, playbook: str, host_count: Callable[[str], int | None] | None = None,
                  hosts: Iterable[str] = ()) -> None:
        """A playbook run begins (the seam calls it): host_count maps a play's pattern to its number of hosts."""
        with self._lock:
            self._run = _Run(playbook=playbook, started=self._clock())
            self._host_count = host_count or (lambda pattern: None)
            self._host_width = max([len(h) for h in hosts] + [self._host_width])

    def finish_run(self) -> dict[str, HostRecap]:
        """The run ended: its per-host recap (counts from the stats event when there was one)."""
        with self._lock:
            run = self._run
            seconds = self._clock() - run.started if run.started else 0.0
            self.runs.append((run.playbook, run.hosts, seconds))
            run.finished = True  # no current task: the status line goes until the next run
            bad = len(run.bad_hosts)
            summary = (f"-- {run.playbook or 'run'}: {len(run.hosts)} hosts, {run.changed} changed, "
                       f"{bad} failed/unreachable ({seconds:.1f}s)")
            self._emit([_Line(summary, ((0, len(summary), "bold"),))])
            return run.hosts

    def recap(self) -> str:
        """The per-host table of the last finished run ('' before any)."""
        if not self.runs:
            return ""
        playbook, hosts, seconds = self.runs[-1]
        return recap_table(hosts, title=f"RECAP {playbook} ({seconds:.1f}s)")

    def print_recap(self, file: TextIO | Console | None = None) -> None:
        """Print the recap of the last finished run on file (default stdout, or a rich Console): on a terminal with a
        bold header and a rule under it, elsewhere exactly recap()'s text. Nothing before any run."""
        if self.runs:
            playbook, hosts, seconds = self.runs[-1]
            ui.print_table(f"RECAP {playbook} ({seconds:.1f}s)", RECAP_COLUMNS, recap_rows(hosts), file)

    # ------------------------------------------------------------------ events

    def status_text(self) -> str:
        """'3/8 hosts - changed 5 - failed 0 - Containerd | Restart containerd - 1:12' ('' outside a run's plays)."""
        run = self._run
        if run.finished or (not run.play and not run.task):
            return ""
        total = run.play_total
        done = len(run.task_done)
        parts = [f"{done}/{total if total is not None else '?'} hosts"]
        parts.append(f"changed {run.changed}")
        parts.append(f"failed {len(run.bad_hosts)}")
        parts.append(run.task or run.play)
        if run.retry:
            parts.append(run.retry)
        elapsed = self._clock() - run.started if run.started else 0.0
        parts.append(f"{int(elapsed) // 60:d}:{int(elapsed) % 60:02d}")
        return " - ".join(parts)

    def _host(self, host: str) -> str:
        self._host_width = max(self._host_width, len(host))
        return f"[{host}]".ljust(self._host_width + 2)

    def event(self, event: dict[str, Any]) -> None:
        """One ansible-runner job event."""
        with self._lock:
            lines = self._lines(event)
            if lines:
                self._emit(lines)  # on a terminal rich redraws the status line under them
            else:
                self._draw_status()

    def _lines(self, event: dict[str, Any]) -> list[_Line]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        run = self._run
        if kind == "playbook_on_play_start":
            name = str(data.get("play") or data.get("name") or "")
            pattern = str(data.get("play_pattern") or data.get("pattern") or "")
            run.play, run.task, run.task_done = name, "", set()
            run.play_total = self._host_count(pattern) if pattern else None
            count = run.play_total
            head = f"== {name}" + (f" ({count} host{'s' if count != 1 else ''})" if count is not None else "")
            return [_Line(head, ((0, len(head), "bold"),))]
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            run.task = str(data.get("task") or data.get("name") or "")
            run.task_done, run.retry = set(), ""
            return []
        if kind == "runner_retry":
            res = data.get("res") or {}
            run.retry = f"retry {res.get('attempts', '?')}/{res.get('retries', '?')} on {data.get('host', '?')}"
            return []
        if kind == "playbook_on_stats":
            return self._stats(data)
        status = result_status(event)
        if status is None:
            return []
        return self._result(status, data)

    def _result(self, status: str, data: dict[str, Any]) -> list[_Line]:
        run = self._run
        host = str(data.get("host") or "?")
        task = str(data.get("task") or "")
        res = data.get("res") or {}
        try:
            seconds = float(data.get("duration") or 0.0)
        except (TypeError, ValueError):
            seconds = 0.0
        rec = run.hosts.setdefault(host, HostRecap())
        rec.seconds += seconds
        counter = {"ok": "ok", "changed": "changed", "failed": "failed", "unreachable": "unreachable",
                   "skipped": "skipped", "ignored": "ok"}[status]
        setattr(rec, counter, getattr(rec, counter) + 1)
        if status == "changed":
            rec.ok += 1  # Ansible counts a changed result as ok too
            run.changed += 1
        if status in ("failed", "unreachable"):
            run.bad_hosts.add(host)
        run.task_done.add(host)
        run.retry = ""
        if not self.verbose and (status in ("skipped", "ignored") or
                                 (status == "ok" and data.get("task_action") in QUIET_ACTIONS)):
            return []
        at = len(self._host(host)) + 1
        lines = [_Line(f"{self._host(host)} {status:<{STATUS_WIDTH}}  {task}  ({seconds:.1f}s)",
                       ((at, at + len(status), STATUS_STYLE[status]),))]
        pad = self._host(host) + "    "
        if status in ("failed", "unreachable", "ignored"):
            msg = message(res)
            lines.append(_Line(pad + msg, ((len(pad), len(pad) + len(msg), "red" if status != "ignored" else ""),)))
        elif REPORT_TASK.search(task) and status in ("ok", "changed"):
            lines += [_Line(pad + m, ((len(pad), len(pad) + len(m), "bold"),)) for m in report_lines(res)]
        if status == "changed" or self.verbose:
            for d in diff_lines(res):
                style = {"+": "green", "-": "red", "@": "cyan"}.get(d[:1], "") if d[:3] not in ("+++", "---") else ""
                lines.append(_Line(pad + "  " + d, ((len(pad) + 2, len(pad) + 2 + len(d), style),)))
        return lines

    def _stats(self, data: dict[str, Any]) -> list[_Line]:
        """Ansible's own per-host counts replace the tallies (they also count what has no result event)."""
        run = self._run
        run.stats_seen = True
        keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable", "skipped": "skipped"}
        names: set[str] = set()
        for key in (*keys, "processed"):
            names |= set(data.get(key) or {})
        for host in names:
            rec = run.hosts.setdefault(host, HostRecap())
            for key, attr in keys.items():
                setattr(rec, attr, int((data.get(key) or {}).get(host, 0)))
        return []
