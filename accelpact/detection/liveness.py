"""Liveness on the control plane: each rank's heartbeat, death notices, and the rule that calls a peer dead.

Without it a survivor learns of a dead peer only at the control channel's deadline, although the launcher
saw the exit within milliseconds. Keys, every one under the per-job token:

- ``{token}/hb/{rank}`` = ``"<wall time> <pid> <progress>"``, rewritten every ``interval_s`` by a daemon
  thread on its own store client; a beat is stale once it has not CHANGED for ``missed_beats * interval_s``
  of the reader's monotonic clock, so clock skew between hosts does not matter.
- ``{token}/dead/{rank}`` = a JSON :class:`DeathNotice`, from the launcher (:func:`publish_death`) or from a
  rank whose connection to that peer dropped AND whose peer stopped beating. A notice naming another pid
  than the rank's current beat is ignored, unless that beat is a replacement still ``JOINING``.

A SIGSTOPped rank stops beating but keeps its sockets open: a stall, never called dead.
docs/detection.md has the design, the reasons for each rule and the measurements.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from accelpact import shutdown
from accelpact.common.peer_records import Beat, Verdict
from accelpact.control import notice_auth
from accelpact.control.store_loss import StoreLossReporter

__all__ = [
    "LivenessConfig",
    "Beat",
    "DeathNotice",
    "Verdict",
    "PeerJudge",
    "Heartbeat",
    "publish_death",
    "heartbeat_key",
    "notice_key",
    "is_connection_drop",
    "JOINING",
    "notice_applies",
    "parse_beat",
]

# The progress a replacement beats with from its arrival until its guard takes over (accelpact.recovery.rejoin):
# it is not in the group yet, so the rank's process in the group is the dead one.
JOINING = -2


def heartbeat_key(job_token: str, rank: int) -> str:
    """The control-store key of ``rank``'s heartbeat."""
    return f"{job_token}/hb/{rank}"


def notice_key(job_token: str, rank: int) -> str:
    """The control-store key of the death notice about ``rank``."""
    return f"{job_token}/dead/{rank}"


@dataclass(frozen=True)
class LivenessConfig:
    """How often a rank beats and how many missed beats make a peer stale.

    0.5 s x 4 = 2 s: a beat is one small store ``set`` (tens of microseconds of CPU, the GIL held for
    a few of them), so 2 per second costs nothing measurable at step level (benchmarks/bench_detection.py).
    """

    interval_s: float = 0.5
    missed_beats: int = 4

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.missed_beats < 1:
            raise ValueError(
                f"heartbeat interval_s={self.interval_s} must be > 0 and missed_beats="
                f"{self.missed_beats} >= 1: e.g. LivenessConfig(interval_s=0.5, missed_beats=4)"
            )

    @property
    def stale_after_s(self) -> float:
        return self.interval_s * self.missed_beats


@dataclass(frozen=True)
class DeathNotice:
    """Who says which process of which rank died, and why."""

    rank: int
    by: str  # "launcher", "parent", "rank<r>", ...
    reason: str
    pid: int | None = None
    t: float = field(default_factory=time.time)
    generation: int | None = None

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> DeathNotice:
        d = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        return cls(
            rank=int(d["rank"]),
            by=str(d.get("by", "?")),
            reason=str(d.get("reason", "")),
            pid=d.get("pid"),
            t=float(d.get("t", 0.0)),
            generation=d.get("generation"),
        )


def publish_death(
    store: Any,
    job_token: str,
    rank: int,
    *,
    by: str,
    reason: str,
    pid: int | None = None,
    generation: int | None = None,
) -> DeathNotice:
    """Write a death notice about ``rank`` of job ``job_token``: the hook for launchers.

    ``store`` is anything with ``set(key, bytes)``: a ``torch.distributed.TCPStore`` (client or the
    server object itself) or an :class:`accelpact.control.ControlChannel`. Call it as soon as the
    launcher reaps the rank (``waitpid``), with the pid it reaped, so that survivors stop waiting for
    it within their next watch slice instead of at the control deadline.
    """
    if not job_token or "/" in job_token:
        raise ValueError(f"job_token {job_token!r} must be the job's token (ACCELPACT_JOB_TOKEN), without '/'")
    notice = DeathNotice(rank=rank, by=by, reason=reason, pid=pid, generation=generation)
    store.set(notice_key(job_token, rank), notice_auth.sign(asdict(notice), job_token))  # see notice_auth
    return notice


# Lower-cased fragments of a fault that means "the connection to a peer went away" (as opposed to a
# timeout): gloo's "Connection closed by peer", a TCP reset, a write into a closed socket.
_DROP_MARKERS = ("connection closed", "connection reset", "broken pipe", "connection refused", "eof")


def is_connection_drop(message: str) -> bool:
    """True when a fault's text says a peer's connection dropped (never a timeout or a stall)."""
    text = message.lower()
    return any(m in text for m in _DROP_MARKERS) and "timed out" not in text


class PeerJudge:
    """Pure bookkeeping of what one rank has seen of its peers' beats and notices (no I/O, no torch).

    ``connection_dropped``: this rank's own fault was a dropped connection (the only case in which a
    silent peer may be called dead: a stopped or partitioned peer is a stall, not a death).
    ``joining_is_dead``: see :func:`notice_applies`.
    """

    def __init__(self, config: LivenessConfig, *, connection_dropped: bool, joining_is_dead: bool = True) -> None:
        self.config = config
        self.connection_dropped = connection_dropped
        self.joining_is_dead = joining_is_dead  # see notice_applies
        self._seen: dict[int, tuple[bytes | None, float]] = {}  # rank -> (last value, when it changed)

    def observe(self, rank: int, beat: bytes | None, notice: bytes | None, now: float) -> Verdict | None:
        """Feed one look at ``rank``'s beat and notice (raw values or None); a Verdict when it is lost."""
        parsed = parse_beat(beat)
        if notice is not None:
            n = _parse_notice(notice)
            if n is not None and notice_applies(n.pid, parsed, joining_is_dead=self.joining_is_dead):
                return Verdict((rank,), "notice", f"{n.by}: {n.reason}")
        last = self._seen.get(rank)
        if last is None or last[0] != beat:
            self._seen[rank] = (beat, now)
            return None
        silent = now - last[1]
        if self.connection_dropped and silent >= self.config.stale_after_s:
            return Verdict(
                (rank,),
                "heartbeat",
                f"its connection dropped and it has not beaten for {silent:.1f} s "
                f"({self.config.missed_beats} beats of {self.config.interval_s} s)",
            )
        return None

    def progress(self, rank: int) -> int | None:
        """The progress counter of ``rank``'s last observed beat, or None."""
        last = self._seen.get(rank)
        parsed = parse_beat(last[0]) if last else None
        return parsed.progress if parsed else None


def notice_applies(notice_pid: int | None, beat: Beat | None, *, joining_is_dead: bool = True) -> bool:
    """Whether a death notice naming ``notice_pid`` means the rank's process in the group is dead, given the
    rank's current beat: no pid to compare, no beat, the same pid, or (``joining_is_dead``) a replacement
    that has not joined yet. A heal that waits for that very replacement passes False: for it the notice is
    about the predecessor it already heals."""
    return (
        notice_pid is None
        or beat is None
        or beat.pid < 0
        or notice_pid == beat.pid
        or (joining_is_dead and beat.progress == JOINING)
    )


def parse_beat(raw: bytes | None) -> Beat | None:
    """A heartbeat value parsed, or None when absent or unreadable."""
    if raw is None:
        return None
    try:
        return Beat.parse(raw)
    except (ValueError, IndexError):
        return None


def _parse_notice(raw: bytes) -> DeathNotice | None:
    try:
        return DeathNotice.from_bytes(raw)
    except (ValueError, KeyError, TypeError):
        return None


class Heartbeat:
    """A daemon thread that rewrites this rank's beat every ``interval_s`` on its own store client.

    Never keeps the process alive (daemon), stopped by :meth:`stop` (the guard's ``close()``). A store
    call that hangs (a blackhole on the control link) only delays the beats, which is what peers
    should see. ``progress`` is read on every beat (an int the guard bumps at each step boundary).
    """

    def __init__(
        self,
        host: str,
        port: int,
        job_token: str,
        rank: int,
        *,
        config: LivenessConfig = LivenessConfig(),
        progress: Callable[[], int] = lambda: 0,
    ) -> None:
        self.host, self.port, self.rank = host, port, rank
        self.key = heartbeat_key(job_token, rank)
        self.config = config
        self.progress = progress
        self.beats = 0
        self.store_loss = StoreLossReporter(rank, host, port)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"accelpact-heartbeat-r{rank}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        shutdown.register(self)  # a beat landing while the interpreter finalizes would abort it
        return self

    def stop_for_exit(self, deadline: float) -> threading.Thread | None:
        self._stop.set()
        return shutdown.join_until(self._thread, deadline)

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop beating; with ``wait_s``, also wait (up to that) for a beat being written to land."""
        self._stop.set()
        if wait_s > 0 and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        from accelpact.control.store_client import _new_client

        store = None
        pid = os.getpid()
        while not self._stop.is_set():
            try:
                if store is None:
                    store = _new_client(self.host, self.port, max(5.0, 4 * self.config.interval_s), probe=True)
                store.set(self.key, Beat.format(pid, int(self.progress())))  # type: ignore[arg-type]  # bytes: fine
                self.beats += 1
                self.store_loss.answered()
            except Exception as exc:  # noqa: BLE001 - a broken client: build a new one at the next beat
                store = None
                self.store_loss.failed(exc)  # said once per loss (accelpact.control.store_loss)
            self._stop.wait(self.config.interval_s)


class PeerWatch:
    """What a rank waiting on the control store does between two short waits: look at the missing
    peers' notices and beats (one store client, on the control channel's worker), and publish a notice
    itself when the rule calls a peer dead, so that every other rank stops waiting too.

    ``slice_s``: how long one wait lasts before the next look (50 ms: a look is 2 store round trips per
    missing rank, well under a millisecond on the control link, so a notice is seen within ~50 ms).
    """

    slice_s: float = 0.05

    def __init__(self, job_token: str, rank: int, judge: PeerJudge, *, generation: int | None = None) -> None:
        self.job_token = job_token
        self.rank = rank
        self.judge = judge
        self.generation = generation
        self.rejected: dict[int, str] = {}  # rank -> why its notice was ignored (reported once)

    def _authentic(self, rank: int, notice: bytes | None) -> bytes | None:
        """The notice if it is signed for this job and not from an older generation (notice_auth);
        otherwise None, reported once per rank (a forged or stray notice must not stop the job)."""
        if notice is None:
            return None
        try:
            notice_auth.verify(notice, self.job_token, min_generation=self.generation)
        except notice_auth.NoticeRejected as why:
            if rank not in self.rejected:
                self.rejected[rank] = str(why)
                warnings.warn(f"accelpact: ignored a death notice about rank {rank}: {why}", stacklevel=2)
            return None
        return notice

    def check(self, store: Any, missing: list[int]) -> Verdict | None:
        """One look at every missing rank; the first Verdict found, or None."""
        now = time.monotonic()
        for r in missing:
            nk, hk = notice_key(self.job_token, r), heartbeat_key(self.job_token, r)
            notice = store.get(nk) if store.check([nk]) else None
            notice = self._authentic(r, notice)
            beat = store.get(hk) if store.check([hk]) else None
            verdict = self.judge.observe(r, beat, notice, now)
            if verdict is None:
                continue
            if verdict.detected_by == "heartbeat":
                parsed = parse_beat(beat)
                publish_death(
                    store,
                    self.job_token,
                    r,
                    by=f"rank{self.rank}",
                    reason=verdict.reason,
                    pid=parsed.pid if parsed and parsed.pid >= 0 else None,
                    generation=self.generation,
                )
            return verdict
        return None
