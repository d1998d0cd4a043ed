"""Badput-based goodput on synthetic event logs whose answers are worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest

from harness.report.badput_goodput import (
    BADPUT_PARTS,
    PART_NAMES,
    badput_goodput,
    badput_goodput_from_row,
    google_buckets,
    named_parts,
    productive_step_s,
)
from harness.report.goodput import Badput, compute_goodput

approx = pytest.approx


def step(rank, i, t0, t1, tokens=100, incarnation=0):
    return {
        "kind": "step",
        "t": t1,
        "rank": rank,
        "step": i,
        "t_start": t0,
        "t_end": t1,
        "loss": 1.0,
        "tokens": tokens,
        "incarnation": incarnation,
    }


def reference(step_s=1.0):
    """Fault-free, 1 rank: 10 steps of ``step_s`` from t=0, a 0.5 s checkpoint stall after step 4."""
    ev, t = [], 0.0
    for i in range(10):
        ev.append(step(0, i, t, t + step_s))
        t += step_s
        if i == 4:
            ev.append({"kind": "checkpoint", "t": t + 0.5, "rank": 0, "step": 4, "t_start": t, "t_end": t + 0.5})
            t += 0.5
    return ev


def cold_restart(step_s):
    """1 rank, steps of ``step_s``: steps 0-6, a fault at 7 steps + 0.2 s, a relaunch 3 s later (ready 2 s
    after launch), a 0.5 s restore from step 4, replays of 5 and 6, then steps 7-9."""
    ev = [step(0, i, i * step_s, (i + 1) * step_s) for i in range(7)]
    t_fault = 7 * step_s + 0.2
    ev.append(
        {"kind": "fault", "t": t_fault, "rank": -1, "fault": "socket_reset", "step": 7, "phase": "x", "ranks": [0]}
    )
    ready = t_fault + 3.0
    ev.append({"kind": "restart", "t": ready, "rank": 0, "t_launch": t_fault + 1.0, "t_ready": ready, "incarnation": 1})
    ev.append({"kind": "restore", "t": ready + 0.5, "rank": 0, "from_step": 4, "t_start": ready, "t_end": ready + 0.5})
    t = ready + 0.5
    for i in (5, 6, 7, 8, 9):
        ev.append(step(0, i, t, t + step_s, incarnation=1))
        t += step_s
    return ev


def test_reference_equals_its_measured_goodput():
    ref = compute_goodput(reference())
    # useful 10 s over 10 steps; badput 0.5 s; wall 10.5 s
    assert productive_step_s(ref) == approx(1.0)
    bg = badput_goodput(ref, ref)
    assert bg.goodput == approx(1000 / 10.5) == approx(ref.goodput)
    assert bg.step_drift == approx(1.0)


def test_slow_steps_do_not_move_it_but_badput_does():
    """The same cold restart with 1 s steps and with 1.5 s steps (a loaded host): the measured goodput
    drops, the badput-based one does not move except through the replay, which is measured badput."""
    ref = compute_goodput(reference())
    fast, slow = compute_goodput(cold_restart(1.0)), compute_goodput(cold_restart(1.5))
    # fast: badput = restart (fault 7.2 -> ready 10.2: 3 s) + restore 0.5 + replay 2 x 1 s + other
    # (step 6 end 7.0 -> fault 7.2: the in-flight step, 0.2 s) = 5.7 s; 10 useful steps at the
    # reference's 1 s: 1000 / (10 + 5.7)
    assert fast.badput.total_s == approx(5.7)
    assert badput_goodput(fast, ref).goodput == approx(1000 / 15.7)
    # slow: replay is 2 x 1.5 s, so badput 6.7 s; the useful steps still count at the reference's 1 s.
    assert slow.badput.total_s == approx(6.7)
    assert badput_goodput(slow, ref).goodput == approx(1000 / 16.7)
    assert badput_goodput(slow, ref).step_drift == approx(1.5)
    # measured whole-run goodput moved by far more (wall 15.7 vs 10.5 + 0.2 + 3.5 + 7.5 = 21.7 s)
    assert fast.goodput == approx(1000 / 15.7) and slow.goodput == approx(1000 / 21.7)


def test_reference_given_as_a_step_time_and_step_factor():
    run = compute_goodput(cold_restart(1.0))
    assert badput_goodput(run, 2.0).goodput == approx(1000 / (20 + 5.7))
    # a per-step overhead measured side by side (10%) is charged on the useful steps
    assert badput_goodput(run, 1.0, step_factor=1.1).goodput == approx(1000 / (11 + 5.7))


def test_reference_pace_over_trials_is_the_median():
    from harness.report.badput_goodput import reference_step_s

    refs = [compute_goodput(reference(s)) for s in (1.0, 3.0, 1.2)]
    assert reference_step_s(refs) == approx(1.2)
    assert reference_step_s(refs[:2]) == approx(2.0)
    assert math.isnan(reference_step_s([])) and math.isnan(reference_step_s([compute_goodput([])]))


def test_no_reference_is_nan_not_zero():
    run = compute_goodput(cold_restart(1.0))
    empty = compute_goodput([])
    assert math.isnan(badput_goodput(run, empty).goodput)
    assert math.isnan(badput_goodput(run, empty).step_drift)


def test_from_row_is_the_same_definition():
    run = compute_goodput(cold_restart(1.0))
    row = {"tokens": run.tokens, "steps": run.steps, "badput_s": run.badput.total_s}
    assert badput_goodput_from_row(row, 1.0) == approx(badput_goodput(run, 1.0).goodput)


def test_every_badput_field_has_exactly_one_named_part():
    from dataclasses import fields

    assert sorted(p.field for p in BADPUT_PARTS) == sorted(f.name for f in fields(Badput))
    assert len(set(PART_NAMES)) == len(PART_NAMES)
    for name in (
        "program_startup",
        "checkpoint_save",
        "checkpoint_restore",
        "wasted_progress",
        "detection",
        "agreement",
        "rebuild",
        "heal_transfer",
    ):
        assert name in PART_NAMES


def test_named_parts_and_buckets_sum_to_total():
    run = compute_goodput(cold_restart(1.0))
    parts = named_parts(run.badput)
    assert parts["program_startup"] == approx(3.0) and parts["checkpoint_restore"] == approx(0.5)
    assert parts["wasted_progress"] == approx(2.0) and parts["other"] == approx(0.2)
    assert sum(parts.values()) == approx(run.badput.total_s)
    buckets = google_buckets(run.badput)
    assert buckets["PROGRAM_STARTUP"] == approx(3.0)
    assert buckets["WASTED_PROGRESS_FROM_DISRUPTION"] == approx(2.0)
    assert sum(buckets.values()) == approx(run.badput.total_s)
