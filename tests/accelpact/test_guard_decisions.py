"""accelpact.guard.decisions: what a recovery round's decision means for one rank, in a step and in a region."""

from __future__ import annotations

import pytest

from accelpact.errors import StateDivergedError
from accelpact.guard.decisions import region_action, rolls_forward
from accelpact.recovery.consensus import Action, Decision, Phase
from accelpact.recovery.region_rule import RegionAction, RegionPhase, RegionState

RETRY_5 = Decision(Action.RETRY, step=5, apply_on=(), resume_step=5, committed_step=4)
FORWARD_5 = Decision(Action.ROLL_FORWARD, step=5, apply_on=(1,), resume_step=6, committed_step=5)


def test_a_step_rolls_forward_only_on_the_ranks_told_to_and_retries_elsewhere():
    assert rolls_forward(FORWARD_5, 1, 5, Phase.VOTED, True, 4) is True
    assert rolls_forward(RETRY_5, 0, 5, Phase.BEFORE_VOTE, False, 4) is False


@pytest.mark.parametrize("phase, holds_loss", [(Phase.BEFORE_VOTE, True), (Phase.VOTED, False)])
def test_rolling_forward_without_reduced_gradients_is_a_commit_rule_bug(phase, holds_loss):
    with pytest.raises(StateDivergedError, match="holds no reduced gradients"):
        rolls_forward(FORWARD_5, 1, 5, phase, holds_loss, 4)


def test_a_resume_step_other_than_this_step_is_divergence():
    with pytest.raises(StateDivergedError, match="agreed to resume at 6"):
        rolls_forward(FORWARD_5, 0, 5, Phase.BEFORE_VOTE, True, 4)


def test_a_region_decision_reruns_or_completes_and_refuses_a_moved_commit():
    inside = {0: RegionState(4, 0, RegionPhase.RUNNING), 1: RegionState(4, 0, RegionPhase.RUNNING)}
    assert region_action(RETRY_5, rank=0, committed=4, peers=inside) is RegionAction.RETRY
    voted = {0: RegionState(4, 0, RegionPhase.IN_VOTE), 1: RegionState(4, 0, RegionPhase.VOTED)}
    assert region_action(RETRY_5, rank=0, committed=4, peers=voted) is RegionAction.COMPLETE
    with pytest.raises(StateDivergedError, match="inside guard.run"):
        region_action(FORWARD_5, rank=1, committed=4, peers=inside)
