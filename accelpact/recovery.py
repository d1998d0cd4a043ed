"""Recovery rounds of the guard (steps 1-7 of accelpact.guard's docstring), kept apart from the step.

``recover`` runs rounds until one succeeds: reset FSDP, agree over the control channel, build the next
data-plane generation under the old names (``rebuild``), rebind, prove it with a first collective
(``prove``). A lost rank raises RankLostError out of the round; the guard then heals (accelpact.heal)
when a heal policy is attached, with the same ``rebuild`` and ``prove``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from accelpact import comm, detection, heap
from accelpact._tracebacks import drop_traceback as _drop_traceback
from accelpact._tracebacks import where as _where
from accelpact.bindings import find_stale_references
from accelpact.consensus import Action, Decision, Phase, RankReport, decide
from accelpact.errors import AccelPactError, GenerationSuperseded, RankLostError
from accelpact.events import RecoveryEvent, RoundClock
from accelpact.linkprobe import wait_reachable
from accelpact.reset import reset_after_fault

if TYPE_CHECKING:
    from accelpact.guard import Guard

_log = logging.getLogger("accelpact.guard")

__all__ = ["recover", "rebuild", "prove", "MAX_ROUNDS"]

# Recovery rounds allowed for one fault before giving up (each round is a nested fault).
MAX_ROUNDS = 16


def recover(g: "Guard", exc: BaseException, step: int, t_start: float, watchdog: str | None = None) -> Decision:
    """Recover from the comm fault ``exc`` of ``step`` in rounds (each a nested fault); the decision."""
    t_detected = time.time()
    g.backend.forget_expired()  # abandoned generations whose collectives have timed out
    since = t_start if g._unchecked_since is None else min(t_start, g._unchecked_since)
    injected = g.injection_clock(since) if g.injection_clock is not None else None
    fault = {"type": type(exc).__name__, "message": str(exc)[:500]}
    if watchdog is not None:
        fault["watchdog"] = watchdog
    _drop_traceback(exc)  # its frames hold the old group alive
    _log.info("rank %d: %s at step %d (phase %s, generation %d): recovering", g.rank, fault["type"],
              step, g._phase.value, getattr(g.control, "generation", -1))
    # 1. Make peers blocked on us fail now instead of at their PG timeout.
    g.backend.abort()
    report = RankReport(g.rank, step, g.committed_step, g._phase, fault=fault["type"],
                        injected_at=injected, region=g._region_state().to_dict())
    rounds = 0
    clock = RoundClock(t_detected)
    while True:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RankLostError(
                f"rank {g.rank}: {MAX_ROUNDS} recovery rounds in a row failed for step {step}; "
                "the data plane does not come back (restore from a checkpoint)",
                ranks=(g.rank,), last_committed_step=g.committed_step,
            )
        try:
            decision = _round(g, report, step, fault, t_detected, t_start, rounds, clock)
            g._unchecked_since = time.time()
            return decision
        except BaseException as nested:  # noqa: BLE001
            clock.close()  # the failed round's time, up to the failure
            if not g.backend.is_comm_fault(nested):
                raise
            _log.info("rank %d: recovery round %d failed (%s: %s, at %s); next round", g.rank, rounds,
                      type(nested).__name__, str(nested)[:200], _where(nested))
            _drop_traceback(nested)
            del nested
            g.backend.abort()  # the half-built generation: peers must fail fast too


def _round(g: "Guard", report: RankReport, step: int, fault: dict[str, str], t_detected: float,
           t_start: float, rounds: int, clock: RoundClock) -> Decision:
    clock.start()
    # 2. Clean FSDP state (idempotent across rounds). After the vote started, backward is
    # complete and FSDP is idle: keep the reduced, clipped grads for a possible roll forward.
    if report.phase is Phase.BEFORE_VOTE:
        reset_after_fault(g.model, g.optimizer, g.config.reset)
    # 3. Agree.
    generation = g.control.advance_generation()
    _log.info("rank %d: round %d, generation %d: reporting", g.rank, rounds, generation)
    watch = detection.peer_watch(g.control, g.rank, g.config.liveness, fault, generation)
    try:
        if watch is None:
            raw = g.control.gather("report", report.to_bytes(), generation)
        else:
            raw = g.control.gather("report", report.to_bytes(), generation, watch=watch)
    except RankLostError as lost:
        how = getattr(lost, "detected_by", None) or "deadline"
        seen = (f"rank(s) {list(lost.ranks)} did not report within the control deadline" if how == "deadline"
                else str(lost))
        raise RankLostError(
            f"{seen}; after a fault at step {step}, recovery generation "
            f"{generation}; this rank's last committed step is {g.committed_step}. In-memory recovery "
            "is impossible: restore from a checkpoint.",
            ranks=lost.ranks, last_committed_step=g.committed_step, generation=generation,
            detected_by=how,
        ) from lost
    reports = [RankReport.from_bytes(raw[r]) for r in sorted(raw)]
    decision = decide(reports, g.world_size)
    g._last_reports = reports  # a rank inside a guarded region decides its region from them (Guard.run)
    detected_from, detection_from = detection.detection_origin(reports, t_start)
    _log.info("rank %d: generation %d agreed: %s; rebuilding %d group(s)", g.rank, generation, decision,
              len(g.table.groups))
    clock.mark()
    # 4. Build the next generation under the old names (first, the holders FSDP created lazily
    # if the fault hit before the first commit: they are in place by now, the old groups are
    # still registered, and this is the last moment to find them).
    if not g._table_after_first_step and rounds == 1:
        g._rescan()
    old_groups, new_groups = rebuild(g, generation, clock)
    # 6. Prove the new generation works (a fault here starts a new round).
    g._hook("recovery", step)
    prove(g, new_groups)
    clock.mark()  # before t4: the parts never add up to more than the total
    t4 = time.time()
    _log.info("rank %d: generation %d works (first collective done)", g.rank, generation)
    # Retire the old generation: its destructor joins its threads and closes its sockets.
    del old_groups
    # Give the heap's free pages back (accelpact/heap.py: RSS grew 0.1-0.6 MiB per recovery without).
    heap.release_free_heap()
    t5 = time.time()
    clock.close()
    g._prepare_next_generation()
    g.events.append(RecoveryEvent(
        step=step, generation=generation, phase=report.phase.value, fault=fault,
        ranks=sorted(r.rank for r in reports),
        decision={"action": decision.action.value, "step": decision.step,
                  "apply_on": list(decision.apply_on), "resume_step": decision.resume_step},
        t_detected=t_detected, detection_s=t_detected - detected_from, agreement_s=clock.total("agreement"),
        rebuild_s=clock.total("rebuild"), rebind_s=clock.total("rebind"),
        first_collective_s=clock.total("first_collective"), total_s=t4 - t_detected, rounds=rounds,
        retire_s=t5 - t4, reports=[r.to_dict() for r in reports],
        detected_by="watchdog" if "watchdog" in fault else "exception", round_times=clock.rounds,
        detection_from=detection_from,
    ))
    if decision.action is Action.RETRY and report.phase is not Phase.BEFORE_VOTE:
        # Our gradients were complete but nobody committed: discard them before the retry.
        reset_after_fault(g.model, g.optimizer, g.config.reset)
    return decision


def rebuild(g: "Guard", generation: int, clock: RoundClock | None = None) -> tuple[list[Any], list[Any]]:
    """Steps 4-5: build ``generation`` of every data-plane group under the old names, rebind in place.

    Returns (old groups, new groups); the caller drops the old ones once the new ones work. Also the
    heal's rebuild (accelpact.heal), with the replacement's groups joining the same rendezvous."""
    # A link still down or blackholed: wait for it (within the deadline) instead of building on it.
    wait_reachable(g._data_peers, getattr(getattr(g.control, "config", None), "deadline_s", 30.0))
    store = g.control.data_plane_store(generation)
    old_groups = list(g.table.groups)
    new_groups = g.backend.rebuild_groups(old_groups, g._specs, store, g.rank)
    if clock is not None:
        clock.mark()
    # 5. Rebind in place (function defaults of modules imported since attach included).
    g.table.refresh_defaults()
    g.table.rebind(dict(zip(old_groups, new_groups)))
    if clock is not None:
        clock.mark()
    if g.config.verify_rebind:
        stale = [(comm.describe(pg), find_stale_references(pg, ignore=(old_groups,))) for pg in old_groups]
        stale = [(pg, refs) for pg, refs in stale if refs]
        if stale:
            raise AccelPactError(f"rebind incomplete, still referring to the old group: {stale}")
    return old_groups, new_groups


def prove(g: "Guard", new_groups: list[Any]) -> None:
    """Step 6: the first collective on the new vote group; a peer's newer round abandons it."""
    try:
        g.backend.first_collective(new_groups[g._vote_index],
                                   superseded=getattr(g.control, "generation_superseded", None))
    except GenerationSuperseded as abandoned:
        # The abandoned collective may still run in the backend until the PG timeout; the
        # backend decides how to let go of it without blocking the next round.
        g.backend.abandon(new_groups, abandoned.work, g._pg_timeout)
        raise
