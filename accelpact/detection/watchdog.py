"""The stall watchdog: end a data-plane collective that will not complete, long before the PG timeout.

A SIGSTOPped peer or a silent link outage leaves gloo collectives blocked until the process-group timeout,
although the control plane can tell within seconds that nothing moves. One daemon thread per guard, on its
own control-store client, looks every ``tick_s`` during a guarded attempt and aborts this rank's data-plane
generation (the blocked collective then raises at once, as after a reset) when:

1. a peer has already posted at the next recovery generation (it is recovering); or
2. (once ``_MIN_HISTORY`` steps were timed) the attempt has run longer than ``max(stall_timeout_s,
   3 x median step)`` AND it is a stall, not a slow step: a peer's heartbeat is stale, or one of this
   rank's data-plane sockets has held the same unsent data for 0.5 s. A slow peer keeps beating and
   leaves the sockets idle, so rule 2 never fires on it.

Firing is serialised with the guard through one lock, and only for the generation and attempt it was
armed for, so a late tick never aborts a freshly rebuilt generation. docs/detection.md has the
measurements behind the thresholds.
"""

from __future__ import annotations

import fcntl
import math
import statistics
import struct
import termios
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

from accelpact import shutdown
from accelpact.common.peer_records import Beat
from accelpact.detection.liveness import LivenessConfig, heartbeat_key

__all__ = [
    "StallWatchdog",
    "WatchdogState",
    "SendQueueTracker",
    "send_queues",
    "DEFAULT_STALL_TIMEOUT_S",
    "resolve_stall_timeout",
]

# The default on CPU: 10 s is far above any step of the models here (0.1-2 s) and far below the PG
# timeouts in use (30 s to 30 min).
DEFAULT_STALL_TIMEOUT_S = 10.0
_SIOCOUTQ = termios.TIOCOUTQ  # the same request number for sockets
# Step times kept for the running median; the median needs this many before it is trusted.
_HISTORY = 32
_MIN_HISTORY = 3
# A stall is declared only past this multiple of the median step (the slow-step rule).
SLOW_FACTOR = 3.0


def send_queues(inodes: Collection[int]) -> dict[int, int]:
    """Bytes still queued for sending (unsent + unacknowledged: ``SIOCOUTQ``) per socket inode.

    Measured in a namespace with a ``tbf`` blackhole on the link: the data never leaves the qdisc, so
    ``TCP_INFO`` shows no retransmits and no unacked packets; the send queue is what stays full.
    """
    from accelpact.common.sockets import _socket_inode_to_fd

    wanted = set(inodes)
    out: dict[int, int] = {}
    for inode, fd in _socket_inode_to_fd().items():
        if inode not in wanted:
            continue
        try:
            buf = fcntl.ioctl(fd, _SIOCOUTQ, b"\0\0\0\0")
        except OSError:
            continue
        out[inode] = struct.unpack("i", buf)[0]
    return out


class SendQueueTracker:
    """Which sockets have held the same non-empty send queue for ``stuck_s``: data the link does not
    carry. A healthy link drains a queue in milliseconds, however slow the peer's step."""

    def __init__(self, stuck_s: float = 0.5) -> None:
        self.stuck_s = stuck_s
        self._seen: dict[int, tuple[int, float]] = {}

    def stuck(self, queues: dict[int, int], now: float) -> bool:
        found = False
        for inode, size in queues.items():
            last = self._seen.get(inode)
            if size <= 0:
                self._seen.pop(inode, None)
                continue
            if last is None or last[0] != size:
                self._seen[inode] = (size, now)
            elif now - last[1] >= self.stuck_s:
                found = True
        return found

    def clear(self) -> None:
        self._seen.clear()


def resolve_stall_timeout(value: float | None | str, pg_timeout_s: float) -> float | None:
    """attach()'s ``stall_timeout_s``: "auto" is DEFAULT_STALL_TIMEOUT_S when the PG timeout is longer,
    else None (off); None stays off; seconds stay as given (checked against the PG timeout at start)."""
    if value == "auto":
        return DEFAULT_STALL_TIMEOUT_S if pg_timeout_s > DEFAULT_STALL_TIMEOUT_S else None
    if isinstance(value, str):
        raise ValueError(f"stall_timeout_s={value!r}: pass seconds, None (off) or 'auto'")
    return value


@dataclass
class WatchdogState:
    """What the guard tells the watchdog (guarded by ``lock``)."""

    lock: threading.Lock
    attempt_t0: float | None = None  # monotonic start of the guarded attempt in progress, or None
    generation: int = 0  # the data-plane generation of that attempt
    fired: str | None = None  # why the watchdog aborted the current attempt (consumed by the guard)
    fired_at: float | None = None  # wall time it fired


class StallWatchdog:
    """See the module docstring. ``abort`` is the backend's abort; ``inodes`` the live data-plane sockets."""

    tick_s: float = 0.05

    def __init__(
        self,
        host: str,
        port: int,
        job_token: str,
        rank: int,
        world_size: int,
        *,
        stall_timeout_s: float,
        liveness: LivenessConfig,
        abort: Callable[[], Any],
        inodes: Callable[[], Collection[int]],
    ) -> None:
        if stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s={stall_timeout_s} must be > 0 (None turns the watchdog off)")
        self.host, self.port, self.token, self.rank, self.world_size = host, port, job_token, rank, world_size
        self.stall_timeout_s = stall_timeout_s
        self.liveness = liveness
        self.state = WatchdogState(threading.Lock())
        self._abort = abort
        self._inodes = inodes
        self._steps: deque[float] = deque(maxlen=_HISTORY)
        self._warned_slow = False
        self._stop = threading.Event()
        self._beats: dict[int, tuple[bytes | None, float]] = {}
        self._queues = SendQueueTracker()
        self._thread = threading.Thread(target=self._loop, name=f"accelpact-watchdog-r{rank}", daemon=True)

    # -- the guard's side ------------------------------------------------------------------------

    def start(self) -> StallWatchdog:
        self._thread.start()
        shutdown.register(self)  # a store read returning while the interpreter finalizes would abort it
        return self

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop watching; with ``wait_s``, also wait (up to that) for the thread to end."""
        self._stop.set()
        if wait_s > 0:
            shutdown.join_until(self._thread, time.monotonic() + wait_s)

    def stop_for_exit(self, deadline: float) -> threading.Thread | None:
        self._stop.set()
        return shutdown.join_until(self._thread, deadline)

    def begin_attempt(self, generation: int) -> None:
        with self.state.lock:
            self.state.attempt_t0 = time.monotonic()
            self.state.generation = generation
            self.state.fired = None
            self.state.fired_at = None

    def end_attempt(self, completed: bool) -> str | None:
        """The attempt ended (completed: its duration joins the median). Returns why the watchdog
        fired during it, or None."""
        with self.state.lock:
            t0, self.state.attempt_t0 = self.state.attempt_t0, None
            fired, self.state.fired = self.state.fired, None
        if completed and t0 is not None and fired is None:
            self._steps.append(time.monotonic() - t0)
            self._warn_if_raised()
        return fired

    def _warn_if_raised(self) -> None:
        """Say once that the observed steps raised the threshold: the setting alone would misfire."""
        threshold = self.threshold_s()
        if self._warned_slow or threshold <= self.stall_timeout_s:
            return
        self._warned_slow = True
        warnings.warn(
            f"accelpact: stall_timeout_s={self.stall_timeout_s:g} is below 3x the median step "
            f"({threshold:.2f} s), so the watchdog waits {threshold:.2f} s; set "
            f"stall_timeout_s={math.ceil(threshold * 10) / 10:g} or more to say so",
            RuntimeWarning,
            stacklevel=3,
        )

    def fired_reason(self) -> str | None:
        """Why the watchdog aborted the attempt in progress, or None (read without consuming it)."""
        return self.state.fired

    def lookback_s(self) -> float:
        """How long before the threshold the evidence of a stall is gathered: a peer's beat must stay unchanged
        ``stale_after_s``, a send queue full ``stuck_s``, both seen by the time the threshold passes."""
        return max(self.liveness.stale_after_s, self._queues.stuck_s) + 2 * self.tick_s

    def threshold_s(self) -> float:
        """How long an attempt may run before a stall is considered: max(stall_timeout_s, 3 x median)."""
        if len(self._steps) < _MIN_HISTORY:
            return self.stall_timeout_s
        return max(self.stall_timeout_s, SLOW_FACTOR * statistics.median(self._steps))

    # -- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        from accelpact.control.store_client import _new_client

        store = None
        while not self._stop.wait(self.tick_s):
            with self.state.lock:
                t0, gen = self.state.attempt_t0, self.state.generation
                armed = t0 is not None and self.state.fired is None
            if not armed:
                self._beats.clear()
                self._queues.clear()
                continue
            try:
                if store is None:
                    # probe: a store that died (torchrun's agent killed) refuses at once; without the
                    # plain-socket look first, c10d's client retried for the whole 5 s and printed a C++
                    # backtrace every tick the watchdog was armed (test_torchrun_store_loss caught it)
                    store = _new_client(self.host, self.port, 5.0, probe=True)
                why = self._why(store, cast(float, t0), gen)  # armed: t0 is set
            except Exception:  # noqa: BLE001 - a broken client: a new one next tick
                store = None
                continue
            if why is not None:
                self._fire(why, cast(float, t0), gen)

    def _why(self, store: Any, t0: float, gen: int) -> str | None:
        posted = f"{self.token}/gen{gen + 1}/posted"
        if store.check([posted]):
            return "a peer is recovering (posted at the next generation)"
        if len(self._steps) < _MIN_HISTORY:
            # No step time to judge against yet: the first steps hold lazy initialisation and compilation,
            # which rule 2 would take for a stall (docs/detection.md). Only rule 1 fires until then.
            return None
        now = time.monotonic()
        elapsed = now - t0
        threshold = self.threshold_s()
        if elapsed < threshold - self.lookback_s():
            # Far from a stall: no evidence gathered yet. Each look is a /proc scan and a store read per peer,
            # 1-2% of a core at 50 ms ticks, paid in every step otherwise (docs/detection.md).
            self._beats.clear()
            self._queues.clear()
            return None
        stale = self._stale_peers(store, now)
        stuck = self._queues.stuck(send_queues(self._inodes()), now)
        if elapsed < threshold:
            return None
        if stale:
            return f"stall: no progress for {elapsed:.1f} s and rank(s) {stale} stopped beating"
        if stuck:
            return f"stall: no progress for {elapsed:.1f} s and the data-plane link is not delivering"
        return None

    def _stale_peers(self, store: Any, now: float) -> list[int]:
        stale = []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            key = heartbeat_key(self.token, r)
            value = store.get(key) if store.check([key]) else None
            last = self._beats.get(r)
            if last is None or last[0] != value:
                self._beats[r] = (value, now)
            elif now - last[1] >= self.liveness.stale_after_s:
                stale.append(r)
        return stale

    def _fire(self, why: str, t0: float, gen: int) -> None:
        with self.state.lock:
            if self.state.attempt_t0 != t0 or self.state.generation != gen or self.state.fired is not None:
                return  # the attempt ended meanwhile: never abort a generation we were not armed for
            self.state.fired = why
            self.state.fired_at = time.time()
            self._abort()


def progress_of(raw: bytes | None) -> int | None:
    """The progress counter in a heartbeat value (None when absent or unreadable)."""
    if raw is None:
        return None
    try:
        return Beat.parse(raw).progress
    except (ValueError, IndexError):
        return None
