"""Every strategy recovers from a real fault and ends bit-identical to the fault-free reference.

One comparison (``python -m harness``, the default experiment, shrunk: 2 layers, 10 steps, a checkpoint
every 4 steps, a socket reset on rank 0 at checkpoint age 2, i.e. during step 6) runs the reference and
the three strategies; each run's row must say ok and bit-identical, with the recovery each strategy is
supposed to do (accelpact: in memory, nothing replayed; cold_restart: one relaunch, 2 steps replayed;
checkpoint_restore: NVRx restarted in the same processes, 2 steps replayed). Then ``kill`` under
accelpact with snapshots off must fall back to checkpoint restore, say so in its row, and still end
bit-identical (with snapshots on it heals in memory: tests/harness/test_heal.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from harness_test_helpers import read_row, run_harness, worker_processes

from harness.identity import compare_runs

SHRINK = [
    "model.num_layers=2",
    "model.seq_len=32",
    "model.batch_size=2",
    "progress=false",
    "train.steps=10",
    "checkpoint.interval=4",
    "compare.trials=1",
]
AGE = 2
FAULT_STEP = 4 - 1 + AGE + 1  # checkpoint after step 3, AGE steps committed since


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    run_dir = tmp / "cmp"
    done = run_harness([*SHRINK, f"fault.at_age={AGE}", f"hydra.sweep.dir={run_dir}"], tmp, timeout=600)
    return tmp, run_dir, done


def _events(run_dir: Path) -> list[dict]:
    from harness.events import read_events

    return read_events(run_dir)


def test_comparison_prints_and_writes_the_table(comparison):
    tmp, run_dir, done = comparison
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "gain_ci" in done.stdout and "verdict" in done.stdout and "bit_identical" in done.stdout  # the trials table
    table = pd.read_csv(run_dir / "table.csv")
    assert set(table["strategy"]) == {"none (reference)", "accelpact", "cold_restart", "checkpoint_restore"}
    assert (table["status"] == "ok").all()
    for name in ("table.md", "goodput_vs_age.png", "timeline.png", "recovery_breakdown.png"):
        assert (run_dir / name).stat().st_size > 100, name
    assert worker_processes(str(tmp)) == []


@pytest.mark.parametrize("strategy", ["accelpact", "cold_restart", "checkpoint_restore"])
def test_strategy_recovers_from_a_socket_reset_bit_identically(comparison, strategy):
    _, run_dir, done = comparison
    sub = run_dir / f"{strategy}_age{AGE}"
    row = read_row(sub)
    assert row["status"] == "ok", row["reason"]
    assert row["faults"] == 1 and row["age"] == AGE
    result = compare_runs(run_dir / "reference", sub)
    assert result.equal, result.describe()
    assert row["bit_identical"] is True
    events = _events(sub)
    [fault] = [e for e in events if e["kind"] == "fault"]
    assert (fault["fault"], fault["step"], fault["ranks"]) == ("socket_reset", FAULT_STEP, [0])
    restarts = [e for e in events if e["kind"] == "restart"]
    replays = sorted({e["step"] for e in events if e["kind"] == "step" and e["replay"]})
    if strategy == "accelpact":
        recoveries = [e for e in events if e["kind"] == "recovery"]
        assert {e["rank"] for e in recoveries} == {0, 1} and all(e["step"] == FAULT_STEP for e in recoveries)
        assert "Connection closed" in json.dumps(recoveries)  # the collective really broke
        assert row["replayed_steps"] == 0 and replays == [] and row["relaunches"] == 0
        assert not [e for e in events if e["kind"] == "restore"]
    else:
        # The newest checkpoint is step 3's: steps 4 .. FAULT_STEP-1 are replayed.
        assert replays == list(range(4, FAULT_STEP)) and row["replayed_steps"] == AGE
        restores = [e for e in events if e["kind"] == "restore"]
        assert {e["from_step"] for e in restores} == {3} and {e["rank"] for e in restores} == {0, 1}
        assert sorted(e["incarnation"] for e in restarts) == [0, 0, 1, 1]
    # The first launch forks from the preloaded template (outside every goodput); a timed relaunch never does.
    assert row["first_launch"] == "template"
    forked = (sub / "logs" / "rank0.log").read_text().count("rank forked from template")
    if strategy == "cold_restart":
        assert row["relaunches"] == 1 and row["badput_restart_s"] > 0
        assert forked == 1  # incarnation 1 is a fresh interpreter that imports torch, as a user's relaunch
    else:
        assert forked == 1
    if strategy == "checkpoint_restore":
        assert row["relaunches"] == 0  # NVRx restarted inside the same processes
        assert all(e.get("in_process") for e in restarts)
        assert [e for e in restarts if e["incarnation"] == 1][0].get("nvrx_restart_s", 0) > 0


def test_kill_under_accelpact_falls_back_to_checkpoint_restore(comparison, kill_fallback_run):
    _, cmp_dir, _ = comparison
    kill = kill_fallback_run  # the run is shared with test_detection_live (tests/harness/conftest.py)
    tmp, run_dir, done = kill.tmp, kill.run_dir, kill.done
    assert (kill.steps, kill.interval, kill.fault_step) == (10, 4, FAULT_STEP)  # the comparison's cadence
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["fallback"] is True and row["relaunches"] == 1
    assert "fallback to checkpoint restore" in row["fallback_reason"] and "RankLostError" in row["fallback_reason"]
    events = _events(run_dir)
    [fallback] = [e for e in events if e["kind"] == "fallback"]
    assert fallback["rank"] == 0 and fallback["step"] == FAULT_STEP
    assert fallback["detected_by"] == "notice" and row["detected_by"] == "notice"  # the parent's waitpid notice
    assert {e["from_step"] for e in events if e["kind"] == "restore"} == {3}
    assert row["replayed_steps"] == AGE
    printed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("step ")]
    assert printed.count("1/10") == 1 and printed.count("4/10") == 1, printed  # steps 0 and 3: not replayed
    assert printed.count(f"{FAULT_STEP}/10") == 2, printed  # step FAULT_STEP-1 ran, then was replayed
    result = compare_runs(cmp_dir / "reference", run_dir)
    assert result.equal, result.describe()
    assert worker_processes(str(tmp)) == []


@pytest.mark.slow
def test_kill_under_nvrx_relaunches_every_rank_on_a_fresh_store(comparison):
    """NVRx's in-process restart cannot bring back a killed process: the parent relaunches every rank (NVRx's
    in-job restart), each restores step 3's checkpoint, and the run ends bit-identical to the reference."""
    tmp, cmp_dir, _ = comparison
    run_dir = tmp / "nvrx_kill"
    done = run_harness(
        [
            "experiment=smoke",
            *SHRINK,
            "strategy=checkpoint_restore",
            "checkpoint=sync",
            "checkpoint.interval=4",
            "fault=kill",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            "fault.phase=backward_reduce_scatter",
            f"hydra.run.dir={run_dir}",
        ],
        tmp,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok", row["reason"]
    assert row["relaunches"] == 1 and "NVRx in-job restart: rank 1 was lost" in row["relaunch_reasons"]
    events = _events(run_dir)
    assert {e["from_step"] for e in events if e["kind"] == "restore"} == {3}
    assert {e["rank"] for e in events if e["kind"] == "restore"} == {0, 1}
    assert row["replayed_steps"] == AGE and row["badput_restart_s"] > 0
    result = compare_runs(cmp_dir / "reference", run_dir)
    assert result.equal, result.describe()
    assert worker_processes(str(tmp)) == []


@pytest.mark.slow
def test_accelpact_recovers_from_a_hang_past_the_pg_timeout(comparison):
    tmp, cmp_dir, _ = comparison
    run_dir = tmp / "hang"
    # Progress on, a line per step: after the relaunch each step before the checkpoint must not be
    # printed again (the parent once re-read rank 0's whole events file for every incarnation).
    shrink = [o for o in SHRINK if not o.startswith("progress=")] + ["progress=true", "train.log_every=1"]
    done = run_harness(
        [
            "experiment=smoke",
            *shrink,
            "strategy=accelpact",
            "checkpoint=sync",
            "checkpoint.interval=4",
            "fault=hang",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            "fault.phase=clip_allreduce",
            "cluster.pg_timeout_s=8",
            "fault.outage_s=11",
            f"hydra.run.dir={run_dir}",
        ],
        tmp,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["fallback"] is False and row["relaunches"] == 0
    recoveries = [e for e in _events(run_dir) if e["kind"] == "recovery"]
    assert "Timed out" in json.dumps(recoveries)
    assert compare_runs(cmp_dir / "reference", run_dir).equal


@pytest.mark.slow
def test_accelpact_recovers_from_a_real_blackhole_in_namespaces(comparison):
    from harness.faults.netns import namespaces_available

    ok, why = namespaces_available()
    if not ok:
        pytest.skip(why)
    tmp, cmp_dir, _ = comparison
    run_dir = tmp / "blackhole"
    # Progress on, a line per step: after the relaunch each step before the checkpoint must not be
    # printed again (the parent once re-read rank 0's whole events file for every incarnation).
    shrink = [o for o in SHRINK if not o.startswith("progress=")] + ["progress=true", "train.log_every=1"]
    done = run_harness(
        [
            "experiment=smoke",
            *shrink,
            "strategy=accelpact",
            "checkpoint=sync",
            "checkpoint.interval=4",
            "fault=blackhole",
            "fault.ranks=[1]",
            f"fault.at_step={FAULT_STEP}",
            "cluster.pg_timeout_s=8",
            "fault.outage_s=11",
            f"hydra.run.dir={run_dir}",
        ],
        tmp,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["relaunches"] == 0 and row["recoveries"] >= 1
    assert compare_runs(cmp_dir / "reference", run_dir).equal
