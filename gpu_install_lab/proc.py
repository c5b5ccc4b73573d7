"""Process identity: the one way the lab starts, recognises and stops its long-running processes.

A process is recorded as {"pid", "start", "boot"}: its pid, its start time in clock ticks since boot
(field 22 of /proc/PID/stat) and the boot id. A recycled pid never matches the record (other start
time, or another boot), so the lab never signals a stranger; a zombie is not alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Record = dict[str, Any]

# Popen objects of the processes spawn() started in this interpreter: reaped through them (their
# return code kept, no ResourceWarning); other children of ours through waitpid.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks) of pid, None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[19])


def proc_start(pid: int) -> int | None:
    """Start time of pid in clock ticks since boot, None if gone."""
    st = proc_stat(pid)
    return st[1] if st else None


def identity(pid: int) -> Record:
    return {"pid": pid, "start": proc_start(pid), "boot": boot_id()}


def same_process(rec: Record | None) -> bool:
    """True if the recorded process still holds its pid (a zombie included)."""
    if not rec:
        return False
    pid, start = rec.get("pid"), rec.get("start")
    if not pid or start is None or rec.get("boot") != boot_id():
        return False
    return bool(proc_start(int(pid)) == start)


def reap(pid: int) -> None:
    """Collect pid if it is a child of ours that has exited (no-op otherwise)."""
    if pid <= 0:
        return
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            _CHILDREN.pop(pid, None)
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def alive(rec: Record | None) -> bool:
    """The recorded process still runs: the very process recorded, not a zombie (an exited child of
    ours is reaped on the way)."""
    if not same_process(rec):
        return False
    pid = int(rec["pid"])  # type: ignore[index]
    reap(pid)
    st = proc_stat(pid)
    return st is not None and st[1] == rec["start"] and st[0] not in ("Z", "X")  # type: ignore[index]


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None,
          preexec_fn: Callable[[], None] | None = None) -> Record:
    """Start a long-running process in a session of its own (it survives the CLI and never gets its
    Ctrl-C), stdin /dev/null, stdout+stderr appended to log. Returns its identity record."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True, preexec_fn=preexec_fn)
    _CHILDREN[proc.pid] = proc
    return identity(proc.pid)


def send(rec: Record | None, sig: int) -> None:
    """Signal the recorded process, only while it is still that process."""
    if alive(rec):
        try:
            os.kill(int(rec["pid"]), sig)  # type: ignore[index]
        except ProcessLookupError:
            pass


def wait_gone(recs: list[Record], timeout: float, interval: float = 0.1) -> list[Record]:
    """Wait up to timeout for the recorded processes to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    left = [r for r in recs if alive(r)]
    while left and time.monotonic() < deadline:
        time.sleep(interval)
        left = [r for r in left if alive(r)]
    return left


def stop(rec: Record | None, grace: float = 15.0, kill_wait: float = 5.0) -> None:
    """SIGTERM, then (after grace seconds) SIGKILL the recorded process -- only while it is still the one
    recorded -- and collect it if it is our child."""
    if not alive(rec):  # gone (an exited child of ours is reaped by alive) or not ours any more
        return
    pid = int(rec["pid"])  # type: ignore[index]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if not wait_gone([rec], wait, interval=0.05):  # type: ignore[list-item]
            break
    # A Go process shows 'Z' while its other threads are still exiting; waitpid returns once all are
    # gone. Orphans are reaped by init.
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
