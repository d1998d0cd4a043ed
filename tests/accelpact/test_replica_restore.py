"""Restore from a buddy replica on 2 real FSDP2 gloo ranks (runner: tests/accelpact/_replica_runners.py).

Each rank is its own host (own snapshot root) and pushes every snapshot to the other over the replica
channel. After rank 0's own snapshots are deleted, a FRESH model and optimizer on each rank restores
with ``restore_latest(fetch=replication)``: rank 0 from its buddy's replica, rank 1 from its own slot,
and both continue bit-identical to the fault-free reference (every loss, parameter shard and optimizer
tensor). With rank 0's buddy copy gone too, both ranks get BuddyLostError naming rank 0 and rank 1.
"""

from __future__ import annotations

import pytest

from accelpact.testing.compare import bit_differences
from accelpact.testing.session import run_session

RUNNER = "tests.accelpact._replica_runners:run"
STEPS, TOTAL = 4, 6
SCENARIOS = [
    {"name": "ref", "kind": "ref", "total": TOTAL},
    {"name": "buddy", "kind": "buddy", "steps": STEPS, "total": TOTAL},
    {"name": "both_lost", "kind": "both_lost", "steps": STEPS, "total": TOTAL},
    # push_every: steps 0..5 snapshotted, only 0, 2, 4 (k=2) or 0, 3 (k=3) pushed
    {"name": "push2", "kind": "buddy", "steps": TOTAL, "total": TOTAL, "push_every": 2},
    {"name": "push3", "kind": "buddy", "steps": TOTAL, "total": TOTAL, "push_every": 3},
]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return run_session(tmp_path_factory.mktemp("replica"), RUNNER, SCENARIOS, world_size=2, barrier=True, timeout_s=280)


def test_rank_without_own_snapshot_restores_from_buddy_bit_identically(session):
    r0, r1 = session.job("buddy")
    assert (r0["source"], r1["source"]) == ("buddy", "own")
    assert r0["step"] == r1["step"] == STEPS - 1  # the newest step: nothing replayed but the lost future
    assert r0["extra"] == {"data_position": "next"}
    for r in (r0, r1):
        assert r["push"]["pushed"] >= 1 and r["push"]["dropped"] == 0
    diffs, counts = bit_differences(session, "buddy", "ref")
    assert diffs == [], diffs
    assert counts["tensors"] > 100


def test_rank_and_buddy_both_lost_names_both_and_says_no_copy_survives(session):
    for r in session.job("both_lost"):
        assert r["lost"], r
        assert r["ranks"] == [0, 1]
        assert "rank 0 and its buddy rank 1 were both lost" in r["message"]
        assert "no in-memory copy" in r["message"] and "disk checkpoint" in r["message"]


@pytest.mark.parametrize("name,k,pushed,restored", [("push2", 2, [0, 2, 4], 4), ("push3", 3, [0, 3], 3)])
def test_push_every_pushes_only_every_kth_and_the_kept_slot_heals_bit_identically(session, name, k, pushed, restored):
    """Only the steps divisible by k reach the buddy (the newest two of them are held there); each rank
    keeps its own slot of the newest pushed step (steps 3 and 5 at k=3, where overwriting the older slot
    would have kept 4 and 5 and left no step in common), so the rank whose own snapshots were lost
    restores from the buddy at that step, and the run continues bit-identical to the fault-free one."""
    r0, r1 = session.job(name)
    for r in (r0, r1):
        p = r["push"]
        assert p["pushed"] + p["skipped"] + p["dropped"] == len(pushed), p  # one hand-off per pushed step only
        assert set(r["replica_steps"]) <= set(pushed) and pushed[-1] in r["replica_steps"], r["replica_steps"]
        if p["skipped"] == 0 and p["dropped"] == 0:
            assert r["replica_steps"] == pushed[-2:]
        assert r["own_steps"] == sorted({restored, TOTAL - 1})  # newest pushed kept beside the newest
    assert (r0["source"], r1["source"]) == ("buddy", "own")
    assert r0["step"] == r1["step"] == restored
    diffs, counts = bit_differences(session, name, "ref")
    assert diffs == [], diffs
    assert counts["tensors"] > 100
