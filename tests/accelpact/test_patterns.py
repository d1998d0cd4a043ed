"""The README's training-loop patterns recover bit-identically: gradient accumulation, an LR scheduler,
mixed precision, activation checkpointing and HSDP, each with one real fault at a phase that pattern
changes, compared tensor by tensor (and by sha256) with its own fault-free run.

One 2-rank session runs every pattern (runner: tests/accelpact/_patterns.py), so the suite pays for
one start-up. HSDP with 2 ranks is a real 2D mesh (replicate=2 x shard=1: the replicate all-reduce
runs, nothing is sharded); the 4-rank mesh (2 x 2) is the slow test below.
"""

from __future__ import annotations

import pytest

from accelpact.testing.compare import bit_differences
from accelpact.testing.session import run_session

RUNNER = "tests.accelpact._patterns:run"
STEPS = 4
# Each pattern's fault sits where that pattern changes the step.
FAULTS = {
    "grad_accum": {"step": 2, "phase": "backward_reduce_scatter", "ranks": [1]},
    "lr_scheduler": {"step": 2, "phase": "post_vote", "action": "reset_raise", "ranks": [1]},  # roll forward
    "mixed_precision": {"step": 2, "phase": "forward_allgather_middle", "ranks": [0]},
    "activation_checkpointing": {"step": 2, "phase": "backward_reduce_scatter", "ranks": [0]},
    "hsdp": {"step": 2, "phase": "vote", "ranks": [1]},
}


def scenarios(patterns) -> list[dict]:
    out = []
    for p in patterns:
        out.append({"name": f"{p}_ref", "pattern": p, "steps": STEPS})
        out.append({"name": f"{p}_fault", "pattern": p, "steps": STEPS, "fault": FAULTS[p]})
    return out


def check(session, patterns) -> None:
    problems = []
    for p in patterns:
        for r in session.job(f"{p}_fault"):
            if r["events"] < 1 or r["committed_step"] != STEPS - 1:
                problems.append(
                    f"{p}: rank {r['rank'] if 'rank' in r else '?'} recovered {r['events']} faults, "
                    f"committed {r['committed_step']}"
                )
        diffs, counts = bit_differences(session, f"{p}_fault", f"{p}_ref")
        if counts["tensors"] < 50:
            problems.append(f"{p}: only {counts['tensors']} tensors compared")
        problems += [f"{p}: {d}" for d in diffs]
    assert not problems, "\n".join(problems)


def test_every_pattern_recovers_bit_identically(tmp_path):
    session = run_session(tmp_path, RUNNER, scenarios(FAULTS), world_size=2, barrier=True)
    check(session, FAULTS)
    assert session.job("lr_scheduler_fault")[0]["actions"] == ["roll_forward"]


@pytest.mark.slow
def test_hsdp_on_a_two_by_two_mesh_recovers_bit_identically(tmp_path):
    session = run_session(tmp_path, RUNNER, scenarios(["hsdp"]), world_size=4, barrier=True)
    check(session, ["hsdp"])
