"""A rank SIGKILLed under a plain launch (no launcher notices): the survivor finds out by the heartbeat
rule (its connection dropped and the peer stopped beating), well before the control deadline."""

from __future__ import annotations

import json

from accelpact.testing.session import run_session

RUNNER = "tests.accelpact._detection_runners:die"
CONTROL_DEADLINE_S = 60.0  # the backstop; the test fails if the survivor waited it out
BOUND_S = 5.0  # the bound for a plain launch (2 s of missed beats + a loaded 2-core host)


def test_killed_rank_is_reported_by_heartbeat_within_bound(tmp_path):
    scenarios = [{"name": "die", "steps": 5, "victim": 1, "at_step": 2}]
    s = run_session(
        tmp_path, RUNNER, scenarios, control_deadline_s=CONTROL_DEADLINE_S, timeout_s=240, allowed_to_fail=[1]
    )
    assert s.returncodes[1] != 0, "the victim must really have died"
    died = json.loads((tmp_path / "died.json").read_text())
    res = s.result("die", 0)
    assert res is not None and res["t_raised"] is not None, "\n".join(s.logs)
    assert res["ranks"] == [1]
    assert res["detected_by"] == "heartbeat", res
    assert res["last_committed_step"] == 1
    assert res["generation"] == 1
    latency = res["t_raised"] - died["t"]
    assert 0 < latency <= BOUND_S, f"RankLostError {latency:.2f} s after the SIGKILL (bound {BOUND_S} s)"
