"""A new generation's first collective stops waiting once a peer has started a newer round."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accelpact.testing.session import run_session


def _run(tmp: Path, superseded: bool, timeout: float) -> dict:
    # Process groups time out after 6 s: long enough to tell "waited for the peer" from a poll.
    s = run_session(
        tmp,
        "tests.accelpact._first_collective_rank:run",
        [{"name": "first", "superseded": superseded}],
        world_size=2,
        pg_timeout_s=6.0,
        timeout_s=timeout,
    )
    res = s.result("first", 0)
    assert res is not None, f"rank 0 reported no result:\n{s.logs[0][-3000:]}"
    return res


def test_first_collective_raises_when_a_peer_started_a_newer_round(tmp_path):
    res = _run(tmp_path, superseded=True, timeout=60)
    assert res["result"] == "superseded" and res["work_kept"], res


def test_first_collective_keeps_waiting_while_no_round_supersedes_it(tmp_path):
    """Without a newer round it waits for the peer: here until the 6 s PG timeout, not a poll's worth."""
    res = _run(tmp_path, superseded=False, timeout=60)
    assert res["result"] != "superseded" and res["seconds"] >= 5, res


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
