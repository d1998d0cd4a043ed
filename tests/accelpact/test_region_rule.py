"""The commit rule of guarded regions (accelpact.recovery.region_rule.decide_region): pure logic, hand-built states."""

from __future__ import annotations

import pytest

from accelpact.errors import StateDivergedError
from accelpact.recovery.region_rule import RegionAction, RegionPhase, RegionState, decide_region

RUN, IN, VOTED = RegionPhase.RUNNING, RegionPhase.IN_VOTE, RegionPhase.VOTED


def s(committed, done, phase=None):
    return RegionState(committed, done, phase)


def test_nobody_completed_the_region_vote_everyone_inside_runs_fn_again():
    states = {0: s(4, 0, RUN), 1: s(4, 0, IN), 2: s(4, 0, IN)}
    assert {r: decide_region(states, r, 4) for r in (0, 1, 2)} == {r: RegionAction.RETRY for r in (0, 1, 2)}


def test_a_rank_past_the_region_means_every_rank_in_its_vote_completes():
    # Rank 1's vote completed and it moved into the next step; rank 0's copy of the vote failed.
    states = {0: s(4, 0, IN), 1: s(4, 1, None)}
    assert decide_region(states, 0, 4) is RegionAction.COMPLETE
    assert decide_region(states, 1, 4) is RegionAction.NONE
    assert decide_region({0: s(4, 0, IN), 1: s(4, 0, VOTED)}, 0, 4) is RegionAction.COMPLETE


def test_a_rank_rolled_forward_into_the_committed_step_has_not_reached_the_region():
    # Rank 1 was still in the vote of step 4 (committed 3): the step rule rolls it forward to 4; rank 0,
    # already inside the first region after 4, runs fn again (rank 1 will run it for the first time).
    states = {0: s(4, 0, IN), 1: s(3, 0, None)}
    assert decide_region(states, 0, 4) is RegionAction.RETRY


def test_a_completed_vote_a_rank_never_entered_is_divergence():
    with pytest.raises(StateDivergedError, match="never entered it"):
        decide_region({0: s(4, 0, RUN), 1: s(4, 1, None)}, 0, 4)


def test_a_rank_two_regions_ahead_is_divergence():
    with pytest.raises(StateDivergedError, match="completed a region vote past region 0"):
        decide_region({0: s(4, 0, IN), 1: s(4, 2, None)}, 0, 4)


def test_the_wire_form_round_trips_and_rejects_garbage():
    for st in (s(4, 1, IN), s(-1, 0, None)):
        assert RegionState.from_dict(st.to_dict()) == st
    with pytest.raises(StateDivergedError):
        RegionState.from_dict({"committed": 1, "done": 0, "phase": "nowhere"})
