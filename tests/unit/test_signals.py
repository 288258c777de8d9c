"""harness.process.signals: the one signal helper records what arrives while installed, passes it on
when asked, and always gives each signal back the handler it had (an exception, nesting)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from harness.process.signals import SignalCatcher, ignore_signals


def _send(signum: int, catcher: SignalCatcher, count: int) -> None:
    """Send `signum` to this process and wait (at most 5 s) until the catcher has `count` arrivals."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 5
    while len(catcher.arrived) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_records_what_arrives_and_passes_each_on():
    passed = []
    with SignalCatcher((signal.SIGUSR1, signal.SIGUSR2), on_signal=passed.append) as catcher:
        _send(signal.SIGUSR2, catcher, 1)
        _send(signal.SIGUSR1, catcher, 2)
    assert catcher.arrived == [signal.SIGUSR2, signal.SIGUSR1] == passed
    assert (catcher.first, catcher.last) == (signal.SIGUSR2, signal.SIGUSR1)


def test_the_previous_handler_comes_back_even_after_an_exception():
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(KeyError):
        with SignalCatcher((signal.SIGUSR1,)):
            assert signal.getsignal(signal.SIGUSR1) is not before
            raise KeyError("inside")
    assert signal.getsignal(signal.SIGUSR1) is before


def test_nested_catchers_hand_back_to_the_outer_one():
    before = signal.getsignal(signal.SIGUSR1)
    with SignalCatcher((signal.SIGUSR1,)) as outer:
        with SignalCatcher((signal.SIGUSR1,)) as inner:
            _send(signal.SIGUSR1, inner, 1)
        assert (inner.arrived, outer.arrived) == ([signal.SIGUSR1], [])
        _send(signal.SIGUSR1, outer, 1)
        assert (inner.arrived, outer.arrived) == ([signal.SIGUSR1], [signal.SIGUSR1])
    assert signal.getsignal(signal.SIGUSR1) is before


def test_install_and_restore_without_a_with_block():
    before = signal.getsignal(signal.SIGTERM)
    catcher = SignalCatcher((signal.SIGTERM,)).install()
    try:
        _send(signal.SIGTERM, catcher, 1)
    finally:
        catcher.restore()
    assert catcher.first == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is before


def test_off_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGUSR1)
    seen = []

    def install() -> None:
        with SignalCatcher((signal.SIGUSR1,)):
            seen.append(signal.getsignal(signal.SIGUSR1))

    worker = threading.Thread(target=install)
    worker.start()
    worker.join(timeout=10)
    assert seen == [before]


def test_ignored_signals_stay_ignored_until_someone_restores_them():
    before = signal.getsignal(signal.SIGUSR2)
    with SignalCatcher((signal.SIGUSR2,)):
        ignore_signals((signal.SIGUSR2,))
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGUSR2) is before
