"""A two-round in-memory recovery through ``python -m harness`` (``fault=nested_reset``): every second
of it is attributed to the part it was spent in, on every round, and nothing of it lands in replay.

``nested_reset`` resets rank 1's sockets during backward, then again inside the recovery that starts
(new generation built, before its first collective), so the first round fails at its first
collective and a second round follows. The commit rule decides "retry": the attempt in flight, from
the step's start to the injection, is thrown away and re-run, and goodput labels exactly that
stretch replay (``harness/report/goodput.py``); a roll-forward recovery throws nothing away, and
``tests/harness/test_goodput.py::test_accelpact_roll_forward_loses_no_work`` checks its replay is 0.
"""

from __future__ import annotations

import json

import pytest
from harness_test_helpers import TINY, read_row, run_harness

from harness.events import read_events

FAULT_STEP = 3
PARTS = ("agreement", "rebuild", "rebind", "first_collective")


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); nested rounds stay covered by test_recovery_fsdp2
def test_two_round_recovery_is_attributed_part_by_part(tmp_path):
    run_dir = tmp_path / "nested"
    done = run_harness(
        [
            *TINY,
            "train.steps=6",
            "strategy=accelpact",
            "fault=nested_reset",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            "fault.phase=backward_reduce_scatter",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["recoveries"] == 1 and row["relaunches"] == 0, row
    assert row["replayed_steps"] == 0 and row["fallback"] is False
    events = read_events(run_dir)
    [fault] = [e for e in events if e["kind"] == "fault"]
    recs = sorted((e for e in events if e["kind"] == "recovery"), key=lambda e: e["rank"])
    assert [e["rank"] for e in recs] == [0, 1]
    step_start = {e["rank"]: e["t_start"] for e in events if e["kind"] == "step" and e["step"] == FAULT_STEP}
    for e in recs:
        assert e["rounds"] == 2 and len(e["round_times"]) == 2, e
        # The first round is charged up to its failure: each part it reached is non-zero, the parts
        # after it are zero. Rank 1 reset its sockets after its rebind, so it reached every part; its
        # peer may fail earlier, in its rebuild.
        first = [e["round_times"][0][p] for p in PARTS]
        reached = sum(1 for x in first if x > 0)
        assert reached >= (4 if e["rank"] == 1 else 2) and all(x == 0 for x in first[reached:]), e["round_times"]
        assert all(e["round_times"][1][p] > 0 for p in ("agreement", "rebuild", "first_collective")), e
        for p in PARTS:  # the event's parts are the sums over its rounds
            assert abs(e[f"{p}_s"] - sum(r[p] for r in e["round_times"])) < 1e-9
        # Detection counts from the injection (rank 1's), on the peer too; the rounds then cover
        # caught -> ready without a gap.
        assert e["detection_from"] == "injection" and abs(e["t_detected"] - e["detection_s"] - fault["t_inject"]) < 1e-6
        assert abs(sum(e[f"{p}_s"] for p in PARTS) - e["total_s"]) < 1e-3, e

    goodput = json.loads((run_dir / "goodput.json").read_text())
    [charged] = goodput["faults"]
    b = charged["badput"]
    for part in ("detection", "agreement", "rebuild", "rebind"):
        assert b[f"{part}_s"] > 0, b
        assert abs(row[f"badput_{part}_s"] - b[f"{part}_s"]) < 1e-9
    # Every second from the injection to the end of recovery, averaged over ranks, is in a recovery part.
    recovery = sum(b[f"{p}_s"] for p in ("detection", "agreement", "rebuild", "rebind"))
    spent = sum(e["t"] - fault["t_inject"] for e in recs) / len(recs)
    assert abs(recovery - spent) < 2e-3, (recovery, spent)
    # Replay is the attempt thrown away by the retry (step start -> injection) and nothing more.
    thrown_away = sum(fault["t_inject"] - step_start[r] for r in (0, 1)) / 2
    assert abs(b["replay_s"] - thrown_away) < 2e-3, (b["replay_s"], thrown_away)
    assert abs(row["badput_replay_s"] - thrown_away) < 2e-3, (row["badput_replay_s"], thrown_away)
    assert b["other_s"] < 0.05 and b["restart_s"] == 0 and b["restore_s"] == 0, b
