"""Detection is timed from the fault's injection on every rank, not from each rank's own attempt start.

A peer of the faulted rank injected nothing itself. Its ``detection_s`` used to count from its own
step attempt's start, which measured where in the step the fault fell (the 135-231 ms once quoted for
peers), not how late the peer noticed. The faulted rank's injection wall time now travels in its
consensus report, so every rank's RecoveryEvent counts from the earliest injection of the round.
"""

from __future__ import annotations

import pytest

from accelpact.detection.start import detection_origin
from accelpact.recovery.consensus import Phase, RankReport
from accelpact.testing.session import run_session

RUNNER = "experiments.workloads.fsdp_scenarios:run"


def test_origin_is_the_earliest_injection_reported_else_the_attempt_start():
    def rep(rank: int, injected: float | None) -> RankReport:
        return RankReport(rank, 3, 2, Phase.BEFORE_VOTE, injected_at=injected)

    assert detection_origin([rep(0, None), rep(1, None)], 100.0) == (100.0, "attempt_start")
    assert detection_origin([rep(0, None), rep(1, 101.5)], 100.0) == (101.5, "injection")
    assert detection_origin([rep(0, 102.0), rep(1, 101.5)], 100.0) == (101.5, "injection")


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); detection attribution; benchmarks/bench_detection measures it
def test_every_rank_times_detection_from_the_faulted_ranks_injection(tmp_path):
    # Step 1: a reset on rank 1 during backward. Step 3: a reset on rank 0 after its vote, with no
    # collective in flight: every rank, rank 0 included, meets it at step 4's first collective.
    scenarios = [
        {
            "name": "origin",
            "steps": 6,
            "save_state": False,
            "model": {"layers": 2},
            "faults": [
                {"step": 1, "phase": "backward_reduce_scatter", "ranks": [1]},
                {"step": 3, "phase": "post_vote", "ranks": [0]},
            ],
        }
    ]
    s = run_session(tmp_path, RUNNER, scenarios, world_size=2, timeout_s=240)
    assert s.returncodes == [0, 0], "\n".join(s.logs)
    res = [s.result("origin", r) for r in (0, 1)]
    fired = {f["step"]: f["at"] for r in res for f in r["fired"]}
    assert sorted(fired) == [1, 3], res[0]["fired"] + res[1]["fired"]
    for r in res:
        assert r["error"] is None, r["error"]
        by_fault = {1: [e for e in r["events"] if e["step"] == 1], 3: [e for e in r["events"] if e["step"] in (3, 4)]}
        for step, evs in by_fault.items():
            assert len(evs) == 1, r["events"]
            ev = evs[0]
            assert ev["detection_from"] == "injection", ev
            # The contract: caught minus the faulted rank's injection (one host, one wall clock).
            assert abs(ev["detection_s"] - (ev["t_detected"] - fired[step])) < 1e-6, (ev, fired)
            assert ev["detection_s"] > 0, ev
            assert {x.get("injected_at") is not None for x in ev["reports"]} == {True, False}, ev["reports"]
