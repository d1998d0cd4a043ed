"""Tests of ``strategy=gemini`` (harness.strategies.gemini): GEMINI in-memory checkpoints via lm-resiliency 0.2.0.

Fast: validation (ranks pair with a neighbour: an odd world is refused, naming the fix). Slow (a whole
harness run, real gloo ranks): a SIGKILLed rank; the survivor writes its copy and its peer's replica, every
rank restarts and resumes from the newest capture instead of step 0.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from harness_test_helpers import TINY, read_row, run_harness

pytest.importorskip("lm_resiliency")


def test_an_odd_world_is_refused_with_the_fix():
    from harness.app.validate import ConfigError
    from harness.strategies.gemini import check_runnable

    check_runnable(SimpleNamespace(cluster=SimpleNamespace(world_size=2)))
    with pytest.raises(ConfigError, match="cluster.world_size=4"):
        check_runnable(SimpleNamespace(cluster=SimpleNamespace(world_size=3)))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # whole harness runs; a start alone took minutes on the loaded 2-core machine
def test_a_killed_rank_resumes_from_the_in_memory_capture(tmp_path):
    run_dir = tmp_path / "run"
    res = run_harness(
        ["strategy=gemini", *TINY, "train.steps=12", "fault=kill", "fault.at_step=6", f"hydra.run.dir={run_dir}"],
        tmp_path,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["ranks_agree"] and row["relaunches"] == 1
    # resumed from a capture at most a step or two old, never from step 0
    assert 0 <= row["replayed_steps"] <= 2 * 2, row["replayed_steps"]
