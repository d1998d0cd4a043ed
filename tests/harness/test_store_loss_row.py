"""The control store's host dies at a fault under ``strategy=accelpact`` (``fault=control_store_loss``):
the parent SIGKILLs the child process hosting the store, rank 1 then resets its own gloo connections.
With no store to agree on, every rank stops with ControlStoreLostError (naming the store and its last
committed step), the harness falls back to checkpoint restore on a fresh store, the run still ends
bit-identical to the fault-free reference, and the results row says why it fell back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_test_helpers import TINY, read_row, run_harness, worker_processes

from harness.events import read_events
from harness.identity import compare_runs
from harness.parent.launcher import LOG_DIR

STEPS, INTERVAL, FAULT_STEP = 8, 4, 5  # checkpoint after step 3; the fault during step 5


@pytest.mark.slow  # a reference and a faulted run with a relaunch: ~3 min on the loaded 2-core host
def test_control_store_lost_at_a_fault_falls_back_to_checkpoint_restore(tmp_path: Path):
    common = [*TINY, f"train.steps={STEPS}", "checkpoint=sync", f"checkpoint.interval={INTERVAL}"]
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "lost"
    ref = run_harness([*common, "strategy=none", "fault=none", f"hydra.run.dir={ref_dir}"], tmp_path, timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    done = run_harness(
        [
            *common,
            "strategy=accelpact",
            "fault=control_store_loss",
            f"fault.at_step={FAULT_STEP}",
            "strategy.recovery_deadline_s=5",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["fallback"] is True and row["relaunches"] == 1, row
    assert "ControlStoreLostError" in row["fallback_reason"] and "control store at" in row["fallback_reason"], row
    assert f"last committed step is {FAULT_STEP - 1}" in row["fallback_reason"], row["fallback_reason"]
    events = read_events(run_dir)
    [fault] = [e for e in events if e["kind"] == "fault"]
    assert fault["fault"] == "control_store_loss" and fault["step"] == FAULT_STEP and fault.get("control_store")
    fallbacks = [e for e in events if e["kind"] == "fallback"]
    assert fallbacks and all(e["error"] == "ControlStoreLostError" and e["step"] == FAULT_STEP for e in fallbacks)
    assert {e["from_step"] for e in events if e["kind"] == "restore"} == {INTERVAL - 1}
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()
    assert worker_processes(str(tmp_path)) == []
    # Each rank said it in one line: no c10d C++ backtraces from the dead store's client (launcher env).
    logs = "".join(p.read_text(errors="replace") for p in (run_dir / LOG_DIR).rglob("*") if p.is_file())
    assert "ControlStoreLostError" in logs and "frame #" not in logs and "Exception raised from" not in logs, logs[
        -3000:
    ]
