"""A replacement's side of a heal: report the steps it holds, load the agreed one from its own slot or its
buddy's replica, and prove the new generation with the survivors.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelpact.errors import RankLostError
from accelpact.events import HealEvent
from accelpact.recovery.heal_plan import HealReport, ResumePlan
from accelpact.recovery.heal_policy import HealOutcome, HealPolicy

if TYPE_CHECKING:
    from accelpact.recovery.context import RecoveryContext
    from accelpact.recovery.rejoin import RejoinTicket

_log = logging.getLogger("accelpact.recovery.heal")

__all__ = ["join_as_replacement"]


def join_as_replacement(
    g: RecoveryContext,
    policy: HealPolicy,
    snapshots: Any,
    ticket: RejoinTicket,
    *,
    agree: Callable[[HealReport, int], ResumePlan],
    survive: Callable[[RankLostError, int, float], HealOutcome],
) -> HealOutcome:
    """The replacement's heal: report what it holds, take the agreed step from its own slot or its buddy,
    and prove the new generation. ``agree`` and ``survive`` are the rank's :class:`accelpact.recovery.heal.Healer`'s.
    """
    t0 = time.time()
    held: dict[int, str] = {}
    if policy.initial_state_reproducible:
        held[-1] = "live"
    if snapshots is not None:
        held.update({s: "own" for s in snapshots.held_steps()})
    replicas: dict[int, Path] = {}
    buddy = policy.buddy_of(g.rank) if policy.buddy_of is not None else None
    if not [s for s, src in held.items() if src == "own"] and policy.fetch_replica is not None:
        newest = _fetch(g.rank, policy, None)
        if newest is not None:
            replicas[newest[0]] = newest[1]
            held[newest[0]] = "buddy"
            # The buddy keeps two replicas, of the newest two pushed steps: fetched only if chosen.
            # Pushed steps are every * push_every apart (accelpact.snapshot.push_rule).
            gap = snapshots.push_gap(newest[0]) if hasattr(snapshots, "push_gap") else 1
            held.setdefault(newest[0] - max(int(gap), 1), "buddy")
    plan = agree(HealReport(g.rank, "replacement", -1, held, buddy=buddy), ticket.generation)
    t_load = time.time()
    extra: dict[str, Any] = {}
    source = plan.sources[g.rank]
    if source == "own":
        extra = snapshots.restore(plan.step) or {}
    elif source == "buddy":
        path = replicas.get(plan.step)
        if path is None:
            got = _fetch(g.rank, policy, plan.step)
            if got is None:
                raise RankLostError(
                    f"rank {g.rank}: its buddy (rank {buddy}) no longer holds the replica of step {plan.step} "
                    "and no own snapshot slot survives: restore from a checkpoint",
                    ranks=(g.rank,) + ((buddy,) if buddy is not None else ()),
                    detected_by="heal",
                )
            path = got[1]
        extra = snapshots.restore(plan.step, source=path) or {}
    load_s = time.time() - t_load
    g.state.resume_at(plan.resume_step)
    resume_step, generation, rounds = plan.resume_step, ticket.generation, 1
    try:
        g.plane.prove(list(g.plane.groups))
    except BaseException as failed:  # noqa: BLE001 - only a communication fault is retried, below
        if not g.plane.is_comm_fault(failed):
            raise
        again = _retry_after_link_fault(g, plan, failed, survive)
        del failed
        resume_step, generation, rounds = again.resume_step, again.event.generation, 1 + again.event.rounds
        extra = again.extra_state or extra  # a retry at the same step restores nothing: keep this restore's
    t_end = time.time()
    t_launch = ticket.t_launch or ticket.t_start
    event = HealEvent(
        role="replacement",
        lost_ranks=[g.rank],
        step=-1,
        resume_step=resume_step,
        replayed_steps=0,
        source=source,
        own_source=source,
        generation=generation,
        replacement_start_s=ticket.t_arrived - t_launch,
        heal_transfer_s=t_end - ticket.t_arrived,
        total_s=t_end - t_launch,
        t=t_end,
        t_detected=t_launch,
        load_s=load_s,
        rounds=rounds,
        data_plane=dict(ticket.data_plane),
    )
    _log.info(
        "rank %d: replacement healed from %s (step %d) in %.3f s after arrival; build %.3f s",
        g.rank,
        source,
        plan.step,
        t_end - ticket.t_arrived,
        t0 - ticket.t_joined,
    )
    return HealOutcome(resume_step, extra, event)


def _retry_after_link_fault(
    g: RecoveryContext,
    plan: ResumePlan,
    failed: BaseException,
    survive: Callable[[RankLostError, int, float], HealOutcome],
) -> HealOutcome:
    """The heal's first collective failed on a communication fault: join the survivors' next heal round as
    one of them, holding the plan's step, live (docs/process_loss.md, "A link fault inside a heal").

    A survivor whose collective got through is not in a heal round: the roll call then finds no answer
    within the control deadline, and this raises RankLostError."""
    _log.info(
        "rank %d: the replacement's first collective failed (%s); retrying the heal with the survivors",
        g.rank,
        str(failed)[:200],
    )
    g.plane.abort()
    lost = RankLostError(f"rank {g.rank}: link fault in the heal's first collective", ranks=(), detected_by="heal")
    return survive(lost, plan.resume_step, time.time())


def _fetch(rank: int, policy: HealPolicy, step: int | None) -> tuple[int, Path] | None:
    """The buddy's replica of ``step`` (None: its newest) fetched into a fresh directory, or None."""
    dest = Path(tempfile.mkdtemp(prefix=f"accelpact-replica-r{rank}-"))
    try:
        marker = policy.fetch_replica(rank, dest, step)  # type: ignore[misc]  # None: the TypeError is a failed fetch, below
    except Exception as exc:  # noqa: BLE001 - a buddy lost too, or unreachable: no replica, say why below
        _log.warning("rank %d: fetching its replica (step %s) from its buddy failed: %s", rank, step, exc)
        return None
    return None if marker is None else (int(marker["step"]), dest)
