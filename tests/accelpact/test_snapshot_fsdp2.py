"""Snapshots on 2 real FSDP2 gloo ranks: snapshot, train on, restore, continue, bit-identical to the
fault-free reference run (every loss, parameter shard and optimizer tensor, on both ranks).

One session runs every case (runner: tests/accelpact/_snapshot_runners.py): the guard's hook leaves
training unchanged and a fresh model + optimizer restored from a slot continues identically; an
in-place rollback of the live model keeps every tensor's identity; a corrupt newest slot on one rank
makes both ranks agree on the older step; another rank's or job's slot is never loaded.
"""

from __future__ import annotations

import pytest
import torch

from accelpact.testing.compare import bit_differences, sha256
from accelpact.testing.session import run_session

RUNNER = "tests.accelpact._snapshot_runners:run"
STEPS = 6
SCENARIOS = [
    {"name": "ref", "kind": "ref", "steps": STEPS},
    {"name": "guarded", "kind": "guarded", "steps": STEPS, "fresh_step": STEPS - 2},
    {"name": "rollback", "kind": "rollback", "steps": STEPS, "until": 3, "back_to": 2},
    {"name": "corrupt", "kind": "corrupt", "steps": STEPS, "corrupt_rank": 1},
    {"name": "refused", "kind": "refused", "steps": 3},
]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return run_session(tmp_path_factory.mktemp("snap"), RUNNER, SCENARIOS, world_size=2, barrier=True, timeout_s=280)


def _identical(session, name, reference="ref"):
    diffs, counts = bit_differences(session, name, reference)
    assert diffs == [], diffs
    assert counts["tensors"] > 100  # every shard and both Adam moments (and step), on both ranks


def test_guard_with_snapshots_trains_exactly_like_the_reference(session):
    for rank in range(2):  # what the live, guarded model held before the fresh copy took over
        ref, live = session.tensors("ref", rank), session.tensors("guarded_live", rank)
        assert all(torch.equal(a, b) for a, b in zip(ref["losses"], live["losses"], strict=True))
        assert sorted(ref["state"]) == sorted(live["state"]) and len(ref["state"]) > 50
        for key, a in ref["state"].items():
            assert sha256(a) == sha256(live["state"][key]), f"rank {rank}: {key} differs"
    for r in session.job("guarded"):
        assert r["held"] == [STEPS - 1, STEPS - 2]  # two slots, the newest two committed steps
        assert r["snapshots"] == STEPS and r["committed"] == STEPS - 1


def test_fresh_model_and_optimizer_restored_from_a_slot_continue_bit_identically(session):
    _identical(session, "guarded")
    assert all(r["extra"] == {"data_position": "next"} for r in session.job("guarded"))


def test_in_place_rollback_keeps_identity_and_continues_bit_identically(session):
    _identical(session, "rollback")
    for r in session.job("rollback"):
        assert r["identity_kept"]
        assert r["held_after_restore"] == [2]  # the slot of step 3 (that future) was dropped
        assert r["held_at_end"] == [STEPS - 1, STEPS - 2]


def test_corrupt_newest_slot_on_one_rank_makes_both_resume_from_the_older_step(session):
    _identical(session, "corrupt")
    assert [r["restored_step"] for r in session.job("corrupt")] == [STEPS - 2, STEPS - 2]


def test_other_rank_other_token_and_missing_step_are_refused(session):
    for r in session.job("refused"):
        refusals = r["refusals"]
        assert "rank" in refusals["other_rank"] and "expected" in refusals["other_rank"], refusals
        assert "job token 'job-refused'" in refusals["other_token"], refusals
        assert "no valid snapshot of step 0" in refusals["missing_step"] and "held: [2, 1]" in refusals["missing_step"]
        assert r["untouched"] and not r["stranger_restores"]
