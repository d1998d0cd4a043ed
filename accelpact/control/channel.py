"""The out-of-band control channel: a long-lived TCPStore client with its own deadlines and reconnects.

Ranks agree on how to recover over this channel, never over the data plane that just failed. It is a
client of a TCPStore server hosted by a process the data-plane faults do not touch (the launcher, the
harness parent, or the test process). Every store call runs on a worker thread and is given up at the
caller's deadline, because a store ``wait`` is not honoured during a blackhole; a call that fails with a
network error reconnects and retries. Every key starts with the per-job token and carries the recovery
round's generation. docs/design.md ("The control channel") has the facts this rests on and the
generation rule that keeps ranks at most one round apart.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelpact.common.peer_records import Beat, Verdict
from accelpact.control import launch_env as _launch_env
from accelpact.control.data_plane_store import DataPlaneStores
from accelpact.control.store_client import (
    _Connection,
    _first_line,
    _is_connection_error,
    _is_wait_timeout,
    _new_client,
    _StoreRefused,
)
from accelpact.errors import ControlChannelError, RankLostError

if TYPE_CHECKING:
    import torch.distributed

    from accelpact.common.control_client import PeerCheck

__all__ = ["ControlConfig", "ControlChannel"]

# How much longer than its own deadline a call may take before the caller gives up on the worker:
# covers thread hand-off and the store's own timeout firing at the same instant as ours.
_GRACE_S = 0.5
# Pause between reconnect attempts while the server refuses connections.
_RECONNECT_BACKOFF_S = 0.05


@dataclass(frozen=True)
class ControlConfig:
    """Where the control store is and who this rank is. ``job_token`` must not contain '/'."""

    host: str
    port: int
    rank: int
    world_size: int
    job_token: str  # per-job; every key is prefixed with it so a stray process of another job can't join
    deadline_s: float = 30.0  # default own deadline for every blocking operation
    connect_timeout_s: float = 30.0
    token_source: str = "job_token"  # where the token came from (e.g. ACCELPACT_JOB_TOKEN), for errors

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} / world_size {self.world_size}: need 0 <= rank < world_size")
        if not self.job_token or "/" in self.job_token:
            raise ValueError(f"job_token {self.job_token!r} must be non-empty and contain no '/': use new_job_token()")
        if self.deadline_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("deadline_s and connect_timeout_s must be positive")


class ControlChannel(DataPlaneStores):
    """A rank's handle on the control store. Thread-safe; calls are serialised on one connection.

    Attributes: ``rank``, ``world_size``, ``job_token``, ``generation`` (the current data-plane
    generation, starting at 0), ``connects`` / ``reconnects`` (clients built / replaced so far).
    """

    rank: int
    world_size: int
    job_token: str
    generation: int

    def __init__(self, config: ControlConfig):
        """Use :meth:`connect` or :meth:`from_env`; this does no I/O."""
        self.config = config
        self.rank = config.rank
        self.world_size = config.world_size
        self.job_token = config.job_token
        self.generation = 0
        self.connects = 0
        self._lock = threading.RLock()
        self._conn: _Connection | None = None
        self._dp_generations: set[int] = set()
        self._spare: tuple[Future[torch.distributed.TCPStore], int] | None = (
            None  # (connecting data-plane client, self.connects then)
        )
        self._closed = False

    # ------------------------------------------------------------------ construction

    @classmethod
    def connect(cls, config: ControlConfig) -> ControlChannel:
        """Connect to the control store; ControlChannelError if it is unreachable within connect_timeout_s."""
        chan = cls(config)
        chan._call(lambda s: s.check([chan.key("hello")]), time.monotonic() + config.connect_timeout_s, "connect")
        return chan

    @classmethod
    def from_env(cls, rank: int | None = None, world_size: int | None = None) -> ControlChannel:
        """Connect using ACCELPACT_CONTROL_ADDR=host:port, ACCELPACT_JOB_TOKEN, RANK, WORLD_SIZE.

        Under torchrun, a missing ACCELPACT_CONTROL_ADDR / ACCELPACT_JOB_TOKEN falls back to torchrun's
        own store and run id (see :meth:`from_torchrun`). Optional: ACCELPACT_CONTROL_DEADLINE_S,
        ACCELPACT_CONTROL_CONNECT_TIMEOUT_S. Explicit ``rank`` / ``world_size`` win over the environment.
        """
        return cls._from_settings(_launch_env.control_settings(), rank, world_size)

    @classmethod
    def from_torchrun(cls, rank: int | None = None, world_size: int | None = None) -> ControlChannel:
        """Connect to the store torchrun's agent hosts (MASTER_ADDR:MASTER_PORT), job token from its run
        id (docs/torchrun.md). AccelPactError when this process was not started by torchrun."""
        return cls._from_settings(_launch_env.control_settings(torchrun_only=True), rank, world_size)

    @classmethod
    def _from_settings(cls, settings: dict[str, Any], rank: int | None, world_size: int | None) -> ControlChannel:
        rank = _launch_env.launcher_int("RANK") if rank is None else rank
        world_size = _launch_env.launcher_int("WORLD_SIZE") if world_size is None else world_size
        return cls.connect(ControlConfig(rank=rank, world_size=world_size, **settings))

    def join(self, deadline_s: float | None = None) -> None:
        """Post this rank under its job token and wait, within ``connect_timeout_s``, for all ranks
        (attach calls it): a token or world-size mismatch fails here, naming the missing ranks.

        Posts ``{token}/members/{rank}`` = world size. Keys are never read across tokens, so a rank
        started with another job token (or another world size) waits in a namespace of its own;
        without this check it would only show up as "lost" at the first fault, after the whole control
        deadline (31 s by default), on every rank. Here it fails within the connect deadline, naming the
        missing ranks and the variable the token came from. Idempotent: keys are never deleted, so a
        second attach passes at once.
        """
        timeout_s = self.config.connect_timeout_s if deadline_s is None else deadline_s
        keys = [self.key("members", str(r)) for r in range(self.world_size)]
        self.set(keys[self.rank], str(self.world_size).encode())
        what = f"join of job token {self.job_token!r}"
        source = self.config.token_source
        if self._wait_for(keys, time.monotonic() + timeout_s, what) is None:
            missing = self._missing(keys, what)
            if missing:
                raise ControlChannelError(
                    f"rank(s) {missing} of {self.world_size} did not join job token {self.job_token!r} (from "
                    f"{source}) on control store {self._addr} within connect_timeout_s={timeout_s:g}; seen from "
                    f"rank {self.rank}. Every rank must get the same {source} and WORLD_SIZE; a rank with another "
                    "token waits on its own."
                )
        sizes = self._call(lambda s: s.multi_get(keys), self._deadline(None), what)
        other = [r for r, v in enumerate(sizes) if int(v) != self.world_size]
        if other:
            raise ControlChannelError(
                f"rank(s) {other} joined job token {self.job_token!r} with another world size than rank "
                f"{self.rank}'s {self.world_size}: every rank must be started with the same WORLD_SIZE"
            )

    # ------------------------------------------------------------------ plumbing

    @property
    def _addr(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    def _deadline(self, deadline_s: float | None) -> float:
        return time.monotonic() + (self.config.deadline_s if deadline_s is None else deadline_s)

    @property
    def reconnects(self) -> int:
        """How many times a broken or stalled client was replaced by a new connection."""
        return max(self.connects - 1, 0)

    def _discard(self, conn: _Connection) -> None:
        """Stop using conn (reset or stalled); the next call builds a new one."""
        with self._lock:
            conn.worker.stop()  # a worker stuck in a call exits once that call returns
            if self._conn is conn:
                self._conn = None

    def _run(self, conn: _Connection, fn: Callable[[], Any], deadline: float, what: str) -> Any:
        """Run fn on conn's worker; at the deadline (plus grace) give up and abandon conn."""
        fut = conn.worker.submit(fn)
        try:
            return fut.result(timeout=max(deadline - time.monotonic(), 0.0) + _GRACE_S)
        except FutureTimeout:
            self._discard(conn)  # its socket may be mid-reply: never reuse it
            knob = (
                f"connect_timeout_s={self.config.connect_timeout_s:g}"
                if self.connects == 0
                else f"deadline_s={self.config.deadline_s:g}"
            )
            raise ControlChannelError(
                f"control store {self._addr} did not answer {what} before the deadline (rank {self.rank}, "
                f"generation {self.generation}): the store host is stalled or the network to it is down. "
                f"Check the process hosting the store, or raise {knob}."
            ) from None

    def _connection(self, deadline: float) -> _Connection:
        with self._lock:
            if self._closed:
                raise ControlChannelError(f"control channel of rank {self.rank} is closed")
            if self._conn is None:
                conn = _Connection(f"accelpact-control-r{self.rank}")
                timeout_s = max(self.config.connect_timeout_s, self.config.deadline_s) + _GRACE_S
                first = self.connects == 0
                try:
                    conn.store = self._run(
                        conn,
                        lambda: _new_client(self.config.host, self.config.port, timeout_s, probe=True, first=first),
                        deadline,
                        "a connection",
                    )
                except _StoreRefused as refused:
                    self._discard(conn)
                    # One line, at once: a refusal does not heal by waiting (nothing listens there).
                    raise ControlChannelError(
                        f"control store {self._addr} {refused} on rank {self.rank}; waiting will not help. "
                        f"Check the address (ACCELPACT_CONTROL_ADDR, or torchrun's "
                        f"MASTER_ADDR:MASTER_PORT) and that the store host is up; connect_timeout_s="
                        f"{self.config.connect_timeout_s:g} only bounds a store that does not answer."
                    ) from None
                except BaseException:
                    self._discard(conn)
                    raise
                self._conn = conn
                self.connects += 1
            return self._conn

    def _call(self, fn: Callable[[Any], Any], deadline: float, what: str, *, idempotent: bool = True) -> Any:
        """fn(store) with reconnect-and-retry on broken connections, all within the own deadline."""
        last: BaseException | None = None
        failures = 0
        while True:
            if time.monotonic() >= deadline:
                raise ControlChannelError(
                    f"control store {self._addr} unreachable for {what} until the deadline (rank {self.rank}); "
                    f"last error: {_first_line(last) if last else 'none'}. Is the store host alive?"
                )
            conn = None
            try:
                conn = self._connection(deadline)
                return self._run(conn, lambda: fn(conn.store), deadline, what)  # noqa: B023 - awaited in this iteration
            except ControlChannelError:
                raise
            except Exception as exc:
                if not _is_connection_error(exc):
                    raise
                last = exc
                if conn is not None:
                    self._discard(conn)  # a reset client never recovers by itself: build a new one
                if not idempotent and "broken pipe" not in str(exc).lower():
                    raise ControlChannelError(
                        f"{what} on control store {self._addr} failed mid-request ({_first_line(exc)}); it may or "
                        f"may not have been applied, so it is not retried. Re-read the key before retrying."
                    ) from exc
                failures += 1
                if failures > 1:  # the first retry goes straight to a new client: a reset needs no pause
                    time.sleep(min(_RECONNECT_BACKOFF_S, max(deadline - time.monotonic(), 0.0)))

    # ------------------------------------------------------------------ key-value API

    def key(self, *parts: str) -> str:
        """The namespaced key ``{job_token}/part/part...`` (never a bare key)."""
        if not parts or any(not isinstance(p, str) or not p for p in parts):
            raise ValueError(f"key parts must be non-empty strings, got {parts!r}")
        return "/".join((self.job_token, *parts))

    def set(self, key: str, value: bytes) -> None:
        """Set a full key (build it with :meth:`key`)."""
        self._call(lambda s: s.set(key, value), self._deadline(None), f"set({key!r})")

    def get(self, key: str, deadline_s: float | None = None) -> bytes:
        """Value of ``key``, waiting for it until the own deadline (ControlChannelError naming the key
        if it is still absent then). Reconnects transparently after a reset."""
        values = self._wait_for([key], self._deadline(deadline_s), f"get({key!r})")
        if values is None:
            raise ControlChannelError(
                f"key {key!r} did not appear on control store {self._addr} before the deadline (rank {self.rank})"
            )
        return values[0]

    def add(self, key: str, amount: int) -> int:
        """Atomic add; retried after a reconnect only when the request provably never reached the server."""
        return int(self._call(lambda s: s.add(key, amount), self._deadline(None), f"add({key!r})", idempotent=False))

    def _wait_for(self, keys: list[str], deadline: float, what: str) -> list[bytes] | None:
        """Values of all keys, or None if some are still missing at the deadline."""

        values: list[bytes] | None = self._call(lambda store: _wait_then_get(store, keys, deadline), deadline, what)
        return values

    def _missing(self, keys: list[str], what: str) -> list[int]:
        """Indices of keys absent right now (a diagnosis after a deadline, given its own short one)."""
        present = self._call(lambda s: [s.check([k]) for k in keys], time.monotonic() + _GRACE_S * 4, what)
        return [i for i, ok in enumerate(present) if not ok]

    # ------------------------------------------------------------------ collectives over the store

    def _round_keys(self, generation: int, tag: str) -> list[str]:
        return [self.key(f"gen{generation}", tag, str(r)) for r in range(self.world_size)]

    def gather(
        self, tag: str, payload: bytes, generation: int, deadline_s: float | None = None, watch: PeerCheck | None = None
    ) -> dict[int, bytes]:
        """Post ``payload`` under gen{generation}/{tag}/{rank}; return every rank's payload by rank.

        Ranks that have not posted by the own deadline raise RankLostError naming them; an unreachable
        store raises ControlChannelError. With ``watch`` (accelpact.detection.liveness.PeerWatch) the wait runs in
        short slices and, between them, looks at the missing ranks' death notices and heartbeats: a
        rank found dead raises RankLostError at once (``detected_by`` "notice" or "heartbeat"); the
        deadline stays the backstop. Use each (tag, generation) once: keys are never deleted, so a
        second gather with the same pair would return the first one's payloads.
        """
        deadline = self._deadline(deadline_s)
        keys = self._round_keys(generation, tag)
        posted = self.key(f"gen{generation}", "posted")
        what = f"gather {tag!r} of generation {generation}"

        def attempt(store: Any) -> Any:  # list[bytes] | Verdict | None; Any: torch's Store stub lacks multi_set
            # Post, wait and read in ONE hand-off to the worker and three store round trips: during
            # a recovery every hop is a scheduler wake-up on a loaded host. Safe to retry whole
            # after a reconnect: setting our own key again is idempotent.
            store.multi_set([keys[self.rank], posted], [payload, b"1"])
            if watch is not None:
                # Look, then sleep a slice: a store wait() with a short timeout would do the same, but
                # torch logs two warnings per timed-out wait (20 lines a second in the rank's log).
                # The slice starts at 1 ms and doubles up to watch.slice_s: the peers of a recovery
                # post within milliseconds of each other, and a fixed 50 ms slice made the ranks leave
                # the gather up to 50 ms apart (world 4: agreement + rebuild ~110 ms vs ~22 ms before).
                pause = 0.001
                while time.monotonic() < deadline:
                    missing = [r for r, k in enumerate(keys) if not store.check([k])]
                    if not missing:
                        return store.multi_get(keys)
                    verdict = watch.check(store, missing)
                    if verdict is not None:
                        return verdict
                    time.sleep(min(pause, watch.slice_s, max(deadline - time.monotonic(), 0.0)))
                    pause *= 2
                return store.multi_get(keys) if store.check(keys) else None
            return _wait_then_get(store, keys, deadline)

        values = self._call(attempt, deadline, what)
        if isinstance(values, Verdict):
            raise RankLostError(
                f"rank(s) {list(values.ranks)} of {self.world_size} died, seen from rank {self.rank} during "
                f"{what} (detected by {values.detected_by}: {values.reason})",
                ranks=values.ranks,
                generation=generation,
                detected_by=values.detected_by,
            )
        if values is not None:
            return dict(enumerate(values))
        missing = self._missing(keys, what)
        if not missing:  # everyone arrived just as the deadline passed; keys are never deleted
            return dict(enumerate(self._call(lambda s: s.multi_get(keys), time.monotonic() + _GRACE_S * 4, what)))
        raise RankLostError(
            f"rank(s) {missing} of {self.world_size} did not reach {what} (job {self.job_token}) before the "
            f"deadline; seen from rank {self.rank}. The rank died, hangs, or is in another generation: "
            f"recovery in memory is impossible, restore from a checkpoint.",
            ranks=tuple(missing),
            generation=generation,
            detected_by="deadline",
        )

    def barrier(self, tag: str, generation: int, deadline_s: float | None = None) -> None:
        """Wait until every rank reached this barrier; RankLostError naming the absent ranks at the deadline."""
        self.gather(f"barrier/{tag}", b"", generation, deadline_s)

    def generation_superseded(self, deadline_s: float | None = None) -> bool:
        """True once any rank posted at generation ``self.generation + 1``: a peer is already recovering,
        so this rank's data plane is dead even if its own collective has not failed yet."""
        key = self.key(f"gen{self.generation + 1}", "posted")
        return bool(self._call(lambda s: s.check([key]), self._deadline(deadline_s), "generation check"))

    # ------------------------------------------------------------------ generations

    def advance_generation(self) -> int:
        """generation += 1; each rank calls it exactly once per recovery round. Returns the new generation."""
        with self._lock:
            self.generation += 1
            return self.generation

    # ------------------------------------------------------------------ liveness

    def heartbeat(self, progress: int = 0) -> None:
        """Record 'alive now' (wall-clock seconds) for this rank, with ``progress`` (a replacement: JOINING)."""
        self.set(self.key("hb", str(self.rank)), Beat.format(os.getpid(), progress))

    def last_seen(self, rank: int) -> float | None:
        """Wall-clock time of ``rank``'s last heartbeat, or None if it never sent one.

        Comparable across processes of one host; across hosts it inherits their clock skew.
        """
        key = self.key("hb", str(rank))
        value = self._call(lambda s: s.get(key) if s.check([key]) else None, self._deadline(None), "last_seen")
        return None if value is None else Beat.parse(value).t

    def close(self) -> None:
        """Release the connection. Data-plane stores handed out stay usable by their groups."""
        with self._lock:
            self._closed = True
            self._spare = None  # its client closes when collected
            if self._conn is not None:
                self._discard(self._conn)

    def __enter__(self) -> ControlChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_then_get(store: torch.distributed.Store, keys: list[str], deadline: float) -> list[bytes] | None:
    """Values of all ``keys`` once present, or None if some are still missing at ``deadline`` (monotonic).

    One store wait and one read: a wait() on keys already there returns at once."""
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            if not store.check(keys):
                return None
        else:
            store.wait(keys, datetime.timedelta(seconds=remaining))
    except Exception as exc:
        if _is_wait_timeout(exc):
            return None
        raise
    return store.multi_get(keys)
