"""The agent's signals: SIGTERM, SIGHUP and SIGINT raise :class:`Interrupted` inside its loop, so that
the ``finally`` blocks on the way out stop its ranks and its template."""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["Interrupted", "raise_on_signals"]


class Interrupted(BaseException):
    """A signal reached the agent (its name is the message)."""


class raise_on_signals:
    """SIGTERM / SIGHUP / SIGINT raise :class:`Interrupted` in the agent's loop (its ranks are stopped on the way out)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __enter__(self) -> None:
        self._old = {s: signal.getsignal(s) for s in self.SIGNALS}

        def handler(signum: int, _frame: Any) -> None:
            raise Interrupted(signal.Signals(signum).name)

        for s in self.SIGNALS:
            signal.signal(s, handler)

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
