"""A loop that ignores ``RolledBack`` is named at its next vote: ``StateDivergedError`` naming both ranks' positions.

examples/heal_loop.py under ``accelpact-run`` on 2 ranks, rank 1 SIGKILLed in the checkpoint save after step 3
and healed; the survivor's loop ignores the ``RolledBack`` (``--ignore-rolled-back``: it goes on with step 4
while the guard and the replacement replay step 3). Both ranks must stop at the vote of that very step, each
naming both positions, and no rank may commit step 3 twice or reach the end of the run. Before the vote
carried positions, the two ranks trained on a step apart and the run hung at its end until killed.
The pure rule: test_positions_unit.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_a_loop_that_ignores_rolled_back_raises_state_diverged_at_the_next_vote(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        "2",
        "--rdzv-id",
        f"div{os.getpid()}",
        "--log-dir",
        str(tmp_path / "logs"),
        "--snapshot-root",
        str(tmp_path / "shm"),
        str(ROOT / "examples" / "heal_loop.py"),
        "--steps",
        "8",
        "--every",
        "4",
        "--kill-at",
        "3",
        "--kill-in",
        "save",
        "--ignore-rolled-back",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    agent = p.stdout + p.stderr
    assert p.returncode == 1 and "replacement 1 started" in agent, agent[-3000:]
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert "StateDivergedError: the ranks' loops diverged" in log, log[-3000:]
        assert "rank 0: in guard.step of step 3, the loop at step 4" in log, log[-3000:]
        assert "rank 1: in guard.step of step 3, the loop at step 3" in log, log[-3000:]
        assert "RESULT" not in log  # no rank reached the end of the run
