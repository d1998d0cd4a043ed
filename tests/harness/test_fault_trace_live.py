"""fault=mixed end to end: a real run injects every fault of its trace with the event's own kind, step and
rank, and the parent sets up what the union of those kinds needs (namespaces for host_loss, a replacement
template for the kill). Real processes and real faults; slow, and it needs network namespaces (root)."""

from __future__ import annotations

import pytest
from harness_test_helpers import read_row, run_harness

from harness.fleet.trace import draw_trace

pytestmark = [pytest.mark.slow, pytest.mark.netns]

# Seed 13 over 30 steps with 2 faults expected: a kill of rank 0 at step 8, the host of rank 1 lost at step 27.
SEED, STEPS, FAULTS = 13, 30, 2


def test_a_mixed_trace_fires_each_event_with_its_own_kind_step_and_rank(tmp_path):
    from harness import events as ev
    from harness.faults.netns import namespaces_available

    ok, why = namespaces_available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {why}")
    trace = draw_trace("llama3", steps=STEPS, faults=FAULTS, seed=SEED, world_size=2)
    assert {e.kind for e in trace.events} == {"kill", "host_loss"}
    run_dir = tmp_path / "run"
    done = run_harness(
        [
            "experiment=mixed_faults",
            "strategy=accelpact_heal",
            f"train.steps={STEPS}",
            f"fault.trace_faults={FAULTS}",
            f"fault.seed={SEED}",
            "progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok" and row["fault"] == "mixed"
    fired = sorted({(f.step, f.fault, f.ranks) for f in ev.of_type(ev.typed(ev.load_events(run_dir)), ev.Fault)})
    assert fired == [(e.step, e.kind, (e.rank,)) for e in trace.events]
    assert row["heals"] >= 1  # the kill was healed in memory from a replacement
