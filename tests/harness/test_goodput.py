"""Goodput accounting against timelines whose answers are worked out by hand in the comments."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.report.goodput import (
    Badput,
    GoodputReport,
    Timeline,
    check_invariant,
    compute_goodput,
    goodput_ratio,
    load_report,
)
from harness.report.table import TABLE_COLUMNS, RunSummary, comparison_table, format_table

approx = pytest.approx


# ---- tiny record builders (the field names are harness.events' contract) ---------------------------
def step(rank, i, t0, t1, tokens=100, incarnation=0, replay=False):
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
        "replay": replay,
    }


def fault(t, kind="socket_reset", at_step=7, phase="backward", ranks=(0,), writer=-1):
    return {
        "kind": "fault",
        "t": t,
        "rank": writer,
        "fault": kind,
        "step": at_step,
        "phase": phase,
        "ranks": list(ranks),
    }


def recovery(rank, t, detection, agreement, rebuild, rebind, first, decision="retry", at_step=7):
    return {
        "kind": "recovery",
        "t": t,
        "rank": rank,
        "step": at_step,
        "decision": decision,
        "phase": "backward",
        "detection_s": detection,
        "agreement_s": agreement,
        "rebuild_s": rebuild,
        "rebind_s": rebind,
        "first_collective_s": first,
    }


def restart(rank, t_launch, t_ready, incarnation):
    return {
        "kind": "restart",
        "t": t_ready,
        "rank": rank,
        "t_launch": t_launch,
        "t_ready": t_ready,
        "incarnation": incarnation,
    }


def restore(rank, t0, t1, from_step):
    return {"kind": "restore", "t": t1, "rank": rank, "from_step": from_step, "t_start": t0, "t_end": t1}


def checkpoint(rank, i, t0, t1):
    return {
        "kind": "checkpoint",
        "t": t1,
        "rank": rank,
        "step": i,
        "t_start": t0,
        "t_end": t1,
        "bytes": 1024,
        "mode": "sync",
    }


# ---- the four strategy shapes ---------------------------------------------------------------------
def reference_events(ranks=(0, 1)):
    """none: 10 steps of 1 s from t=100, a 0.5 s checkpoint stall after step 4.
    steps 0-4: [100, 105]; checkpoint [105, 105.5]; steps 5-9: [105.5, 110.5]."""
    ev = []
    for r in ranks:
        t = 100.0
        for i in range(10):
            ev.append(step(r, i, t, t + 1, tokens=64))
            t += 1
            if i == 4:
                ev.append(checkpoint(r, 4, t, t + 0.5))
                t += 0.5
    return ev


def accelpact_events():
    """accelpact, 2 ranks: steps 0-6 are [i, i+1]. A socket reset at t=7.5 during step 7 (rank 0 logs it).
    Both ranks recover in 11 ms, retry step 7 (1 s) from 7.511, then steps 8, 9.
      rank 0: detection 5 ms [7.5, 7.505], agreement 2 ms, rebuild 3 ms, rebind 0.5 + first coll 0.5 ms
      rank 1: detection 8 ms, agreement 1 ms, rebuild 1 ms, rebind 0.6 + first coll 0.4 ms
    Step 7's record spans [7.0, 8.511]: the failed attempt [7.0, 7.5] is replay (decision=retry)."""
    ev = [fault(7.5, ranks=(0,), writer=0)]
    for r in (0, 1):
        for i in range(7):
            ev.append(step(r, i, float(i), i + 1.0))
        ev.append(step(r, 7, 7.0, 8.511))
        ev.append(step(r, 8, 8.511, 9.511))
        ev.append(step(r, 9, 9.511, 10.511))
    ev.append(recovery(0, 7.511, 0.005, 0.002, 0.003, 0.0005, 0.0005))
    ev.append(recovery(1, 7.511, 0.008, 0.001, 0.001, 0.0006, 0.0004))
    return ev


def cold_restart_events(rank=0):
    """cold_restart, 1 rank: 10 steps of 1 s; checkpoint after step 4; fault during step 7; 3 s restart.
    steps 0-4 [0, 5]; checkpoint [5, 5.5]; steps 5, 6 [5.5, 7.5]; fault at 8.0 (in step 7)
    parent relaunches at 12.0, ready at 15.0 (incarnation 1); restore [15.0, 15.5] from step 4
    replays 5, 6 [15.5, 17.5]; steps 7, 8, 9 [17.5, 20.5]."""
    ev = [fault(8.0, kind="blackhole", ranks=(0, 1))]
    for i in range(5):
        ev.append(step(rank, i, float(i), i + 1.0, tokens=50))
    ev.append(checkpoint(rank, 4, 5.0, 5.5))
    ev.append(step(rank, 5, 5.5, 6.5, tokens=50))
    ev.append(step(rank, 6, 6.5, 7.5, tokens=50))
    ev.append(restart(rank, 12.0, 15.0, incarnation=1))
    ev.append(restore(rank, 15.0, 15.5, from_step=4))
    ev.append(step(rank, 5, 15.5, 16.5, tokens=50, incarnation=1, replay=True))
    ev.append(step(rank, 6, 16.5, 17.5, tokens=50, incarnation=1, replay=True))
    for k, i in enumerate((7, 8, 9)):
        ev.append(step(rank, i, 17.5 + k, 18.5 + k, tokens=50, incarnation=1))
    return ev


def checkpoint_restore_events():
    """checkpoint_restore (NVRx in-process), 2 identical ranks, 6 steps, checkpoint every 3 steps.
    steps 0-2 [0, 3]; checkpoint [3, 3.2]; steps 3, 4 [3.2, 5.2]; hang at 5.7 (in step 5)
    in-process restart raised at 8.7 (3 s PG timeout), ready 9.25; restore [9.25, 9.45] from step 2
    replays 3, 4 [9.45, 11.45]; step 5 [11.45, 12.45]."""
    ev = [fault(5.7, kind="hang", at_step=5, phase="forward", ranks=(1,))]
    for r in (0, 1):
        ev += [step(r, i, float(i), i + 1.0, tokens=32) for i in range(3)]
        ev.append(checkpoint(r, 2, 3.0, 3.2))
        ev += [step(r, 3, 3.2, 4.2, tokens=32), step(r, 4, 4.2, 5.2, tokens=32)]
        ev.append(restart(r, 8.7, 9.25, incarnation=1))
        ev.append(restore(r, 9.25, 9.45, from_step=2))
        ev += [
            step(r, 3, 9.45, 10.45, tokens=32, incarnation=1, replay=True),
            step(r, 4, 10.45, 11.45, tokens=32, incarnation=1, replay=True),
            step(r, 5, 11.45, 12.45, tokens=32, incarnation=1),
        ]
    return ev


def test_reference_no_faults():
    rep = compute_goodput(reference_events())
    # wall = 110.5 - 100 = 10.5 s; tokens = 10 steps x 64 x 2 ranks = 1280; goodput = 1280 / 10.5
    assert rep.timeline.wall_s == approx(10.5)
    assert rep.tokens == 1280 and rep.steps == 10 and rep.n_ranks == 2
    assert rep.goodput == approx(1280 / 10.5)
    # useful 10 s; the only badput is the 0.5 s checkpoint stall
    assert rep.useful_s == approx(10.0)
    assert rep.badput == Badput(checkpoint_s=approx(0.5))
    assert rep.faults == () and rep.replayed_steps == 0
    check_invariant(rep)


def test_accelpact_in_memory_recovery():
    rep = compute_goodput(accelpact_events())
    # wall = 10.511; tokens = 10 x 100 x 2 = 2000
    assert rep.timeline.wall_s == approx(10.511)
    assert rep.tokens == 2000 and rep.steps == 10
    assert rep.goodput == approx(2000 / 10.511)
    b = rep.badput
    assert b.detection_s == approx((0.005 + 0.008) / 2)  # 6.5 ms
    assert b.agreement_s == approx((0.002 + 0.001) / 2)  # 1.5 ms
    assert b.rebuild_s == approx((0.003 + 0.001) / 2)  # 2 ms
    assert b.rebind_s == approx((0.001 + 0.001) / 2)  # rebind + first collective: 1 ms
    assert b.recovery_s == approx(0.011)
    assert b.replay_s == approx(0.5)  # the attempt thrown away by the retry: [7.0, 7.5]
    assert b.restart_s == b.restore_s == b.checkpoint_s == 0
    assert b.other_s == approx(0.0, abs=1e-9)
    # useful = 10.511 - 0.011 - 0.5 = 10.0
    assert rep.useful_s == approx(10.0)
    assert len(rep.faults) == 1
    f = rep.faults[0]
    assert (f.kind, f.step, f.phase, f.ranks, f.t) == ("socket_reset", 7, "backward", (0,), 7.5)
    assert f.badput.recovery_s == approx(0.011) and f.badput.replay_s == approx(0.5)
    check_invariant(rep)


def test_accelpact_roll_forward_loses_no_work():
    ev = [dict(e, decision="roll_forward") if e["kind"] == "recovery" else e for e in accelpact_events()]
    rep = compute_goodput(ev)
    assert rep.badput.replay_s == approx(0.0)
    assert rep.useful_s == approx(10.5)  # 10.511 - 0.011: the pre-fault half of step 7 was kept
    check_invariant(rep)


def test_retry_replay_is_charged_to_its_fault_when_the_recovery_starts_at_the_injection():
    # The recovery's start (its record's t minus its parts) lands on the injection, which the fault
    # record carries as t_inject (its own t is when it was written, later); float rounding may put the
    # start a hair before it. The attempt thrown away is still this fault's replay.
    ev = [e for e in accelpact_events() if e["kind"] != "fault"]
    ev.append(dict(fault(7.504), t_inject=7.5 + 1e-9))
    rep = compute_goodput(ev)
    [f] = rep.faults
    assert f.t == approx(7.5) and f.badput.replay_s == approx(0.5) and rep.badput.replay_s == approx(0.5)
    check_invariant(rep)


def test_cold_restart_with_replay():
    rep = compute_goodput(cold_restart_events())
    # wall = 20.5; tokens = 10 x 50 = 500; goodput = 500 / 20.5 = 24.39 tokens/s
    assert rep.timeline.wall_s == approx(20.5)
    assert rep.tokens == 500 and rep.steps == 10 and rep.replayed_steps == 2
    assert rep.goodput == approx(500 / 20.5)
    b = rep.badput
    assert b.checkpoint_s == approx(0.5)
    assert b.restart_s == approx(7.0)  # fault 8.0 -> relaunch 12.0 (4 s) + launch -> ready (3 s)
    assert b.restore_s == approx(0.5)
    assert b.replay_s == approx(2.0)  # steps 5 and 6 again
    assert b.other_s == approx(0.5)  # the in-flight step 7 lost: [7.5, 8.0]
    # useful = 20.5 - 0.5 - 7 - 0.5 - 2 - 0.5 = 10
    assert rep.useful_s == approx(10.0)
    (f,) = rep.faults
    assert f.kind == "blackhole"
    # everything but the checkpoint stall is this fault's doing: 7 + 0.5 + 2 + 0.5 = 10
    assert f.badput == Badput(restart_s=approx(7.0), restore_s=approx(0.5), replay_s=approx(2.0), other_s=approx(0.5))
    check_invariant(rep)


def test_checkpoint_restore_in_process():
    rep = compute_goodput(checkpoint_restore_events())
    # wall = 12.45; tokens = 6 steps x 32 x 2 ranks = 384
    assert rep.timeline.wall_s == approx(12.45)
    assert rep.tokens == 384 and rep.steps == 6 and rep.n_ranks == 2
    assert rep.goodput == approx(384 / 12.45)
    b = rep.badput
    assert b.checkpoint_s == approx(0.2)
    assert b.restart_s == approx(9.25 - 5.7)  # hang 5.7 -> raise 8.7 -> ready 9.25: 3.55
    assert b.restore_s == approx(0.2)
    assert b.replay_s == approx(2.0)
    assert b.other_s == approx(0.5)  # [5.2, 5.7]
    assert rep.useful_s == approx(6.0)  # 12.45 - 0.2 - 3.55 - 0.2 - 2 - 0.5
    assert rep.faults[0].badput.total_s == approx(3.55 + 0.2 + 2.0 + 0.5)
    check_invariant(rep)


def test_ratio_and_comparison_table():
    # Same work (10 steps x 100 tokens, 1 rank): reference 10 s, accelpact 10.511 s, cold restart 20.5 s.
    ref = compute_goodput([step(0, i, float(i), i + 1.0) for i in range(10)])
    ours = compute_goodput([e for e in accelpact_events() if e["rank"] != 1])
    cold = compute_goodput([dict(e, tokens=100) if e["kind"] == "step" else e for e in cold_restart_events()])
    assert goodput_ratio(ours, ref) == approx(10 / 10.511)
    assert goodput_ratio(cold, ref) == approx(10 / 20.5)
    rows = comparison_table(
        [
            RunSummary("cold_restart", cold, age=2, fault="socket_reset", bit_identical=False),
            RunSummary("accelpact", ours, age=2, fault="socket_reset", bit_identical=True),
            RunSummary("none", ref, age=None),
        ]
    )
    assert [r["strategy"] for r in rows] == ["accelpact", "cold_restart", "none"]  # by age, None last
    assert all(list(r) == list(TABLE_COLUMNS) for r in rows)
    by = {r["strategy"]: r for r in rows}
    # AccelPact's gain over cold restart = (1000 / 10.511) / (1000 / 20.5) = 20.5 / 10.511 = 1.950x
    assert by["cold_restart"]["accelpact_gain"] == approx(20.5 / 10.511)
    assert by["accelpact"]["accelpact_gain"] == approx(1.0)
    assert by["cold_restart"]["ratio_to_reference"] == approx(10 / 20.5)
    assert by["cold_restart"]["restart_s"] == approx(7.0)
    assert by["cold_restart"]["bit_identical"] is False and by["accelpact"]["bit_identical"] is True
    text = format_table(rows)
    assert text.splitlines()[0].split()[:3] == ["strategy", "age", "fault"]
    assert "cold_restart" in text and "yes" in text and "no" in text


def test_table_matches_reference_and_accelpact_by_age():
    def flat(wall):  # one 100-token step lasting `wall` seconds
        return compute_goodput([step(0, 0, 0.0, wall)])

    rows = comparison_table(
        [
            RunSummary("none", flat(1.0), age=5),
            RunSummary("none", flat(2.0), age=18),
            RunSummary("accelpact", flat(4.0), age=18, fault="socket_reset"),
            RunSummary("accelpact", flat(1.25), age=5, fault="socket_reset"),
            RunSummary("cold_restart", flat(8.0), age=18, fault="socket_reset"),
        ]
    )
    cold = next(r for r in rows if r["strategy"] == "cold_restart")
    assert cold["ratio_to_reference"] == approx(2.0 / 8.0)  # the age-18 reference, not the age-5 one
    assert cold["accelpact_gain"] == approx(8.0 / 4.0)  # the age-18 accelpact run
    alone = comparison_table([RunSummary("cold_restart", flat(8.0), age=5)])
    assert math.isnan(alone[0]["ratio_to_reference"]) and math.isnan(alone[0]["accelpact_gain"])
    assert "-" in format_table(alone)


def test_fallback_is_reported():
    ev = cold_restart_events() + [{"kind": "fallback", "t": 9.0, "rank": 0, "reason": "rank 1 lost"}]
    rep = compute_goodput(ev)
    assert rep.fallbacks == ("rank 1 lost",)
    row = comparison_table([RunSummary("accelpact", rep, age=2, fault="kill")])[0]
    assert row["fallback"] == "rank 1 lost"


# ---- edge cases -----------------------------------------------------------------------------------
def test_no_steps():
    rep = compute_goodput([fault(1.0)])
    assert rep.timeline.wall_s == 0 and rep.tokens == 0 and rep.goodput == 0.0 and rep.n_ranks == 0
    assert len(rep.faults) == 1  # the fault is still listed
    check_invariant(rep)
    assert compute_goodput([]).goodput == 0.0


def test_single_step():
    rep = compute_goodput([step(3, 0, 5.0, 5.25, tokens=10)])
    assert rep.timeline == Timeline(5.0, 5.25)
    assert rep.goodput == approx(10 / 0.25) and rep.useful_s == approx(0.25)
    assert rep.badput.total_s == approx(0.0)


def test_multi_rank_skew():
    # rank 0: [0, 1], [1, 2]; rank 1: [0.2, 1.1], [1.1, 2.3]  -> wall [0, 2.3]
    # rank 0 useful 2.0, other 0.3;  rank 1 useful 0.9 + 1.2 = 2.1, other 0.2  -> means 2.05 / 0.25
    rep = compute_goodput(
        [step(0, 0, 0.0, 1.0), step(0, 1, 1.0, 2.0), step(1, 0, 0.2, 1.1, tokens=7), step(1, 1, 1.1, 2.3, tokens=7)]
    )
    assert rep.timeline.wall_s == approx(2.3)
    assert rep.tokens == 100 + 100 + 7 + 7
    assert rep.useful_s == approx(2.05) and rep.badput.other_s == approx(0.25)
    check_invariant(rep)


def test_torn_and_unsorted_events():
    clean = compute_goodput(cold_restart_events())
    noisy = cold_restart_events()
    random.Random(0).shuffle(noisy)
    torn = [
        {"kind": "step", "rank": 0, "step": 3, "t_start": 2.0},  # no t_end: torn write
        {"kind": "step", "rank": 0, "step": 3, "t_start": 4.0, "t_end": 3.0, "tokens": 5},  # ends first
        {"kind": "step", "rank": 0, "step": 3, "t_start": 2.0, "t_end": 3.0, "tokens": "50"},
        {"kind": "restore", "rank": 0, "t_start": 1.0, "t_end": float("nan")},
        {"rank": 0, "t": 1.0},  # no kind
        {"kind": "telemetry", "rank": 0, "t": 1.0},  # someone else's kind: ignored, not skipped
    ]
    rep = compute_goodput(noisy[:5] + torn + noisy[5:])
    assert rep.skipped == 5
    assert rep.badput == clean.badput and rep.tokens == clean.tokens and rep.timeline == clean.timeline


def test_fault_records_from_several_writers_merge():
    # socket_reset injected on both ranks: each logs the same fault -> one fault
    one = compute_goodput([step(0, 0, 0.0, 1.0), fault(0.5, writer=0, ranks=(0,)), fault(0.5004, writer=1, ranks=(1,))])
    assert len(one.faults) == 1 and one.faults[0].ranks == (0, 1) and one.faults[0].t == 0.5
    # the same writer logging the same (kind, step, phase) again is a second fault
    two = compute_goodput([step(0, 0, 0.0, 1.0), fault(0.5, writer=0), fault(0.7, writer=0)])
    assert len(two.faults) == 2


def test_check_invariant_can_fail():
    bad = GoodputReport(
        timeline=Timeline(0.0, 10.0), tokens=1, steps=1, n_ranks=1, useful_s=9.0, badput=Badput(other_s=0.5)
    )
    with pytest.raises(AssertionError, match="!= wall"):
        check_invariant(bad)
    with pytest.raises(AssertionError, match="negative"):
        check_invariant(GoodputReport(Timeline(0.0, 1.0), 1, 1, 1, 1.5, Badput(other_s=-0.5)))


def test_load_report_reads_a_run_dir(tmp_path):
    events_dir = tmp_path / "events"
    events_dir.mkdir()
    by_rank: dict[int, list] = {}
    for e in checkpoint_restore_events():
        e.setdefault("t", e.get("t_end", 0.0))
        by_rank.setdefault(e["rank"], []).append(e)
    for r, recs in by_rank.items():
        name = "parent.jsonl" if r < 0 else f"rank{r}.jsonl"
        (events_dir / name).write_text("".join(json.dumps(x) + "\n" for x in recs) + '{"kind": "st')
    assert load_report(str(tmp_path)) == compute_goodput(checkpoint_restore_events())


# ---- the invariant over random timelines ------------------------------------------------------------
_interval = st.tuples(st.floats(0, 50, allow_nan=False), st.floats(0, 5, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6), _interval, st.integers(0, 1)), max_size=25),
    extras=st.lists(
        st.tuples(st.sampled_from(["restore", "checkpoint", "restart", "recovery"]), st.integers(0, 2), _interval),
        max_size=10,
    ),
    fault_times=st.lists(st.floats(0, 55, allow_nan=False), max_size=3),
)
def test_parts_always_sum_to_wall(steps, extras, fault_times):
    ev = [step(r, i, a, a + d, incarnation=inc) for r, i, (a, d), inc in steps]
    for kind, r, (a, d) in extras:
        if kind == "restore":
            ev.append(restore(r, a, a + d, 0))
        elif kind == "checkpoint":
            ev.append(checkpoint(r, 0, a, a + d))
        elif kind == "restart":
            ev.append(restart(r, a, a + d, 1))
        else:
            ev.append(recovery(r, a + d, d / 4, d / 4, d / 4, d / 8, d / 8))
    ev += [fault(t, writer=k) for k, t in enumerate(fault_times)]
    rep = compute_goodput(ev)
    check_invariant(rep, tol=1e-7)
    # what the faults are charged never exceeds the run total, label by label
    for name, total in rep.badput.as_dict().items():
        assert sum(f.badput.as_dict()[name] for f in rep.faults) <= total + 1e-7
