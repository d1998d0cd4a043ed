"""The multi-rank session launcher: results come back per rank, and a failing rank is named with its
exit code and log tail. Real rank processes, real gloo and control store; the runners have no model."""

from __future__ import annotations

import os

import pytest

from accelpact.testing.session import SessionError, default_timeout_s, run_session

RUNNERS = "tests.accelpact._session_runners"


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); every recovery test runs through sessions
def test_every_rank_runs_every_scenario_with_the_callers_settings(tmp_path):
    scenarios = [{"name": "a", "value": 1}, {"name": "b", "value": 2}]
    s = run_session(tmp_path, f"{RUNNERS}:echo", scenarios, world_size=3, settings={"flavour": "x"}, timeout_s=120)
    assert s.returncodes == [0, 0, 0]
    for rank in range(3):
        for sc in scenarios:
            res = s.result(sc["name"], rank)
            assert (res["rank"], res["world_size"], res["value"]) == (rank, 3, sc["value"])
            assert res["settings"] == {"flavour": "x"}
    assert [r["rank"] for r in s.job("b")] == [0, 1, 2]


@pytest.mark.skipif(bool(os.environ.get("ACCELPACT_TEST_SPAWN")), reason="ACCELPACT_TEST_SPAWN=1: no template")
def test_the_suites_sessions_fork_their_ranks_from_one_template(tmp_path):
    """tests/conftest.py turns the template on: both ranks are children of one process that is not this one
    (spawned ranks are this process's children), and a second session forks from the same template."""
    first = run_session(tmp_path / "a", f"{RUNNERS}:parent", [{"name": "p"}], timeout_s=120)
    second = run_session(tmp_path / "b", f"{RUNNERS}:parent", [{"name": "p"}], timeout_s=120)
    assert first.started == second.started == "forked from the template", (first.started, second.started)
    parents = {r["ppid"] for s in (first, second) for r in s.job("p")}
    assert len(parents) == 1 and os.getpid() not in parents, parents


def test_a_rank_that_exits_is_named_with_its_exit_code_and_log_tail(tmp_path):
    with pytest.raises(SessionError) as info:
        run_session(tmp_path, f"{RUNNERS}:die_on_rank_1", [{"name": "d"}], timeout_s=120)
    msg = str(info.value)
    assert "rank 1 of 2" in msg and "exit code 3" in msg and "marker-d-rank1-dies" in msg, msg
    # Allowed to fail: the session comes back, the survivor's result intact.
    s = run_session(tmp_path / "again", f"{RUNNERS}:die_on_rank_1", [{"name": "d"}], timeout_s=120, allowed_to_fail=[1])
    assert s.returncodes[0] == 0 and s.returncodes[1] == 3
    assert s.result("d", 0) == {"rank": 0, "wall_s": s.result("d", 0)["wall_s"]}
    assert s.result("d", 1) is None


def test_a_raising_scenario_is_recorded_and_stops_that_rank(tmp_path):
    s = run_session(tmp_path, f"{RUNNERS}:raise_on_rank_0", [{"name": "e"}, {"name": "f"}], timeout_s=120)
    err = s.result("e", 0)["error"]
    assert err["type"] == "ValueError" and "e failed on purpose" in err["message"] and err["traceback"]
    assert s.result("f", 0) is None  # after an error the rank stops: its process group may be gone
    assert s.result("f", 1) == {"rank": 1, "wall_s": s.result("f", 1)["wall_s"]}
    with pytest.raises(SessionError, match="rank 0, scenario 'e': ValueError"):
        s.job("e")


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); waits out a timeout
def test_a_hanging_session_is_killed_at_its_timeout(tmp_path):
    s = run_session(tmp_path, f"{RUNNERS}:hang", [{"name": "h"}], timeout_s=12, check=False)
    assert s.timed_out and all(code != 0 for code in s.returncodes)
    assert s.wall_s < 60
    with pytest.raises(SessionError, match="killed at the session timeout"):
        s.check()


def test_the_default_timeout_grows_with_steps_scenarios_and_ranks():
    base = default_timeout_s([{"steps": 4}], 2)
    assert default_timeout_s([{"steps": 40}], 2) > base
    assert default_timeout_s([{"steps": 4}] * 5, 2) > base
    assert default_timeout_s([{"steps": 4}], 4 * (os.cpu_count() or 1)) > base  # more ranks than cores
