"""The tax budget's pure rules (accelpact.snapshot.cadence): the cadence chosen for measured costs, that a
dearer protection never gets a denser cadence, the switch between two cadences, and that a simulated run
across the switch always leaves a step held by both a survivor and the lost rank's buddy within the bound."""

from __future__ import annotations

import itertools

import pytest

from accelpact.snapshot import SnapshotConfig
from accelpact.snapshot.cadence import (
    CostProbe,
    Costs,
    Schedule,
    candidates,
    choose,
    combine,
    predicted_tax,
)
from accelpact.snapshot.push_rule import is_pushed, replay_bound, slot_to_overwrite

# measured here (results/heal_tax, default model): copy + CRC ~6 ms, push ~19 ms both ends, step ~165 ms
HERE = Costs(snapshot_s=0.006, push_s=0.019, step_s=0.165)


def test_the_choice_is_the_densest_within_budget():
    e, k, fits = choose(HERE, 0.03)
    assert fits and predicted_tax(HERE, e, k) <= 0.03
    for de, dk in candidates(16):
        if (de * dk, de) < (e * k, e):  # every denser cadence is over the budget
            assert predicted_tax(HERE, de, dk) > 0.03, (de, dk)
    assert (e, k) == (4, 2)  # K = 8: every=4 costs 3.8% with a push each time, 2.3% with every other


def test_cheap_protection_keeps_every_step():
    assert choose(Costs(0.0001, 0.0001, 1.0), 0.03) == (1, 1, True)


def test_an_unmeetable_budget_takes_the_cheapest_within_the_bound():
    e, k, fits = choose(HERE, 1e-6, max_bound=4)
    assert not fits and (e, k) == (4, 1)
    assert e * k <= 4


def test_without_pushes_push_every_stays_1():
    e, k, _ = choose(Costs(0.01, 0.0, 0.165), 0.03, pushes=False)
    assert k == 1 and e == 4


@pytest.mark.parametrize("budget", [0.005, 0.01, 0.03, 0.1])
def test_dearer_protection_never_gets_a_denser_cadence(budget):
    """Scaling either cost up never lowers the replay bound K (nor every at the same K)."""
    scales = [0.01 * 1.5**i for i in range(25)]
    for which in ("snapshot_s", "push_s"):
        last = (0, 0)
        for s in scales:
            c = Costs(
                HERE.snapshot_s * (s if which == "snapshot_s" else 1),
                HERE.push_s * (s if which == "push_s" else 1),
                HERE.step_s,
            )
            e, k, _ = choose(c, budget)
            assert e * k >= last[0], (which, s, (e, k), last)
            last = (e * k, e)


def test_a_larger_budget_never_gets_a_sparser_cadence():
    bounds = [choose(HERE, b)[0] * choose(HERE, b)[1] for b in (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.5)]
    assert bounds == sorted(bounds, reverse=True)


def test_combine_is_the_dearest_rank():
    a, b = Costs(0.01, 0.02, 0.2), Costs(0.02, 0.01, 0.15)
    assert combine([a, b]) == Costs(0.02, 0.02, 0.15)
    with pytest.raises(ValueError):
        combine([])


def test_probe_takes_medians_and_counts_both_ends_of_the_push():
    p = CostProbe()
    for s, step in ((0.004, 0.2), (0.006, 0.1), (0.100, 0.15)):
        p.add_snapshot(s, 0.01)
        p.add_step(step)
    assert p.ready(3) and not p.ready(4)
    assert p.costs() == Costs(0.006, 0.02, 0.15)


@pytest.mark.parametrize("warm,chosen", [((1, 1), (4, 2)), ((1, 2), (4, 1)), ((2, 1), (1, 4)), ((1, 1), (1, 1))])
def test_the_switch_is_a_step_both_cadences_push(warm, chosen):
    for step in range(0, 40):
        s = Schedule.after(step, warm, chosen)
        assert s.switch_at > step
        assert is_pushed(s.switch_at, *warm) and is_pushed(s.switch_at, *chosen)
        assert s.at(s.switch_at - 1) == warm and s.at(s.switch_at) == chosen
        assert Schedule.from_text(s.to_text()) == s


def _heal_points(schedule: Schedule, steps: int):
    """A survivor snapshotting by ``schedule`` into two slots (push_rule's retention); the lost rank's buddy
    holds the newest two pushed steps whose push landed before the vote of the step after (confirm).
    Yield (committed step c, the bound in force, the survivor's held steps, the buddy's held steps)."""
    slots: dict[str, int | None] = {"slot0": None, "slot1": None}
    pushed: list[int] = []
    for c in range(steps):
        e, k = schedule.at(c)
        if c % e == 0:
            slots[slot_to_overwrite(slots, c, e, k, was_pushed=lambda s: is_pushed(s, *schedule.at(s)))] = c
            if is_pushed(c, e, k):
                pushed.append(c)
        landed = [s for s in pushed if s + 1 <= c]
        bound = max(replay_bound(*schedule.at(s)) for s in range(max(0, c - 64), c + 1))
        yield c, bound, {v for v in slots.values() if v is not None}, set(landed[-2:])


@pytest.mark.parametrize("warm,chosen", list(itertools.product([(1, 1), (1, 2), (2, 1)], candidates(16))))
def test_every_cadence_and_its_switch_keep_the_replay_bound(warm, chosen):
    """The replay bound of push_rule holds at every cadence the budget can choose, and across the switch
    from the warm-up cadence: a heal at any committed step finds a common step no further back than the
    bound of the cadences in force over the last steps."""
    schedule = Schedule.after(8, warm, chosen)
    worst_after = 0
    for c, bound, own, buddy in _heal_points(schedule, schedule.switch_at + 5 * replay_bound(*chosen) + 3):
        if not buddy:
            continue  # nothing pushed has landed yet: the heal resumes from the initial state
        common = own & buddy
        assert common, (warm, chosen, c, own, buddy)
        assert c - max(common) <= bound, (warm, chosen, c, own, buddy)
        if c >= schedule.switch_at + 2 * replay_bound(*chosen):
            worst_after = max(worst_after, c - max(common))
    assert worst_after == replay_bound(*chosen)  # after the switch the chosen bound is reached, never passed


def test_judging_held_steps_by_the_new_cadence_would_lose_the_common_step():
    """The case the simulation found: pushing every 2nd step, then every step from 10. Judged by the new
    rule, step 9 looks pushed and step 8 (the buddy's newest replica) is overwritten at 10."""
    schedule = Schedule.after(8, (1, 2), (1, 1))
    held = {"a": 8, "b": 9}
    assert slot_to_overwrite(held, 10, 1, 1) == "a"  # the wrong one: the buddy holds 6 and 8
    assert slot_to_overwrite(held, 10, 1, 1, was_pushed=lambda s: is_pushed(s, *schedule.at(s))) == "b"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_tax": 0.0}, "fraction of a step"),
        ({"max_tax": 1.5}, "fraction of a step"),
        ({"max_tax": 0.03, "push_every": 8, "max_bound": 4}, "raise max_bound"),
        ({"max_tax": 0.03, "tax_warmup": 0}, "at least 1 step"),
    ],
)
def test_bad_budget_settings_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SnapshotConfig(root="/tmp/x", **kwargs)
