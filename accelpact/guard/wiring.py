"""What a :class:`accelpact.guard.core.Guard` is made of, built in one place.

:func:`wire` makes the guard's collaborators in the order they depend on each other: the data plane
(the groups and how to get their next generation), the heartbeat and the stall watchdog, the waiter
that can give up the guard's own collectives, the commit vote, the recovery context (what recovery rounds and heals
get instead of the guard) and, with ``heal=``, the healer. None of them holds the guard: they reach
it only through the two callables passed in, its phase hook and its progress counter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.backends.interruptible import CollectiveWaiter
from accelpact.dataplane.plane import DataPlane
from accelpact.dataplane.registry import attach_data_plane
from accelpact.dataplane.reset import reset_after_fault
from accelpact.detection import start as detection
from accelpact.events import RecoveryLog
from accelpact.guard.config import GuardConfig
from accelpact.guard.vote import CommitVote
from accelpact.recovery.context import RecoveryContext, StepState

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient
    from accelpact.detection.liveness import Heartbeat
    from accelpact.detection.watchdog import StallWatchdog
    from accelpact.recovery.heal import Healer, HealPolicy

_log = logging.getLogger(__name__)

__all__: list[str] = []  # private to accelpact.guard


@dataclass(frozen=True)
class GuardParts:
    """A guard's collaborators (see the module docstring); the guard keeps each as an attribute."""

    plane: DataPlane  # the only part of the guard that recovery and the heal may touch, besides the step state
    heartbeat: Heartbeat | None  # None: no heartbeat (liveness off, or no real control channel)
    watchdog: StallWatchdog | None  # None: no stall watchdog
    wait: CollectiveWaiter  # how the clip norm's and the vote's all-reduce are waited for
    vote: CommitVote
    recovery: RecoveryContext
    healer: Healer | None  # None: no heal= (a lost rank raises RankLostError)


def wire(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    control: ControlClient,
    *,
    rank: int,
    world_size: int,
    process_group: dist.ProcessGroup | None,
    config: GuardConfig,
    state: StepState,
    events: RecoveryLog,
    snapshots: Any,
    heal: HealPolicy | None,
    hook: Callable[[str, int], None],
    progress: Callable[[], int],
) -> GuardParts:
    """Build a guard's collaborators; the data plane is left ready for the first fault.

    ``state`` and ``events`` are the guard's own (recovery moves the one and appends to the other);
    ``hook(phase, step)`` runs the guard's phase hooks; ``progress()`` is the counter peers read from
    this rank's heartbeat."""
    plane = attach_data_plane(
        config.data_plane,
        model,
        optimizer,
        control,
        process_group=process_group,
        group_timeout=config.pg_timeout,
        verify_rebind=config.verify_rebind,
    )
    _log.info("rank %d: data plane %s (%s)", rank, plane.last_path["path"], plane.last_path["why"])
    heartbeat = detection.start_heartbeat(control, rank, config.liveness, progress)
    watchdog = detection.start_watchdog(
        control,
        rank,
        world_size,
        config.stall_timeout_s,
        plane.pg_timeout.total_seconds(),
        config.liveness,
        plane.backend,
    )
    # gloo can leave these all-reduces waiting for the PG timeout (accelpact/backends/interruptible.py).
    wait = CollectiveWaiter(
        fired=watchdog.fired_reason if watchdog is not None else None,
        superseded=getattr(control, "generation_superseded", None),
        abandon=lambda work: plane.abandon(list(plane.groups), work),
    )
    vote = CommitVote(plane, wait, rank)
    recovery = RecoveryContext(
        rank=rank,
        world_size=world_size,
        control=control,
        plane=plane,
        state=state,
        reset_fsdp=lambda: reset_after_fault(model, optimizer, config.reset),
        hook=hook,
        liveness=config.liveness,
        events=events,
    )
    healer = None
    if heal is not None:
        from accelpact.recovery.heal import Healer

        healer = Healer(recovery, heal, snapshots)
    plane.prepare_next_generation()
    return GuardParts(plane, heartbeat, watchdog, wait, vote, recovery, healer)
