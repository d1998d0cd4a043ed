"""One attempt at a step on a torchft rank: how it is timed, and the records it becomes.

torchft's Manager reports no timings, so its client, process group, transport and error path are wrapped
here; each wrapper writes into the owner's current :class:`Attempt` (a new one per try of a step). The
record builders turn attempts into the step's torchft fields, a discarded attempt's ``recovery`` and a
heal's ``heal`` (``harness.strategies.torchft_report`` reads them back for the row).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol


@dataclasses.dataclass
class Attempt:
    """One attempt at a step on this rank, as torchft's Manager went through it."""

    t_start: float
    t_quorum_start: float | None = None
    t_quorum_end: float | None = None
    t_configured: float | None = None
    quorum_id: int | None = None
    replica_world_size: int | None = None
    heal: bool = False
    recover_dst: tuple[int, ...] = ()
    max_step: int | None = None
    t_error: float | None = None
    error: str = ""
    quorum_wait_s: float = 0.0  # main thread blocked on the asynchronous quorum
    send_s: float = 0.0
    recv_s: float = 0.0
    should_commit_s: float = 0.0
    t_end: float | None = None


class AttemptOwner(Protocol):
    """What the wrappers write into: the strategy, whose ``attempt`` is replaced on every try of a step."""

    attempt: Attempt


class TimedClient:
    """torchft's ManagerClient with the quorum timed (it runs on the Manager's quorum thread)."""

    def __init__(self, client: Any, owner: AttemptOwner) -> None:
        self._client = client
        self._owner = owner

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        a = self._owner.attempt
        a.t_quorum_start = time.time()
        q = self._client._quorum(*args, **kwargs)
        a.t_quorum_end = time.time()
        a.quorum_id, a.replica_world_size, a.heal = q.quorum_id, q.replica_world_size, bool(q.heal)
        a.recover_dst, a.max_step = tuple(q.recover_dst_replica_ranks), q.max_step
        return q

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def timed_transport(pg: Any, owner: AttemptOwner, **options: Any) -> Any:
    """torchft's PGTransport over ``pg`` (``options`` are its own), with the heal's send and receive timed."""
    from torchft.checkpointing.pg_transport import PGTransport  # lazy: torchft

    class TimedPGTransport(PGTransport):
        def send_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            t = time.time()
            try:
                super().send_checkpoint(*args, **kwargs)
            finally:
                owner.attempt.send_s += time.time() - t

        def recv_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            t = time.time()
            try:
                return super().recv_checkpoint(*args, **kwargs)
            finally:
                owner.attempt.recv_s += time.time() - t

    return TimedPGTransport(pg, **options)


def time_manager(manager: Any, pg: Any, owner: AttemptOwner) -> None:
    """Wrap a built Manager (and its cross-group process group) so that every attempt records its quorum,
    the process group's reconfiguration, the wait for the quorum and the first error."""
    manager._client = TimedClient(manager._client, owner)
    configure = pg.configure

    def timed_configure(*args: Any, **kwargs: Any) -> None:
        configure(*args, **kwargs)
        owner.attempt.t_configured = time.time()

    pg.configure = timed_configure
    wait_quorum = manager.wait_quorum

    def timed_wait() -> None:
        t = time.time()
        try:
            wait_quorum()
        finally:
            owner.attempt.quorum_wait_s += time.time() - t

    manager.wait_quorum = timed_wait
    report_error = manager.report_error

    def noted_error(e: Exception) -> None:
        if owner.attempt.t_error is None:
            owner.attempt.t_error = time.time()
            owner.attempt.error = f"{type(e).__name__}: {str(e)[:200]}"
        report_error(e)

    manager.report_error = noted_error


# -- the records ------------------------------------------------------------------------------------------


def step_fields(a: Attempt, attempts: int, participants: int, groups: int) -> dict[str, Any]:
    """torchft's figures on a committed step's ``step`` record."""
    return {
        "torchft_attempts": attempts,
        "torchft_quorum_id": a.quorum_id,
        "torchft_participants": participants,
        "torchft_groups": groups,
        "torchft_quorum_s": (a.t_quorum_end - a.t_quorum_start) if a.t_quorum_start and a.t_quorum_end else None,
        "torchft_configure_s": (a.t_configured - a.t_quorum_end) if a.t_configured and a.t_quorum_end else None,
        "torchft_quorum_wait_s": a.quorum_wait_s,
        "torchft_should_commit_s": a.should_commit_s,
    }


def retry_fields(failed: Attempt, retry: Attempt) -> dict[str, Any]:
    """A discarded attempt, as a "retry" recovery ending when the retry's process group was ready:
    detection (the error -> should_commit said no), agreement (-> the new quorum), rebuild (-> the
    cross-group process group reconfigured)."""
    t_err = failed.t_error if failed.t_error is not None else failed.t_end
    assert failed.t_end is not None and t_err is not None
    q_end = retry.t_quorum_end or failed.t_end
    ready = max(retry.t_configured or q_end, q_end)
    return dict(
        t=ready,
        decision="retry",
        generation=retry.quorum_id or 0,
        detected_by="exception",
        detection_s=max(0.0, failed.t_end - t_err),
        agreement_s=max(0.0, q_end - failed.t_end),
        rebuild_s=max(0.0, ready - q_end),
        rebind_s=0.0,
        first_collective_s=0.0,
        torchft_error=failed.error,
        torchft_quorum_id=retry.quorum_id,
        torchft_old_quorum_id=failed.quorum_id,
    )


def heal_fields(a: Attempt, first_of_replacement: bool, t_launch: float) -> dict[str, Any]:
    """This group was behind and loaded a peer's state in attempt ``a`` (the first heal of a replacement
    counts its start from ``t_launch``)."""
    start = a.t_quorum_start or a.t_start
    replacement_start = max(0.0, start - t_launch) if first_of_replacement and t_launch else 0.0
    assert a.t_end is not None
    return dict(
        t=a.t_end,
        role="replacement" if first_of_replacement else "rejoin",
        source="peer",
        generation=a.quorum_id or 0,
        replacement_start_s=replacement_start,
        heal_transfer_s=a.t_end - start,
        total_s=replacement_start + a.t_end - start,
        recv_s=a.recv_s,
        to_step=a.max_step,
        transport="torchft PGTransport",
    )


def sent_fields(a: Attempt) -> dict[str, Any]:
    """This group sent its state to the healing groups: the time the training thread waited for it."""
    assert a.t_end is not None
    return dict(
        t=(a.t_quorum_end or a.t_start) + a.send_s,
        role="sender",
        source="peer",
        generation=a.quorum_id or 0,
        replacement_start_s=0.0,
        heal_transfer_s=min(a.quorum_wait_s, a.send_s),
        total_s=a.send_s,
        send_s=a.send_s,
        to_ranks=list(a.recover_dst),
        transport="torchft PGTransport",
    )
