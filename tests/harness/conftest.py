"""Real harness runs that several test files read, started once per session instead of once per file.

Each ``python -m harness`` run costs a parent, its rank processes (torch and transformers imported in
each) and any relaunch: on the 2-core CI host that start-up, not the training, is most of a harness
test's time. A run that two files check from different sides is made here once; each file keeps its
own assertions.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness_test_helpers import run_harness


@dataclass(frozen=True)
class KillFallbackRun:
    """``fault=kill`` of rank 1 under strategy=accelpact with snapshots off: the survivor falls back to
    checkpoint restore and the parent relaunches every rank from the newest checkpoint."""

    tmp: Path  # the run's cwd: leftover processes are looked for by this path
    run_dir: Path
    done: subprocess.CompletedProcess[str]
    steps: int
    interval: int
    fault_step: int


@pytest.fixture(scope="session")
def kill_fallback_run(tmp_path_factory) -> KillFallbackRun:
    """Read by test_strategies (the fallback, its row, replay, bit-identity, the progress lines) and by
    test_detection_live (the survivor learns of the death from the parent's notice, within its bound)."""
    tmp = tmp_path_factory.mktemp("kill_fallback")
    run_dir = tmp / "kill"
    steps, interval, fault_step = 10, 4, 6  # a checkpoint after step 3; the kill during step 6
    # Progress on, a line per step: test_strategies checks that a relaunch prints no step twice that it
    # does not replay. recovery_deadline_s=5: a survivor that missed the notice would fall back at the
    # deadline, 5 s after the kill, well past test_detection_live's 2 s bound, instead of 60 s later.
    done = run_harness(
        [
            "experiment=smoke",
            "model.num_layers=2",
            "model.seq_len=32",
            "model.batch_size=2",
            "progress=true",
            "train.log_every=1",
            f"train.steps={steps}",
            "strategy=accelpact",
            "checkpoint=sync",
            f"checkpoint.interval={interval}",
            "fault=kill",
            "fault.ranks=[1]",
            f"fault.at_step={fault_step}",
            "fault.phase=backward_reduce_scatter",
            "strategy.recovery_deadline_s=5",
            "strategy.snapshot.every=0",  # no snapshots: the kill cannot heal in memory
            f"hydra.run.dir={run_dir}",
        ],
        tmp,
        timeout=400,
    )
    return KillFallbackRun(tmp, run_dir, done, steps, interval, fault_step)
