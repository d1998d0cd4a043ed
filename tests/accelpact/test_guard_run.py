"""guard.run: a socket reset inside the user's own collectives (an evaluation between steps) is recovered in memory.

One 2-rank session (real gloo, real socket resets from accelpact.testing.FaultInjector) runs a plain-loop
reference and the same loop under a guard, each step followed by an evaluation whose loss is all-reduced
(``tests/accelpact/_region_runners.py``). Rank 1 resets its own gloo connections right before the
evaluation's all-reduce: both ranks' all-reduce fails, one recovery round builds the next generation, and
``guard.run`` runs the evaluation again on both. Every parameter, optimizer shard, step loss and evaluation
loss then equals the reference's. Without ``guard.run`` the all-reduce's gloo error ends the loop.
"""

from __future__ import annotations

import pytest

from accelpact.testing.compare import differences
from accelpact.testing.session import run_session

RUNNER = "tests.accelpact._region_runners:run"
STEPS = 3
SCENARIOS = [
    {"name": "ref", "guard": False, "steps": STEPS},
    {"name": "eval_reset", "steps": STEPS, "faults": [{"step": 1, "phase": "eval", "ranks": [1]}]},
]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    # A bound for a hang only (a quiet host runs it in seconds; 3.5 min per scenario was seen at load 25).
    s = run_session(tmp_path_factory.mktemp("guard_run"), RUNNER, SCENARIOS, world_size=2, timeout_s=840)
    assert s.returncodes == [0, 0], f"rank processes failed: {s.returncodes}\n" + "\n".join(s.logs)
    return s


@pytest.mark.timeout(900)
def test_a_reset_inside_guard_run_recovers_and_runs_the_evaluation_again(session):
    assert differences(session, "eval_reset") == []
    ref = session.job("ref")
    got = session.job("eval_reset")
    for rank in range(2):
        assert got[rank]["losses"] == ref[rank]["losses"]
        assert got[rank]["evals"] == ref[rank]["evals"]  # the re-run evaluation, bit for bit
        assert got[rank]["eval_runs"] == STEPS + 1, got[rank]  # once more, on both ranks
        [event] = got[rank]["events"]  # exactly one recovery, a retry of the region
        assert event["decision"]["action"] == "retry" and event["step"] == 2, event
        assert got[rank]["finished"] is True
    assert [f["phase"] for r in range(2) for f in got[r]["fired"]] == ["eval"]
