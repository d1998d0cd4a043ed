"""A new generation's first collective stops waiting once a peer has started a newer round."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RANK = Path(__file__).with_name("_first_collective_rank.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(superseded: bool, timeout: float) -> dict:
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(RANK), str(r), str(port), "1" if superseded else "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=timeout)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"rank 0 printed no result:\n{err[-3000:]}"
    return json.loads(lines[-1])


def test_first_collective_raises_when_a_peer_started_a_newer_round():
    res = _run(superseded=True, timeout=60)
    assert res["result"] == "superseded" and res["work_kept"], res


def test_first_collective_keeps_waiting_while_no_round_supersedes_it():
    """Without a newer round it waits for the peer: here until the 6 s PG timeout, not a poll's worth."""
    res = _run(superseded=False, timeout=60)
    assert res["result"] != "superseded" and res["seconds"] >= 5, res


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
