"""The commit rule: one decision, identical on every rank, from all ranks' fault reports.

Pure logic (no torch, no I/O): every rank gathers the same set of :class:`RankReport` over the
control channel and calls :func:`decide` on it, so every rank reaches the same :class:`Decision`.

The protocol around it (also described in docs/design.md): after backward and gradient
clipping every rank enters a tiny all-reduce, the *vote*, and only after the vote completes locally
does it call ``optimizer.step()``. The rule:

- the vote of step s completed on SOME rank  -> every rank applies step s (ROLL_FORWARD);
- the vote of step s completed on NO rank    -> nobody stepped: reset and re-run step s (RETRY);
- anything else                               -> StateDivergedError / RankLostError, never continue.

Normalisation. A report (attempt A, committed C, phase P) is first rewritten as
``(committed, vote status on step committed+1)`` with vote status NONE / ENTERED / COMPLETED:

    BEFORE_VOTE on A, C = A-1  ->  (A-1, NONE)
    IN_VOTE     on A, C = A-1  ->  (A-1, ENTERED)
    VOTED       on A, C = A-1  ->  (A-1, COMPLETED)
    STEPPED     on A, C = A    ->  (A,   NONE on A+1)   # identical to "BEFORE_VOTE on A+1"

so "attempting N+1, committed N, failed before the vote" and "stepped N, fault came after" are the
same state. Any other (A, C, P) combination is internally inconsistent and raises.

Proof sketch of safety. Two facts about the protocol:
 (F1) a rank enters the vote of step s only after it has committed s-1 (steps are sequential), and
      it calls optimizer.step(s) only after its vote of s completed;
 (F2) the vote is an all-reduce: it can complete on a rank only if EVERY rank entered it, and a
      rank that entered it holds complete, reduced, clipped gradients for s (it finished backward).
Let c = min committed over all ranks and s = c + 1.
 * If some rank committed c+2 or more, its vote of c+2 completed, so by F2 every rank entered that
   vote and by F1 every rank committed c+1 > c: contradiction. Hence max committed <= s, else raise.
 * If some rank committed s, its vote of s completed; by F2 every rank entered the vote of s, so
   each rank still at c must report ENTERED or COMPLETED (NONE is impossible: raise). Those ranks
   hold the gradients of s, so applying step s on exactly them brings everyone to committed s.
   No rank can have COMPLETED the vote of s+1, because a rank still at c never entered it (raise).
 * If every rank is at c and some rank COMPLETED the vote of s, the same argument makes every rank
   ENTERED or COMPLETED; all of them apply s from the gradients they hold.
 * If every rank is at c and no rank completed the vote of s, no rank called optimizer.step(s)
   (F1), so discarding gradients and re-running s loses nothing.
In each accepted case every rank ends at the same committed step, ``apply_on`` holds only ranks at
``step - 1`` that hold the gradients of ``step``, and no rank is asked to undo a step (no rank ever
"un-steps"). The decision depends only on the set of reports, not their order, and every rank runs
the same function on the same set, so all ranks agree.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from accelpact.common.rank_report import Phase, RankReport
from accelpact.errors import RankLostError, StateDivergedError

__all__ = ["Phase", "RankReport", "Action", "Decision", "decide"]


class Action(enum.Enum):
    RETRY = "retry"  # nobody committed the step: reset and re-run it
    ROLL_FORWARD = "roll_forward"  # some ranks apply the step from gradients they hold, then all continue


@dataclass(frozen=True)
class Decision:
    """What every rank does next. Identical on every rank."""

    action: Action
    step: int  # the step the decision is about
    apply_on: tuple[int, ...]  # ranks that must call optimizer.step() for `step` now (empty for RETRY)
    resume_step: int  # the step every rank runs next
    committed_step: int  # every rank's committed step after applying the decision


class _Vote(enum.IntEnum):
    """A rank's progress through the vote of the step after its committed one."""

    NONE = 0
    ENTERED = 1
    COMPLETED = 2


_VOTE_OF_PHASE = {Phase.BEFORE_VOTE: _Vote.NONE, Phase.IN_VOTE: _Vote.ENTERED, Phase.VOTED: _Vote.COMPLETED}


def _describe(r: RankReport) -> str:
    return f"rank {r.rank} (attempt {r.attempt_step}, committed {r.committed_step}, {r.phase.value})"


def _describe_all(reports: Sequence[RankReport]) -> str:
    return "; ".join(_describe(r) for r in sorted(reports, key=lambda r: r.rank))


def _diverged(why: str, involved: Sequence[RankReport], all_reports: Sequence[RankReport]) -> StateDivergedError:
    low = min((r.committed_step for r in all_reports), default=None)
    ranks = tuple(sorted({r.rank for r in involved}))
    return StateDivergedError(
        f"commit rule cannot reconcile the ranks' states: {why}. Involved: {_describe_all(involved)}. "
        f"All reports: {_describe_all(all_reports)}. Do not continue in memory: restore from a checkpoint "
        f"at or before step {low}.",
        ranks=ranks,
        last_committed_step=low,
    )


def _normalise(r: RankReport, reports: Sequence[RankReport]) -> tuple[int, _Vote]:
    """(committed step, vote status on committed+1), or raise if the report contradicts itself."""
    if r.committed_step < -1 or r.attempt_step < 0:
        raise _diverged(f"rank {r.rank} reports negative steps", [r], reports)
    if r.phase is Phase.STEPPED:
        if r.committed_step != r.attempt_step:
            raise _diverged(
                f"rank {r.rank} says it stepped {r.attempt_step} but its committed step is {r.committed_step}",
                [r],
                reports,
            )
        return r.committed_step, _Vote.NONE
    if r.committed_step != r.attempt_step - 1:
        raise _diverged(
            f"rank {r.rank} is attempting step {r.attempt_step} ({r.phase.value}) but its committed step is "
            f"{r.committed_step}, not {r.attempt_step - 1}",
            [r],
            reports,
        )
    return r.committed_step, _VOTE_OF_PHASE[r.phase]


def decide(reports: Sequence[RankReport], world_size: int) -> Decision:
    """Return the one decision every rank applies, from every rank's report.

    Raises :class:`RankLostError` when a rank's report is missing and :class:`StateDivergedError`
    when the reports cannot come from the commit protocol (see the module docstring). Deterministic
    and independent of the order of ``reports``.
    """
    reports = sorted(reports, key=lambda r: (r.rank, r.attempt_step, r.committed_step, r.phase.value))
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")

    # Structural problems first: they are bugs upstream, whatever else is wrong.
    out_of_range = [r for r in reports if not 0 <= r.rank < world_size]
    if out_of_range:
        raise _diverged(
            f"rank(s) {sorted({r.rank for r in out_of_range})} outside 0..{world_size - 1}", out_of_range, reports
        )
    seen: dict[int, int] = {}
    for r in reports:
        seen[r.rank] = seen.get(r.rank, 0) + 1
    dup = sorted(k for k, n in seen.items() if n > 1)
    if dup:
        raise _diverged(f"duplicate report(s) for rank(s) {dup}", [r for r in reports if r.rank in dup], reports)
    missing = sorted(set(range(world_size)) - set(seen))
    if missing:
        low = min((r.committed_step for r in reports), default=None)
        raise RankLostError(
            f"no consensus report from rank(s) {missing} of {world_size}: the rank died or missed the deadline. "
            f"Lowest committed step among the {len(reports)} reporting rank(s): {low}"
            f"{'' if low is None else f'; restore from a checkpoint at or before step {low}'}.",
            ranks=tuple(missing),
            last_committed_step=low,
        )

    state = {r.rank: _normalise(r, reports) for r in reports}
    by_rank = {r.rank: r for r in reports}
    low = min(c for c, _ in state.values())
    high = max(c for c, _ in state.values())
    step = low + 1

    if high > step:
        ahead = [by_rank[k] for k, (c, _) in state.items() if c > step]
        behind = [by_rank[k] for k, (c, _) in state.items() if c == low]
        raise _diverged(
            f"committed steps differ by {high - low} (> 1): rank(s) {sorted(r.rank for r in ahead)} committed "
            f"{high} while rank(s) {sorted(r.rank for r in behind)} committed {low}",
            ahead + behind,
            reports,
        )

    laggards = sorted(k for k, (c, _) in state.items() if c == low)
    completed_somewhere = high == step or any(v is _Vote.COMPLETED for c, v in state.values() if c == low)

    if not completed_somewhere:
        # Nobody finished the vote of `step`, so nobody stepped it: everyone re-runs it.
        return Decision(Action.RETRY, step=step, apply_on=(), resume_step=step, committed_step=low)

    # The vote of `step` completed somewhere, so every rank must have entered it.
    never_entered = [by_rank[k] for k in laggards if state[k][1] is _Vote.NONE]
    if never_entered:
        witnesses = [by_rank[k] for k, (c, v) in state.items() if c == step or v is _Vote.COMPLETED]
        raise _diverged(
            f"the vote of step {step} completed on rank(s) {sorted(r.rank for r in witnesses)} but rank(s) "
            f"{sorted(r.rank for r in never_entered)} never entered it",
            witnesses + never_entered,
            reports,
        )
    # A leader (committed `step`) cannot have completed the vote of step+1: the laggards never entered
    # it. A leader merely IN the vote of step+1 is fine: it has not stepped step+1, and re-runs it.
    leaders_voted_next = [by_rank[k] for k, (c, v) in state.items() if c == step and v is _Vote.COMPLETED]
    if leaders_voted_next:
        raise _diverged(
            f"rank(s) {sorted(r.rank for r in leaders_voted_next)} completed the vote of step {step + 1} while "
            f"rank(s) {laggards} had not yet committed step {step}",
            leaders_voted_next + [by_rank[k] for k in laggards],
            reports,
        )
    return Decision(Action.ROLL_FORWARD, step=step, apply_on=tuple(laggards), resume_step=step + 1, committed_step=step)
