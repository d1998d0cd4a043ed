"""Wiring of the guard's detectors: the heartbeat, the stall watchdog, and the gather's peer watch.

Kept out of guard.py (which owns the step and the commit protocol) so that each detector's start-up
rules live in one place: a detector needs a real control channel (host, port, job token) and runs on
its own store client; without one (tests with a stand-in channel) it is simply absent.
docs/detection.md explains the detectors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from accelpact.common.rank_report import RankReport
from accelpact.detection.liveness import Heartbeat, LivenessConfig, PeerJudge, PeerWatch, is_connection_drop
from accelpact.detection.watchdog import StallWatchdog
from accelpact.errors import AccelPactError

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient

__all__ = ["start_heartbeat", "start_watchdog", "peer_watch", "detection_origin"]


def _store_config(control: ControlClient) -> Any:
    cfg = getattr(control, "config", None)
    return cfg if all(hasattr(cfg, a) for a in ("host", "port", "job_token")) else None


def start_heartbeat(
    control: ControlClient, rank: int, liveness: LivenessConfig | None, progress: Callable[[], int]
) -> Heartbeat | None:
    """This rank's heartbeat thread (None when off or without a real control channel)."""
    cfg = _store_config(control)
    if liveness is None or cfg is None:
        return None
    return Heartbeat(cfg.host, cfg.port, cfg.job_token, rank, config=liveness, progress=progress).start()


def start_watchdog(
    control: ControlClient,
    rank: int,
    world_size: int,
    stall_timeout_s: float | None,
    pg_timeout_s: float,
    liveness: LivenessConfig | None,
    backend: Any,
) -> StallWatchdog | None:
    """The stall watchdog thread (None when off or without a real control channel)."""
    cfg = _store_config(control)
    if stall_timeout_s is None or cfg is None:
        return None
    if stall_timeout_s >= pg_timeout_s:
        raise AccelPactError(
            f"stall_timeout_s={stall_timeout_s} must be below the PG timeout ({pg_timeout_s:.0f} s), or the "
            "timeout fires first: lower stall_timeout_s or pass stall_timeout_s=None to turn the watchdog off"
        )
    sockets = getattr(backend, "sockets", None)
    return StallWatchdog(
        cfg.host,
        cfg.port,
        cfg.job_token,
        rank,
        world_size,
        stall_timeout_s=stall_timeout_s,
        liveness=liveness or LivenessConfig(),
        abort=backend.abort,
        inodes=lambda: set(sockets.inodes) if sockets is not None else set(),
    ).start()


def peer_watch(
    control: ControlClient, rank: int, liveness: LivenessConfig | None, fault: dict[str, str], generation: int
) -> PeerWatch | None:
    """What the report gather watches between its waits (None without a heartbeat or a real channel)."""
    token = getattr(control, "job_token", None)
    if liveness is None or not isinstance(token, str):
        return None
    # After a watchdog abort the dropped connections are this rank's own doing: a stopped peer is
    # a stall, waited for, never declared dead.
    dropped = "watchdog" not in fault and is_connection_drop(fault.get("message", ""))
    return PeerWatch(token, rank, PeerJudge(liveness, connection_dropped=dropped), generation=generation)


def detection_origin(reports: Sequence[RankReport], attempt_start: float) -> tuple[float, str]:
    """What a rank's ``detection_s`` counts from: the earliest injection any rank of the round reported
    (``"injection"``), else this rank's attempt start (``"attempt_start"``).

    A peer of the faulted rank injected nothing itself; timed from its own attempt's start it reported
    how far into its step the fault fell (the bit_identity soak's 135-231 ms), not how late it noticed.
    """
    injections = [r.injected_at for r in reports if r.injected_at is not None]
    return (min(injections), "injection") if injections else (attempt_start, "attempt_start")
