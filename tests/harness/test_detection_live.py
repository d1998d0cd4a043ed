"""Fast detection in real harness runs: a SIGKILLed rank under strategy=accelpact is reported to the
survivor by the parent's death notice (waitpid), not at the recovery deadline, and the row says how."""

from __future__ import annotations

from harness.events import read_events
from harness_test_helpers import TINY, read_row, run_harness

NOTICE_BOUND_S = 2.0  # the bound with the harness parent (a loaded 2-core host included)


def test_kill_is_seen_through_the_parents_notice_within_bound(tmp_path):
    run_dir = tmp_path / "kill"
    # The default recovery deadline (60 s) stays: the survivor must not wait it out.
    done = run_harness([*TINY, "train.steps=8", "strategy=accelpact", "checkpoint=sync", "checkpoint.interval=4",
                        "fault=kill", "fault.ranks=[1]", "fault.at_step=5", "fault.phase=backward_reduce_scatter",
                        f"hydra.run.dir={run_dir}"], tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["fallback"] is True and row["relaunches"] == 1
    events = read_events(run_dir)
    [kill] = [e for e in events if e["kind"] == "fault"]
    [fallback] = [e for e in events if e["kind"] == "fallback"]
    assert fallback["rank"] == 0 and fallback["detected_by"] == "notice", fallback
    latency = fallback["t"] - kill["t"]
    assert 0 < latency <= NOTICE_BOUND_S, f"survivor fell back {latency:.2f} s after the SIGKILL"
    assert row["detected_by"] == "notice"
    assert 0 < row["detection_latency_s"] <= NOTICE_BOUND_S
