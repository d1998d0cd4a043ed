"""The pure push_every rule (accelpact.snapshot.push_rule): which snapshots go to the buddy, which own
slot a rank keeps, the stated bound, and that a simulated run of the rule always leaves a step held by
both a survivor and the lost rank's buddy within the bound."""

from __future__ import annotations

import pytest

from accelpact.snapshot import SnapshotConfig
from accelpact.snapshot.push_rule import check_push_every, is_pushed, pushed_steps, replay_bound, slot_to_overwrite


def test_pushed_steps_are_multiples_of_every_times_push_every():
    assert pushed_steps(range(9)) == list(range(9))  # k=1: every snapshot, as before the option
    assert pushed_steps(range(9), push_every=2) == [0, 2, 4, 6, 8]
    assert pushed_steps(range(13), push_every=4) == [0, 4, 8, 12]
    # with snapshot.every=2 only even steps are snapshotted; push_every=3 pushes every 3rd of those
    assert pushed_steps(range(0, 19, 2), every=2, push_every=3) == [0, 6, 12, 18]
    assert not is_pushed(5, 1, 2) and is_pushed(6, 1, 2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_push_every_names_the_fix(bad):
    with pytest.raises(ValueError, match="use 1 .push every snapshot"):
        check_push_every(bad)
    with pytest.raises(ValueError, match=r"SnapshotConfig.push_every="):
        SnapshotConfig(root="/tmp/x", push_every=bad)


def test_default_is_push_every_snapshot():
    assert SnapshotConfig(root="/tmp/x").push_every == 1


def test_empty_slot_first_then_never_the_newest_pushed():
    assert slot_to_overwrite({"a": 3, "b": None}, 4) == "b"
    assert slot_to_overwrite({"a": None, "b": None}, 0) == "a"
    # k=1: the older slot, as before
    assert slot_to_overwrite({"a": 3, "b": 4}, 5) == "a"
    assert slot_to_overwrite({"a": 5, "b": 4}, 6) == "b"
    # k=2: slot a holds step 4 (pushed), b step 5: step 6 overwrites b, keeping 4 until 6 exists
    assert slot_to_overwrite({"a": 4, "b": 5}, 6, push_every=2) == "b"
    # then step 7 overwrites 4 (6 is now the newest pushed)
    assert slot_to_overwrite({"a": 4, "b": 6}, 7, push_every=2) == "a"
    # k=3: step 4 and 5 both go to the non-pushed slot
    assert slot_to_overwrite({"a": 3, "b": 4}, 5, push_every=3) == "b"


def _simulate(k: int, steps: int, landed_lag: int):
    """Per-step snapshots with push_every=k on a survivor; the lost rank's buddy holds the newest two pushed
    steps that landed, where the push of step s lands ``landed_lag`` steps after s committed (0: before the
    vote of s + 1, i.e. confirm=True). Yield (committed step c, survivor's held steps, buddy's held steps)."""
    slots: dict[str, int | None] = {"slot0": None, "slot1": None}
    for c in range(steps):
        slots[slot_to_overwrite(slots, c, 1, k)] = c
        landed = [s for s in pushed_steps(range(c + 1), 1, k) if s + landed_lag + 1 <= c]
        yield c, {v for v in slots.values() if v is not None}, set(landed[-2:])


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_confirmed_pushes_bound_replay_by_k(k):
    """With every push acknowledged before the next vote, at every committed step c the survivor and the
    lost rank's buddy share a step, and the heal (the newest shared step) replays at most k steps."""
    worst = 0
    for c, own, buddy in _simulate(k, 30, landed_lag=0):
        if c == 0:
            continue  # nothing pushed has landed yet: the heal resumes from the initial state (step -1)
        common = own & buddy
        assert common, (k, c, own, buddy)
        worst = max(worst, c - max(common))
    assert worst == replay_bound(1, k)  # the bound is reached, and never passed


def test_without_keeping_the_pushed_slot_k2_would_lose_the_common_step():
    """The retention rule is what makes k > 1 healable: overwriting the older slot (the k=1 rule) at k=3
    leaves the survivor no slot of the buddy's newest replica."""
    slots = {"a": 4, "b": 5}  # the k=1 choice after steps 4, 5; the buddy's newest replica is of step 3
    assert 3 not in slots.values()
    kept: dict[str, int | None] = {"a": None, "b": None}
    for c in range(6):
        kept[slot_to_overwrite(kept, c, 1, 3)] = c
    assert set(kept.values()) == {3, 5}
