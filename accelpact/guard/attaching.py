"""attach(): accelpact's entry point, from an FSDP model and its optimizer to a :class:`Guard`.

Its keyword arguments are the guard's settings as a user writes them; attach resolves them (the
heartbeat, the stall timeout) into a :class:`accelpact.guard.config.GuardConfig` and builds the guard.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.dataplane.reset import ResetConfig
from accelpact.detection.liveness import LivenessConfig
from accelpact.detection.watchdog import resolve_stall_timeout
from accelpact.guard.config import GuardConfig, InjectionClock
from accelpact.guard.core import Guard

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient
    from accelpact.recovery.heal import HealPolicy
    from accelpact.recovery.rejoin import RejoinTicket
    from accelpact.snapshot.snapshotter import Snapshotter

__all__ = ["attach"]


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    control: ControlClient,
    *,
    max_grad_norm: float | None = None,
    process_group: dist.ProcessGroup | None = None,
    pg_timeout: datetime.timedelta | None = None,
    verify_rebind: bool = False,
    reset: ResetConfig = ResetConfig(),
    injection_clock: InjectionClock | None = None,
    heartbeat_interval_s: float | None = 0.5,
    heartbeat_misses: int = 4,
    stall_timeout_s: float | None | str = "auto",
    snapshots: Snapshotter | None = None,
    heal: HealPolicy | None = None,
    rejoin: RejoinTicket | None = None,
    data_plane: str = "auto",
) -> Guard:
    """Attach accelpact to an existing FSDP model and optimizer; nothing about them changes.

    Call after ``init_process_group``, ``fully_shard`` / ``FullyShardedDataParallel`` and optimizer
    construction. ``control`` is a connected :class:`accelpact.control.ControlChannel`; attach waits
    (within its connect_timeout_s) until every rank has joined under the same job token.
    ``max_grad_norm``: clip the total gradient norm to this inside the step (None, the default: no
    clipping, exactly what the script did before attach).
    ``injection_clock`` (tests and benchmarks): called as ``injection_clock(t_start)`` when a fault is
    detected, it returns the wall time of a fault injected at or after ``t_start`` (and forgets it) or
    None, so that ``RecoveryEvent.detection_s`` counts from the injection; e.g.
    ``injection_clock=injector.consume_injection_time``. Also settable later as ``guard.injection_clock``.
    ``heartbeat_interval_s`` / ``heartbeat_misses``: this rank beats on the control store every interval
    (a daemon thread, its own store client), and a peer whose connection dropped and that missed that
    many beats is declared dead at once instead of at the control deadline (None: no heartbeat).
    ``stall_timeout_s``: the stall watchdog (accelpact/detection/watchdog.py): a collective stuck this long, and
    longer than 3x the median step, while a peer stopped beating or the link retransmits, is aborted
    and recovered instead of waiting for the PG timeout. "auto": 10 s when the PG timeout is longer,
    else off; None: off; an explicit value must be below the PG timeout.
    ``snapshots``: an ``accelpact.snapshot.Snapshotter`` of this model and optimizer: the guard waits for
    its copy before each vote and starts the next copy after each commit. ``heal``: an
    :class:`accelpact.recovery.heal.HealPolicy`: a rank found dead is healed in memory (survivors wait for its
    replacement) instead of raising RankLostError; ``step`` may then raise :class:`accelpact.RolledBack`.
    ``rejoin``: on a replacement process, the ticket of :func:`accelpact.recovery.rejoin.rejoin`; attach then
    loads the resume step and joins the survivors (``guard.next_step`` is where to continue, and
    ``guard.resumed`` the RolledBack a survivor would catch: its ``extra_state`` is what the loaded
    snapshot's ``extra_state`` callable saved, e.g. the LR scheduler's state).
    FSDP2 only with ``snapshots`` or ``heal``.
    ``data_plane``: "auto" (default): on torch >= 2.15, when every data-plane group supports it, a
    recovery reconfigures the SAME groups in place (no rebuild, no rebind); otherwise, or when a
    reconfigure fails, it rebuilds them and rebinds. "reconfigure": the same, but attach raises when it
    cannot. "rebind": always rebuild and rebind. Recovery and heal events say which path ran and why
    (``event.data_plane``); accelpact.dataplane.DATA_PLANES lists the implementations.
    """
    liveness = None if heartbeat_interval_s is None else LivenessConfig(heartbeat_interval_s, heartbeat_misses)
    stall_timeout_s = resolve_stall_timeout(stall_timeout_s, (pg_timeout or dist.default_pg_timeout).total_seconds())
    config = GuardConfig(
        max_grad_norm=max_grad_norm,
        pg_timeout=pg_timeout,
        verify_rebind=verify_rebind,
        reset=reset,
        liveness=liveness,
        stall_timeout_s=stall_timeout_s,
        data_plane=data_plane,
    )
    return Guard(
        model,
        optimizer,
        control,
        process_group=process_group,
        config=config,
        injection_clock=injection_clock,
        snapshots=snapshots,
        heal=heal,
        rejoin=rejoin,
    )
