"""The agent's signals: SIGTERM, SIGHUP and SIGINT raise :class:`Interrupted` inside its loop, so that
the ``finally`` blocks on the way out stop its ranks and its template."""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["Interrupted", "raise_on_signals"]


class Interrupted(BaseException):
    """A signal reached the agent (its name is the message)."""


class raise_on_signals:
    """The given signals raise ``error`` (its message: the signal's name) while the block runs; the old handlers
    come back after it. The agent's default: SIGTERM, SIGHUP and SIGINT raise :class:`Interrupted`."""

    def __init__(
        self,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT),
        error: type[BaseException] = Interrupted,
    ) -> None:
        self.signals, self.error = signals, error

    def __enter__(self) -> None:
        self._old = {s: signal.getsignal(s) for s in self.signals}
        error = self.error

        def handler(signum: int, _frame: Any) -> None:
            raise error(signal.Signals(signum).name)

        for s in self.signals:
            signal.signal(s, handler)

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
