"""A rank killed OUTSIDE the step heals in memory, bit-identically, in a full loop: LR warm-up, evaluation, saves.

The loop (``harness.rank.train.run_loop`` under ``strategy=accelpact``) is the one docs/process_loss.md shows a
user: an LR scheduler stepped after each committed step and saved in the snapshots' ``extra_state``, a
checkpoint save and an evaluation (a held-out loss, all-reduced) between steps, each under ``guard.run``, and
``guard.finish()`` after the last step. Real processes, real SIGKILL (the parent's), gloo. Each run is compared
with one fault-free reference of the same loop (``strategy=none``): every parameter and optimizer shard on every
rank, every step's loss and every evaluation's loss (their final executions). Nothing is relaunched and no
checkpoint is read.

Each test fails without its part of the feature: without ``guard.finish`` the survivor of a kill after the last
vote ends the run while the replacement waits for a plan (a fallback, or no identity for the lost rank);
without ``guard.run`` the evaluation's all-reduce and the save's collectives raise gloo's bare error (the run
fails); without ``extra_state`` on the replacement (``guard.resumed``) its LR schedule restarts at 0 and the
parameters differ after the heal; without the roll call the second death is found by gloo's rendezvous at its
timeout and the heal falls back to disk.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from harness_test_helpers import TINY, read_row, run_harness, worker_processes
from test_heal import _check_heal, _losses

from harness.events import read_events
from harness.identity import compare_runs

STEPS = 8
# Saves and evaluations after steps 2 and 5 (none after 7: a kill after the last vote meets guard.finish);
# a 10-step warm-up, so the learning rate changes at every step of the run.
LOOP = [
    *TINY,
    f"train.steps={STEPS}",
    "checkpoint=sync",
    "checkpoint.interval=3",
    "train.eval_every=3",
    "train.warmup_steps=10",
]


@pytest.fixture(scope="module")
def loop_reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heal_loop")
    runs: dict[int, Path] = {}

    def get(world_size: int = 2) -> Path:
        if world_size not in runs:
            run_dir = tmp / f"reference{world_size}"
            done = run_harness(
                [*LOOP, f"cluster.world_size={world_size}", f"hydra.run.dir={run_dir}"], tmp, timeout=900
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            runs[world_size] = run_dir
        return runs[world_size]

    return tmp, get


@contextmanager
def _env(extra: dict[str, str] | None):
    old = {k: os.environ.get(k) for k in extra or {}}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _evals(run_dir: Path) -> dict[tuple[int, int], float]:
    """(rank, step) -> the loss of the evaluation after that step (its last execution)."""
    final: dict[tuple[int, int], tuple[float, float]] = {}
    for e in read_events(run_dir):
        if e["kind"] == "eval":
            key = (e["rank"], e["step"])
            if key not in final or e["t"] > final[key][0]:
                final[key] = (e["t"], e["loss"])
    return {k: v for k, (_, v) in final.items()}


def _heal_loop(
    reference,
    name: str,
    at_step: int,
    phase: str,
    *,
    ranks: str = "[1]",
    world_size: int = 2,
    env_extra: dict[str, str] | None = None,
) -> tuple[dict, list[dict]]:
    tmp, get_ref = reference
    ref_dir = get_ref(world_size)
    run_dir = tmp / name
    args = [
        *LOOP,
        f"cluster.world_size={world_size}",
        "strategy=accelpact_heal",
        "fault=kill",
        f"fault.at_step={at_step}",
        f"fault.phase={phase}",
        f"fault.ranks={ranks}",
        f"hydra.run.dir={run_dir}",
    ]
    with _env(env_extra):
        done = run_harness(args, tmp, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row, events = read_row(run_dir), read_events(run_dir)
    assert row["status"] == "ok", row["reason"]
    assert row["relaunches"] == 0 and row["fallback"] is False, row["fallback_reason"]
    assert not [e for e in events if e["kind"] == "restore"]  # no checkpoint read
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()
    assert _losses(run_dir) == _losses(ref_dir)
    assert _evals(run_dir) == _evals(ref_dir) and _evals(ref_dir), (_evals(run_dir), _evals(ref_dir))
    assert worker_processes(str(tmp)) == []
    return row, events


def _survivor(last: list[dict]) -> dict:
    return next(e for e in last if e["role"] == "survivor")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_rank_killed_after_the_last_steps_vote_heals_in_finish(loop_reference):
    # post_vote of the last step: the survivor commits step 7 and reaches guard.finish(), whose vote finds the
    # loss; everyone re-runs step 7 (the dead rank never committed it) and agrees the end again.
    row, events = _heal_loop(loop_reference, "after_last_vote", STEPS - 1, "post_vote")
    last = _check_heal(row, events, lost=[1])
    survivor = _survivor(last)
    assert (survivor["resume_step"], survivor["replayed_steps"]) == (STEPS - 1, 1), survivor


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["eval", "checkpoint_save"])
@pytest.mark.timeout(1800)
def test_a_rank_killed_inside_the_loops_own_collectives_heals(loop_reference, phase):
    # Killed after step 5 committed, inside the evaluation's (or the save's) collectives: the survivor's
    # guard.run heals it and raises RolledBack; every rank re-runs step 5, the save and the evaluation.
    row, events = _heal_loop(loop_reference, f"kill_in_{phase}", 5, phase)
    last = _check_heal(row, events, lost=[1])
    survivor = _survivor(last)
    assert (survivor["resume_step"], survivor["replayed_steps"], survivor["own_source"]) == (5, 1, "own"), survivor
    saves = sorted(e["step"] for e in events if e["kind"] == "checkpoint" and e["rank"] == 0)
    assert saves.count(5) == (2 if phase == "eval" else 1) and 2 in saves, saves


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_replacement_resumes_the_lr_schedule_from_extra_state(loop_reference):
    # The replacement resumes at step 4 from the dead rank's slot of step 3, and its scheduler from that
    # slot's extra_state (guard.resumed); the survivor, which committed step 4, rolls back through RolledBack.
    row, events = _heal_loop(loop_reference, "lr_schedule", 4, "post_vote")
    last = _check_heal(row, events, lost=[1])
    assert {e["resume_step"] for e in last} == {4}


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_second_death_after_the_recheck_is_found_by_the_roll_call(loop_reference):
    from harness.rank.strategies.heal import DIE_AT_HEAL_PLAN

    # Rank 1 is killed at step 5's vote; survivor rank 2 dies once every replacement arrived, after the
    # survivors' recheck of notices (the guard's heal_plan phase). Rank 0's roll call sees rank 2's notice
    # before any plan is written: one more round heals both, with no rendezvous timeout (the PG timeout,
    # 120 s here) and no fallback to disk.
    row, events = _heal_loop(loop_reference, "roll_call", 5, "vote", world_size=3, env_extra={DIE_AT_HEAL_PLAN: "2"})
    replacements = [e for e in events if e["kind"] == "replacement"]
    assert sorted(e["for_rank"] for e in replacements) == [1, 2], replacements
    last = _check_heal(row, events, lost=[1, 2], world_size=3, heals=row["heals"])
    survivor = _survivor(last)
    assert survivor["rounds"] >= 2 and survivor["total_s"] < 120, survivor
