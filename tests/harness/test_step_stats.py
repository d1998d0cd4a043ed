"""harness.report.results.step_stats (pure): the row's step figures count every step some rank committed, so
a torchft run whose rank-0 replica group was lost and came back after the other group finished the run is
not reported as having done only the steps rank 0 ran before its loss."""

from __future__ import annotations

from harness.report.results import step_stats


def _step(rank: int, step: int, t: float, loss: float, replay: bool = False) -> dict:
    return {
        "kind": "step",
        "rank": rank,
        "t": t + 1.0,
        "step": step,
        "t_start": t,
        "t_end": t + 1.0,
        "loss": loss,
        "tokens": 64,
        "replay": replay,
    }


def test_steps_run_by_another_group_after_rank_0_was_lost_are_counted():
    # Rank 0 ran steps 0-3 and was lost; rank 1's group ran 0-9 alone (rank 0 rejoined after the end).
    events = [_step(0, s, float(s), 5.0 - s / 10) for s in range(4)]
    events += [_step(1, s, float(s), 6.0 - s / 10) for s in range(10)]
    got = step_stats(events, world_size=2)
    assert got["steps_done"] == 10
    assert got["final_loss"] == 6.0 - 9 / 10, "the loss is the rank that ran the most steps"
    assert got["tokens"] == 14 * 64 and got["train_s"] == 10.0 and got["steps_per_s"] == 1.0


def test_a_normal_run_reads_rank_0_and_counts_a_replayed_step_once():
    events = [_step(r, s, float(s), 5.0 + r) for r in (0, 1) for s in range(5)]
    events += [_step(r, 3, 5.0, 4.0 + r, replay=True) for r in (0, 1)]  # step 3 again after a rollback
    got = step_stats(events, world_size=2)
    assert got["steps_done"] == 5 and got["final_loss"] == 4.0
    assert got["step_time_median_s"] == 1.0 and got["steps_per_s"] == 6 / 6.0


def test_no_steps_gives_empty_figures():
    got = step_stats([], world_size=2)
    assert got["steps_done"] == 0 and got["final_loss"] is None and got["train_s"] is None
