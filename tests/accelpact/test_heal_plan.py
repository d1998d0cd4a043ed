"""The heal's resume-step rule (accelpact.recovery.heal_plan.decide_resume): pure logic, hand-built reports."""

from __future__ import annotations

import itertools

import pytest

from accelpact.errors import RankLostError, StateDivergedError
from accelpact.recovery.heal_plan import HealReport, decide_resume


def survivor(rank, committed, *slots):
    return HealReport(rank, "survivor", committed, {committed: "live", **{s: "own" for s in slots if s != committed}})


def replacement(rank, held, buddy=None):
    return HealReport(rank, "replacement", -1, held, buddy=buddy)


def test_survivor_at_the_dead_ranks_newest_slot_resumes_without_rollback():
    plan = decide_resume([survivor(0, 4, 4, 3), replacement(1, {4: "own", 3: "own", -1: "live"})], 2)
    assert (plan.step, plan.resume_step, plan.sources) == (4, 5, {0: "live", 1: "own"})
    assert plan.replayed(4) == 0 and plan.healed_from() == "own"


def test_a_survivor_one_step_ahead_rolls_back_one_step():
    # post_vote kill: the survivor committed 5, the dead rank's newest slot is 4.
    plan = decide_resume([survivor(0, 5, 5, 4), replacement(1, {4: "own", 3: "own"})], 2)
    assert (plan.step, plan.sources[0]) == (4, "own") and plan.replayed(5) == 1


def test_a_kill_during_the_copy_resumes_from_the_older_slot():
    plan = decide_resume([survivor(0, 4, 4, 3), survivor(2, 4, 4, 3), replacement(1, {3: "own", 2: "own"})], 3)
    assert plan.step == 3 and plan.replayed(4) == 1


def test_buddy_replica_is_the_source_when_no_own_slot_survives():
    plan = decide_resume([survivor(0, 6, 6, 5), replacement(1, {6: "buddy", 5: "buddy"}, buddy=0)], 2)
    assert plan.step == 6 and plan.healed_from() == "buddy"


def test_before_any_snapshot_the_fresh_model_is_step_minus_one():
    plan = decide_resume([survivor(0, -1), replacement(1, {-1: "live"})], 2)
    assert plan.resume_step == 0


def test_no_copy_of_a_lost_rank_names_the_rank_and_its_buddy():
    with pytest.raises(RankLostError) as err:
        decide_resume([survivor(0, 6, 6, 5), replacement(1, {}, buddy=0)], 2)
    assert "no in-memory copy" in str(err.value) and "buddy rank 0" in str(err.value)
    assert set(err.value.ranks) == {0, 1} and err.value.detected_by == "heal"


def test_a_replacement_with_only_its_fresh_state_has_no_copy_once_survivors_committed():
    with pytest.raises(RankLostError, match="no in-memory copy of the lost rank"):
        decide_resume([survivor(0, 6, 6, 5), replacement(1, {-1: "live"})], 2)


def test_no_step_in_common_lists_every_ranks_held_steps():
    with pytest.raises(RankLostError) as err:
        decide_resume([survivor(0, 9, 9, 8), replacement(1, {3: "buddy"})], 2)
    assert "rank 0 (survivor): [8, 9]" in str(err.value) and "rank 1 (replacement): [3]" in str(err.value)


def test_missing_or_malformed_reports_are_refused():
    with pytest.raises(StateDivergedError):
        decide_resume([survivor(0, 3, 3)], 2)
    with pytest.raises(StateDivergedError):
        HealReport.from_bytes(b'{"rank": 0, "role": "survivor", "committed": 1, "held": {"1": "tape"}}')


def test_wire_round_trip_and_order_independence():
    reports = [
        survivor(0, 5, 5, 4),
        survivor(2, 4, 4, 3),
        replacement(1, {4: "own", 3: "own"}, buddy=2),
        replacement(3, {4: "buddy", 3: "buddy"}, buddy=0),
    ]
    assert [HealReport.from_bytes(r.to_bytes()) for r in reports] == reports
    plans = [decide_resume(list(p), 4) for p in itertools.permutations(reports)]
    assert all(p == plans[0] for p in plans) and plans[0].step == 4


def test_a_survivor_inside_a_guarded_region_caps_the_resume_step_at_its_committed_step():
    # The replacement's newest slot is the survivor's committed step 4, but the survivor was inside
    # guard.run after step 4: everyone re-runs iteration 4 (the region included) from slot 3.
    capped = HealReport(0, "survivor", 4, {4: "live", 3: "own"}, resume_by=4)
    plan = decide_resume([capped, replacement(1, {4: "own", 3: "own"})], 2)
    assert (plan.step, plan.resume_step, plan.sources[0]) == (3, 4, "own") and plan.replayed(4) == 1
    # The cap travels on the wire, and the smallest cap of all ranks wins.
    assert HealReport.from_bytes(capped.to_bytes()) == capped
    other = HealReport(2, "survivor", 4, {4: "live", 3: "own", 2: "own"}, resume_by=3)
    capped = HealReport(0, "survivor", 4, {4: "live", 3: "own", 2: "own"}, resume_by=4)
    plan = decide_resume([capped, other, replacement(1, {4: "own", 3: "own", 2: "own"})], 3)
    assert plan.step == 2


def test_a_cap_before_every_held_step_is_named():
    capped = HealReport(0, "survivor", 4, {4: "live", 3: "own"}, resume_by=3)
    with pytest.raises(RankLostError, match="inside guard.run or finish"):
        decide_resume([capped, replacement(1, {4: "own", 3: "own"})], 2)
