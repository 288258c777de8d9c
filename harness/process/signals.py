"""The one place the harness handles signals: `SignalCatcher` records the signals it is given
while installed (and may pass each on), then gives them back to the handlers they had before.

Python runs handlers in the main thread only, between bytecodes, so a handler here only records
(and forwards): printing from it could re-enter a print the signal interrupted. Off the main thread
the catcher installs nothing (`signal.signal` would raise there, and no signal would reach it).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from types import FrameType, TracebackType
from typing import Any, Callable, Optional


class SignalCatcher:
    """While installed (`with SignalCatcher(signals):`, or install() ... restore()): each of
    `signals` that arrives is appended to `arrived` and handed to `on_signal`, if given; on exit,
    exceptions included, every signal gets back the handler it had before. Nested catchers each
    restore what they found, so the inner one hands back to the outer one."""

    def __init__(self, signals: Iterable[int], on_signal: Optional[Callable[[int], None]] = None) -> None:
        self.signals = tuple(signals)
        self.on_signal = on_signal
        self.arrived: list[int] = []
        self._previous: dict[int, Any] = {}

    @property
    def first(self) -> Optional[int]:
        """The first signal that arrived, or None."""
        return self.arrived[0] if self.arrived else None

    @property
    def last(self) -> Optional[int]:
        """The latest signal that arrived, or None."""
        return self.arrived[-1] if self.arrived else None

    def install(self) -> SignalCatcher:
        """Catch the signals from now on (in the main thread; elsewhere nothing changes)."""
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous.setdefault(signum, signal.signal(signum, self._handle))
        return self

    def restore(self) -> None:
        """Give each signal back the handler it had before install."""
        while self._previous:
            signum, handler = self._previous.popitem()
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self.arrived.append(signum)
        if self.on_signal is not None:
            self.on_signal(signum)

    def __enter__(self) -> SignalCatcher:
        return self.install()

    def __exit__(
        self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]
    ) -> None:
        self.restore()


def ignore_signals(signals: Iterable[int]) -> None:
    """Ignore `signals` for the rest of this process's life (helper processes that leave them to
    their parent, such as data-loader workers): a permanent change, nothing to restore."""
    for signum in signals:
        signal.signal(signum, signal.SIG_IGN)
