"""Recovery rounds of the guard (accelpact.guard.core), kept apart from the step.

On a communication fault the guard:
1. aborts its own transport of the broken generation (gloo: resets its sockets), so peers blocked
   on it fail in ms;
2. resets FSDP to a clean between-steps state (accelpact.dataplane.reset; both traps handled);
3. exchanges a RankReport over the out-of-band control channel (own deadline) and decides;
4. builds the next data-plane generation on a never-used store prefix, under the old names;
5. rebinds every cached reference in place (accelpact.dataplane.bindings);
6. runs the first collective on the new generation;
7. applies the decision. A fault during 4-6 starts a new round on the next generation.
A lost rank or irreconcilable reports raise (RankLostError / StateDivergedError) naming the ranks and
the last committed step; nothing hangs past the control channel's deadline.

``recover`` runs rounds until one succeeds: reset FSDP, agree over the control channel, make the next
data-plane generation live (``DataPlane.rebuild``: today, new groups under the old names and a rebind),
prove it with a first collective (``DataPlane.prove``). A lost rank raises RankLostError out of the
round; the guard then heals (accelpact.recovery.heal) when a heal policy is attached, with the same data plane.

It never sees the guard: it gets a :class:`accelpact.recovery.context.RecoveryContext` (the data
plane, the step state, the control channel), so a test can drive it with stand-ins.
"""

from __future__ import annotations

import logging
import time

from accelpact.dataplane import heap
from accelpact.dataplane.tracebacks import drop_traceback as _drop_traceback
from accelpact.dataplane.tracebacks import where as _where
from accelpact.detection import start as detection
from accelpact.errors import RankLostError
from accelpact.events import RecoveryEvent, RoundClock
from accelpact.recovery.consensus import Action, Decision, Phase, RankReport, decide
from accelpact.recovery.context import InjectionClock, RecoveryContext
from accelpact.recovery.region_rule import RegionState

_log = logging.getLogger("accelpact.guard")

__all__ = ["recover", "MAX_ROUNDS"]

# Recovery rounds allowed for one fault before giving up (each round is a nested fault).
MAX_ROUNDS = 16


def recover(
    ctx: RecoveryContext,
    exc: BaseException,
    step: int,
    t_start: float,
    watchdog: str | None = None,
    injection_clock: InjectionClock | None = None,
) -> Decision:
    """Recover from the comm fault ``exc`` of ``step`` in rounds (each a nested fault); the decision."""
    t_detected = time.time()
    plane, state = ctx.plane, ctx.state
    plane.forget_expired()  # abandoned generations whose collectives have timed out
    since = t_start if state.unchecked_since is None else min(t_start, state.unchecked_since)
    injected = injection_clock(since) if injection_clock is not None else None
    fault = {"type": type(exc).__name__, "message": str(exc)[:500]}
    if watchdog is not None:
        fault["watchdog"] = watchdog
    _drop_traceback(exc)  # its frames hold the old group alive
    _log.info(
        "rank %d: %s at step %d (phase %s, generation %d): recovering",
        ctx.rank,
        fault["type"],
        step,
        state.phase.value,
        getattr(ctx.control, "generation", -1),
    )
    # 1. Make peers blocked on us fail now instead of at their PG timeout.
    plane.abort()
    report = RankReport(
        ctx.rank,
        step,
        state.committed_step,
        state.phase,
        fault=fault["type"],
        injected_at=injected,
        region=state.region().to_dict(),
    )
    rounds = 0
    clock = RoundClock(t_detected)
    while True:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RankLostError(
                f"rank {ctx.rank}: {MAX_ROUNDS} recovery rounds in a row failed for step {step}; "
                "the data plane does not come back (restore from a checkpoint)",
                ranks=(ctx.rank,),
                last_committed_step=state.committed_step,
            )
        try:
            decision = _round(ctx, report, step, fault, t_detected, t_start, rounds, clock)
            state.unchecked_since = time.time()
            return decision
        except BaseException as nested:  # noqa: BLE001
            clock.close()  # the failed round's time, up to the failure
            if not plane.is_comm_fault(nested):
                raise
            _log.info(
                "rank %d: recovery round %d failed (%s: %s, at %s); next round",
                ctx.rank,
                rounds,
                type(nested).__name__,
                str(nested)[:200],
                _where(nested),
            )
            _drop_traceback(nested)
            del nested
            plane.abort()  # the half-built generation: peers must fail fast too


def _round(
    ctx: RecoveryContext,
    report: RankReport,
    step: int,
    fault: dict[str, str],
    t_detected: float,
    t_start: float,
    rounds: int,
    clock: RoundClock,
) -> Decision:
    clock.start()
    plane, control = ctx.plane, ctx.control
    # 2. Clean FSDP state (idempotent across rounds). After the vote started, backward is
    # complete and FSDP is idle: keep the reduced, clipped grads for a possible roll forward.
    if report.phase is Phase.BEFORE_VOTE:
        ctx.reset_fsdp()
    # 3. Agree.
    generation = control.advance_generation()
    _log.info("rank %d: round %d, generation %d: reporting", ctx.rank, rounds, generation)
    watch = detection.peer_watch(control, ctx.rank, ctx.liveness, fault, generation)
    try:
        if watch is None:
            raw = control.gather("report", report.to_bytes(), generation)
        else:
            raw = control.gather("report", report.to_bytes(), generation, watch=watch)
    except RankLostError as lost:
        how = getattr(lost, "detected_by", None) or "deadline"
        seen = (
            f"rank(s) {list(lost.ranks)} did not report within the control deadline" if how == "deadline" else str(lost)
        )
        raise RankLostError(
            f"{seen}; after a fault at step {step}, recovery generation "
            f"{generation}; this rank's last committed step is {ctx.state.committed_step}. In-memory recovery "
            "is impossible: restore from a checkpoint.",
            ranks=lost.ranks,
            last_committed_step=ctx.state.committed_step,
            generation=generation,
            detected_by=how,
        ) from lost
    reports = [RankReport.from_bytes(raw[r]) for r in sorted(raw)]
    decision = decide(reports, ctx.world_size)
    if ctx.state.region_phase is not None:  # inside Guard.run: the region rule reads every rank's place
        ctx.state.peer_regions = {
            r.rank: RegionState.from_dict(r.region) if r.region is not None else RegionState(r.committed_step, 0, None)
            for r in reports
        }
    detected_from, detection_from = detection.detection_origin(reports, t_start)
    _log.info(
        "rank %d: generation %d agreed: %s; rebuilding %d group(s)", ctx.rank, generation, decision, len(plane.groups)
    )
    clock.mark()
    # 4.-5. The next generation, bound where FSDP looks (first, the holders FSDP created lazily
    # if the fault hit before the first commit: they are in place by now, the old groups are
    # still registered, and this is the last moment to find them).
    if not plane.rescanned and rounds == 1:
        plane.rescan()
    old_groups, new_groups = plane.rebuild(generation, clock)
    # 6. Prove the new generation works (a fault here starts a new round).
    ctx.hook("recovery", step)
    plane.prove(new_groups)
    clock.mark()  # before t4: the parts never add up to more than the total
    t4 = time.time()
    _log.info("rank %d: generation %d works (first collective done)", ctx.rank, generation)
    # Retire the old generation: its destructor joins its threads and closes its sockets.
    del old_groups
    # Give the heap's free pages back (accelpact/dataplane/heap.py: RSS grew 0.1-0.6 MiB per recovery without).
    heap.release_free_heap()
    t5 = time.time()
    clock.close()
    plane.prepare_next_generation()
    ctx.events.append(
        RecoveryEvent(
            step=step,
            generation=generation,
            phase=report.phase.value,
            fault=fault,
            ranks=sorted(r.rank for r in reports),
            decision={
                "action": decision.action.value,
                "step": decision.step,
                "apply_on": list(decision.apply_on),
                "resume_step": decision.resume_step,
            },
            t_detected=t_detected,
            detection_s=t_detected - detected_from,
            agreement_s=clock.total("agreement"),
            rebuild_s=clock.total("rebuild"),
            rebind_s=clock.total("rebind"),
            first_collective_s=clock.total("first_collective"),
            total_s=t4 - t_detected,
            rounds=rounds,
            retire_s=t5 - t4,
            reports=[r.to_dict() for r in reports],
            detected_by="watchdog" if "watchdog" in fault else "exception",
            round_times=clock.rounds,
            detection_from=detection_from,
            data_plane=dict(plane.last_path),
        )
    )
    if decision.action is Action.RETRY and report.phase is not Phase.BEFORE_VOTE:
        # Our gradients were complete but nobody committed: discard them before the retry.
        ctx.reset_fsdp()
    return decision
