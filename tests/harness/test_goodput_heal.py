"""Goodput accounting of a heal in memory, against a timeline worked out by hand (pure logic, no torch).

Each badput part must mean what it says: before, a heal with no replayed step showed "replay" (the
survivor's detection latency) and "restart" (the parent seeing the death, and the replacement's set-up
after its heal) although nothing was relaunched.
"""

from __future__ import annotations

import pytest

from harness.report.goodput import check_invariant, compute_goodput

approx = pytest.approx


def _step(rank, i, t0, t1):
    return {
        "kind": "step",
        "t": t1,
        "rank": rank,
        "step": i,
        "t_start": t0,
        "t_end": t1,
        "loss": 1.0,
        "tokens": 100,
        "incarnation": 0,
        "replay": False,
    }


def _heal(rank, role, t_detected, start_s, transfer_s):
    return {
        "kind": "heal",
        "rank": rank,
        "role": role,
        "t": t_detected + start_s + transfer_s,
        "t_detected": t_detected,
        "replacement_start_s": start_s,
        "heal_transfer_s": transfer_s,
        "replayed_steps": 0,
    }


def _restart(rank, t_launch, t_ready, replacement):
    return {
        "kind": "restart",
        "t": t_ready,
        "rank": rank,
        "t_launch": t_launch,
        "t_ready": t_ready,
        "incarnation": 0,
        "replacement": replacement,
    }


def heal_events():
    """2 ranks, steps 0-4 are [i, i+1] on both. Rank 1 is SIGKILLed at t=5.5 in step 5 (the parent logs it).
    rank 0 (survivor): step 5's record spans [5, 11]: attempt [5, 5.5] thrown away (replay), caught the loss
      at 5.7 (detection 0.2), replacement arrived at 9.7 (replacement_start 4), heal done at 10.2
      (heal_transfer 0.5), the retried step 5 runs [10.2, 11] (useful). Step 6: [11, 12].
    rank 1: the dead process's attempt [5, 5.5] has no record (other); the parent saw the death and launched
      the replacement at 5.8 (detection 0.3); arrived 9.7 (replacement_start 3.9), heal done 10.2
      (heal_transfer 0.5), ready to train at 10.3 (its restart record: heal_transfer 0.1 more), step 5 runs
      [10.3, 11], step 6 [11, 12].
    """
    ev = [{"kind": "fault", "t": 5.5, "rank": -1, "fault": "kill", "step": 5, "phase": "vote", "ranks": [1]}]
    for r in (0, 1):
        ev.extend(_step(r, i, i, i + 1) for i in range(5))
        ev.append(_step(r, 6, 11, 12))
    ev += [_restart(0, -1.0, 0.0, 0), _restart(1, -1.0, 0.0, 0)]
    ev += [_step(0, 5, 5, 11), _heal(0, "survivor", 5.7, 4.0, 0.5)]
    ev += [_heal(1, "replacement", 5.8, 3.9, 0.5), _restart(1, 5.8, 10.3, 1), _step(1, 5, 10.3, 11)]
    return ev


def test_a_heal_is_charged_to_detection_replacement_start_and_heal_transfer_never_restart():
    report = compute_goodput(heal_events())
    b = report.badput
    check_invariant(report)
    assert report.replayed_steps == 0
    # Means over the 2 ranks.
    assert b.restart_s == approx(0.0, abs=1e-9)  # nothing was relaunched
    assert b.detection_s == approx((0.2 + 0.3) / 2)
    assert b.replacement_start_s == approx((4.0 + 3.9) / 2)
    assert b.heal_transfer_s == approx((0.5 + 0.6) / 2)
    # Only the survivor's attempt in flight, up to the fault, is work thrown away and run again.
    assert b.replay_s == approx(0.5 / 2)
    assert b.other_s == approx(0.5 / 2)  # the dead process's attempt: no record covers it
    assert report.useful_s + b.total_s == approx(report.timeline.wall_s)
    [fault] = report.faults
    assert fault.badput.total_s == approx(b.total_s)  # every part of it is the kill's


def test_a_relaunch_is_still_restart():
    ev = heal_events()
    ev = [e for e in ev if e["kind"] != "heal" and not (e["kind"] == "restart" and e.get("replacement"))]
    ev.append(_restart(1, 5.8, 10.3, 0))  # the same process start, as a relaunch (no heal record)
    b = compute_goodput(ev).badput
    # rank 1: fault -> ready is restart (5.5 -> 10.3); rank 0's step keeps its whole record as useful.
    assert b.restart_s == approx(4.8 / 2)
    assert b.detection_s == approx(0.0, abs=1e-9) and b.heal_transfer_s == approx(0.0, abs=1e-9)


def test_a_replacement_lost_on_its_way_in_is_replacement_start_not_detection():
    """As heal_events, but the parent spawned a first replacement of rank 1 at 5.8 that died; the second,
    spawned at 7.0, healed (its heal record's t_detected is its own launch). Rank 1: detection is the fault
    -> the first spawn (0.3 s); the first replacement's life [5.8, 7.0] is replacement_start too."""
    ev = [e for e in heal_events() if not (e["kind"] == "heal" and e["role"] == "replacement")]
    ev += [
        {"kind": "replacement", "rank": -1, "t": 5.8, "for_rank": 1, "t_spawn": 5.8, "replacement": 1},
        {"kind": "replacement", "rank": -1, "t": 7.0, "for_rank": 1, "t_spawn": 7.0, "replacement": 2},
        _heal(1, "replacement", 7.0, 2.7, 0.5),
    ]
    report = compute_goodput(ev)
    check_invariant(report)
    b = report.badput
    assert b.detection_s == approx((0.2 + 0.3) / 2)
    assert b.replacement_start_s == approx((4.0 + 1.2 + 2.7) / 2)
    assert b.restart_s == approx(0.0, abs=1e-9)
