"""What a recovery round's decision means for the rank that caught the fault; pure logic.

In a step (:func:`rolls_forward`): apply the step (the vote completed on some rank, so this rank's
reduced gradients are complete) or retry it on the same batch. In a guarded region
(:func:`region_action`): run the region again or return its result (accelpact.recovery.region_rule).
A decision that contradicts this rank's own state is a bug in the commit rule: StateDivergedError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelpact.errors import StateDivergedError
from accelpact.recovery.consensus import Phase
from accelpact.recovery.region_rule import RegionAction, RegionState, decide_region

if TYPE_CHECKING:
    from accelpact.recovery.consensus import Decision

__all__: list[str] = []  # private to accelpact.guard


def rolls_forward(decision: Decision, rank: int, step: int, phase: Phase, holds_loss: bool, committed: int) -> bool:
    """True: apply ``step`` now; False: retry it. ``holds_loss``: step_fn returned on this rank;
    ``committed``: this rank's last committed step (named in the error)."""
    if step == decision.step and rank in decision.apply_on:
        if not holds_loss or phase not in (Phase.IN_VOTE, Phase.VOTED):
            raise StateDivergedError(
                f"rank {rank} was told to roll step {step} forward but holds no reduced "
                f"gradients (phase {phase.value}); this is a bug in the commit rule",
                ranks=(rank,),
                last_committed_step=committed,
            )
        return True
    if decision.resume_step != step:
        raise StateDivergedError(
            f"rank {rank} is at step {step} but the ranks agreed to resume at {decision.resume_step}",
            ranks=(rank,),
            last_committed_step=committed,
        )
    return False


def region_action(decision: Decision, *, rank: int, committed: int, peers: dict[int, RegionState]) -> RegionAction:
    """Inside a guarded region, after committing step ``committed``: run it again or return its result.
    ``peers``: every rank's region state from the round's reports."""
    if decision.committed_step != committed or (rank in decision.apply_on):
        raise StateDivergedError(
            f"rank {rank} was inside guard.run after committing step {committed}, but the ranks "
            f"decided {decision}; this is a bug in the commit rule",
            ranks=(rank,),
            last_committed_step=committed,
        )
    return decide_region(peers, rank, decision.committed_step)
