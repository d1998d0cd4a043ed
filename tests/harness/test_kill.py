"""A rank killed mid-run: the parent tears everything down and writes a status=failed row naming it."""

from __future__ import annotations

import json
import signal
import time

import pandas as pd
import psutil
import pytest
from harness_test_helpers import TINY, read_row, start_harness, worker_processes


def _wait_for_step(events_file, step, proc, timeout=200):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if events_file.exists():
            for line in events_file.read_text().splitlines():
                try:
                    if json.loads(line).get("step", -1) >= step:
                        return
                except json.JSONDecodeError:
                    pass
        time.sleep(0.2)
    raise AssertionError("the run never reached the step")


def _rank_pid(run_dir, rank):
    """The rank's process, from its restart event: a rank forked from the template is not the parent's
    child, and its environ and command line are the template's."""
    pids = [
        e["pid"]
        for e in map(json.loads, (run_dir / "events" / f"rank{rank}.jsonl").read_text().splitlines())
        if e.get("kind") == "restart"
    ]
    assert pids, f"no restart event of rank {rank}"
    return pids[-1]


def test_sigkill_a_rank_leaves_failed_row_and_no_processes(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_harness([*TINY, "train.steps=500", f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        _wait_for_step(run_dir / "events" / "rank1.jsonl", 1, proc)
        psutil.Process(_rank_pid(run_dir, 1)).send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    row = read_row(run_dir)
    assert row["status"] == "failed"
    assert row["failed_rank"] == 1 and "rank 1" in row["reason"] and "SIGKILL" in row["reason"]
    assert 0 < row["steps_done"] < 500
    index = pd.read_csv(tmp_path / "index.csv")
    assert list(index["status"]) == ["failed"]
    assert "rank 1 exited with code -9 (SIGKILL)" in err
    assert worker_processes(str(tmp_path)) == []


@pytest.mark.slow
def test_ctrl_c_tears_down_every_rank(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_harness([*TINY, "train.steps=500", f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        _wait_for_step(run_dir / "events" / "rank0.jsonl", 1, proc)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    row = read_row(run_dir)
    assert row["status"] == "failed" and "interrupted" in row["reason"]
    assert worker_processes(str(tmp_path)) == []
