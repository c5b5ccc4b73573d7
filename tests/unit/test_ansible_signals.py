"""Ctrl-C and SIGTERM while a playbook runs (installer.ansible._deferred_signals): noted for ansible-runner's cancel
poll, then delivered to the handlers that were there before, which are back afterwards. The lab test of Ctrl-C
during apply: tests/integration/test_faults.py."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from installer.ansible import _deferred_signals


@pytest.fixture(autouse=True)
def _main_thread():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can be set only in the main thread")


def test_ctrl_c_is_noted_then_raised_once_the_run_stopped():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), _deferred_signals() as cancelled:
        assert cancelled() is False
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread at once: noted, not raised here
        assert cancelled() is True
        reached = True
    assert reached
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C works again after the run


def test_sigterm_reaches_the_handler_that_was_there_before():
    seen: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda n, f: seen.append(n))
    try:
        with _deferred_signals() as cancelled:
            os.kill(os.getpid(), signal.SIGTERM)
            assert cancelled() and seen == []
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_no_signal_no_change():
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with _deferred_signals() as cancelled:
        assert cancelled() is False
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
