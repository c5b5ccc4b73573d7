"""gpu_install_lab.proc: start, recognise and stop processes by recorded identity (no root needed)."""

from __future__ import annotations

import os
import signal
import sys
import time

from gpu_install_lab import proc

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
STUBBORN = [sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"]


def _wait_for_output(log, text="up", timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{log} never said {text!r}")


def test_spawn_records_identity_in_a_session_of_its_own(tmp_path):
    log = tmp_path / "logs" / "sleeper.log"
    rec = proc.spawn(SLEEPER, log)
    try:
        assert set(rec) == {"pid", "start", "boot"} and rec["boot"] == proc.boot_id()
        assert proc.alive(rec) and proc.same_process(rec)
        assert os.getsid(rec["pid"]) == rec["pid"]  # start_new_session: the CLI's Ctrl-C never reaches it
        _wait_for_output(log)
    finally:
        proc.stop(rec, grace=5)
    assert not proc.alive(rec) and proc.proc_stat(rec["pid"]) is None  # stopped and reaped: no zombie


def test_stop_never_signals_a_stranger(tmp_path):
    rec = proc.spawn(SLEEPER, tmp_path / "s.log")
    try:
        recycled = {**rec, "start": rec["start"] - 1}  # the same pid, another process as far as we know
        proc.stop(recycled, grace=0.2)
        proc.send(recycled, signal.SIGKILL)
        assert proc.alive(rec)
        assert proc.wait_gone([rec], 0.2) == [rec]
    finally:
        proc.stop(rec, grace=5)
    assert proc.wait_gone([rec], 0.1) == []


def test_stop_kills_what_ignores_sigterm(tmp_path):
    log = tmp_path / "stubborn.log"
    rec = proc.spawn(STUBBORN, log)
    _wait_for_output(log)  # its SIGTERM handler is installed
    t0 = time.monotonic()
    proc.stop(rec, grace=0.5)
    assert not proc.alive(rec) and time.monotonic() - t0 < 5


def test_nothing_recorded_is_nothing_to_do():
    for rec in (None, {}, {"pid": None, "start": None, "boot": proc.boot_id()}):
        assert not proc.alive(rec)
        proc.stop(rec)
        proc.send(rec, signal.SIGTERM)


def test_a_node_slow_to_answer_its_unit_probe_is_asked_again(tmp_path):
    """A real node whose first SSH probe hangs (a busy node under two labs) is asked again, not a crash of
    `lab up`/`lab status`; one that never answers reads as no words ("unknown")."""
    from gpu_install_lab.lab import Lab

    first = tmp_path / "asked"
    slow_once = ["sh", "-c", f'if [ -e {first} ]; then echo active; else : > {first}; sleep 5; fi', "probe"]
    t0 = time.monotonic()
    assert Lab._probe_units(slow_once, "ignored", deadline_s=10, attempt_s=0.5) == ["active"]
    assert time.monotonic() - t0 < 5
    never = ["sh", "-c", "sleep 5", "probe"]
    t0 = time.monotonic()
    assert Lab._probe_units(never, "ignored", deadline_s=1.5, attempt_s=0.5) == []
    assert time.monotonic() - t0 < 4
