"""benchmarks/gpu_check.py's pure logic with fake rank results (no GPU on this machine): when it refuses
to run, and when its verdict passes, for the rebuild and the 2.15 reconfigure (NCCL revoke) paths."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu_check import init_kwargs, judge, path_problem


def _rank(
    rank: int, path: str | None = "reconfigure", differ: list | None = None, error: str | None = None, events: int = 1
) -> dict:
    ev = {"decision": {"action": "retry"}, "detection_s": 0.01, "total_s": 0.02}
    if path is not None:
        ev["data_plane"] = {
            "path": path,
            "why": "reconfigure failed, fell back: rank 1: ..."
            if path == "rebind"
            else "every data-plane group supports reconfigure",
        }
    return {
        "rank": rank,
        "error": error,
        "committed_step": 5,
        "events": [ev] * events,
        "differ": [] if differ is None else differ,
    }


def test_every_rank_on_the_asked_path_and_identical_passes():
    ok, lines = judge([_rank(0), _rank(1)], "reconfigure")
    assert ok and len(lines) == 2 and all(" reconfigure " in line for line in lines)


def test_a_fallback_to_rebuild_fails_the_reconfigure_check_and_says_why():
    ok, lines = judge([_rank(0), _rank(1, path="rebind")], "reconfigure")
    assert not ok and "fell back" in lines[1]


def test_an_event_without_a_path_counts_as_rebuild():
    """An accelpact before the reconfigure path wrote no data_plane: that is the rebuild path."""
    assert judge([_rank(0, path=None), _rank(1, path=None)], "rebind")[0]
    assert not judge([_rank(0, path=None), _rank(1, path=None)], "reconfigure")[0]


def test_a_differing_shard_an_error_or_no_recovery_fails():
    assert not judge([_rank(0), _rank(1, differ=["model.0.weight"])], "reconfigure")[0]
    assert not judge([_rank(0), _rank(1, error="RankLostError: ...")], "reconfigure")[0]
    assert not judge([_rank(0), _rank(1, events=0)], "reconfigure")[0]


def test_refusals_name_the_fix():
    assert "no CUDA device" in path_problem("rebind", True, False, 0, 0)
    assert "single-GPU" in path_problem("rebind", True, True, 1, 1)
    assert "torch >= 2.15" in path_problem("reconfigure", False, True, 2, 2)
    assert path_problem("reconfigure", True, True, 2, 2) is None
    assert path_problem("rebind", False, True, 4, 2) is None


def test_init_kwargs_per_path():
    assert init_kwargs("reconfigure", "cuda:0") == {"enable_reconfigure": True}
    assert init_kwargs("rebind", "cuda:0") == {"device_id": "cuda:0"}
