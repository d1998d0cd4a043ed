"""Waiting on the guard's own collectives in a way that can be given up when the peers have moved on.

Why: a gloo collective posted at the moment its rank's own connection breaks can miss the break and wait
out the whole PG timeout, although every peer failed within milliseconds (docs/design.md, "Waiting on the
guard's own collectives", has the measurements). So the guard never blocks in ``work.wait()`` for the
collectives it issues itself: it posts them asynchronously and polls, and gives up when the stall watchdog
fired for this attempt or, without a watchdog, when the control channel says a peer already posted at the
next generation (asked at growing intervals, so a merely slow peer costs few store round trips).

Giving up raises :class:`accelpact.errors.CollectiveAbandoned` (a recoverable fault), after the backend
has been told to keep the stuck generation alive until its PG timeout: dropping it sooner would make its
destructor wait for the stuck operation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from accelpact.errors import CollectiveAbandoned

__all__ = ["CollectiveWaiter", "wait_interruptibly"]

# The healthy vote completes in about a millisecond: spin (yielding the CPU) that long before
# sleeping between polls, so the common case pays no sleep granularity.
_SPIN_S = 0.002
_SLEEP_S = 0.0002


def wait_interruptibly(
    work: Any, interrupt: Callable[[], str | None] | None, *, what: str, phase: str, poll_s: float = 0.02
) -> None:
    """Wait for ``work``; raise CollectiveAbandoned (holding ``work``) when ``interrupt()`` gives a reason.

    ``interrupt`` is asked every ``poll_s`` once the wait has lasted that long; None waits without
    polling (``work.wait()``). A failed collective raises the backend's own error, as ``wait()`` does.
    """
    if interrupt is None:
        work.wait()
        return
    start = time.monotonic()
    next_poll = start + poll_s
    while not work.is_completed():
        now = time.monotonic()
        time.sleep(0 if now - start < _SPIN_S else _SLEEP_S)
        if now >= next_poll:
            why = interrupt()
            if why is not None:
                raise CollectiveAbandoned(f"gave up waiting on {what}: {why}", work=work, phase=phase)
            next_poll = time.monotonic() + poll_s
    work.wait()  # raises the backend's error if the collective failed


class CollectiveWaiter:
    """The guard's ``wait(work, what, phase)`` for its own collectives (see the module docstring).

    ``fired`` returns the stall watchdog's reason for the current attempt (None if it did not fire,
    or no watchdog runs); ``superseded`` is the control channel's ``generation_superseded`` (used
    only without a watchdog); ``abandon(work)`` keeps the live generation and ``work`` alive until
    the PG timeout.
    """

    # Without a watchdog the peers are asked over the store: at 20 ms, then at twice the interval
    # each time up to 1 s, so a rank waiting on a slow peer's step costs a handful of round trips.
    first_poll_s = 0.02
    max_poll_s = 1.0

    def __init__(
        self,
        fired: Callable[[], str | None] | None,
        superseded: Callable[[], bool] | None,
        abandon: Callable[[Any], None],
    ) -> None:
        self._fired = fired
        self._superseded = superseded
        self._abandon = abandon

    def __call__(self, work: Any, what: str, phase: str) -> None:
        interrupt = self._interrupt_source()
        try:
            wait_interruptibly(work, interrupt, what=what, phase=phase, poll_s=self.first_poll_s)
        except CollectiveAbandoned as abandoned:
            self._abandon(abandoned.work)
            raise

    def _interrupt_source(self) -> Callable[[], str | None] | None:
        if self._fired is not None:
            return self._fired
        if self._superseded is None:
            return None
        interval = [self.first_poll_s]
        next_ask = [time.monotonic()]

        def ask() -> str | None:
            now = time.monotonic()
            if now < next_ask[0]:
                return None
            interval[0] = min(interval[0] * 2, self.max_poll_s)
            next_ask[0] = now + interval[0]
            superseded = self._superseded
            if superseded is not None and superseded():
                return "a peer is already recovering (posted at the next generation)"
            return None

        return ask
