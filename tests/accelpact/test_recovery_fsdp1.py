"""FSDP1 (FullyShardedDataParallel) recovery, use_orig_params True and False, plus its reset trap."""

from __future__ import annotations

import pytest

from accelpact.testing.compare import differences
from accelpact.testing.session import run_session

RUNNER = "harness.workloads.fsdp_scenarios:run"

STEPS = 4
CASES = [
    ("fwd_middle", "forward_allgather_middle", [1]),
    ("backward", "backward_reduce_scatter", [0]),
    ("vote_all", "vote", [0, 1]),
]


def _scenarios(with_trap: bool) -> list[dict]:
    sc = [{"name": "ref", "guard": False, "steps": STEPS}]
    for name, phase, ranks in CASES:
        sc.append({"name": name, "steps": STEPS, "faults": [{"step": 1, "phase": phase, "ranks": ranks}]})
    # The completeness check after the rebind: FSDP1 creates its exec-order group lazily at the
    # first forward, which a table built at attach alone missed (the old group stayed referenced).
    sc.append({"name": "verified", "steps": STEPS, "verify_rebind": True,
               "faults": [{"step": 2, "phase": "backward_reduce_scatter", "ranks": [1]}]})
    if with_trap:
        sc.append({"name": "trap_disabled", "steps": STEPS, "reset": {"reshard_fsdp1_handles": False},
                   "faults": [{"step": 1, "phase": "forward_allgather_middle", "ranks": [1]}]})
    return sc


@pytest.fixture(scope="module", params=["fsdp1_orig", "fsdp1_flat"])
def session(request, tmp_path_factory):
    # 280 s: inside pytest's 300 s per test, so a hang fails with the ranks' log tails.
    s = run_session(tmp_path_factory.mktemp(request.param), RUNNER, _scenarios(request.param == "fsdp1_orig"),
                    settings={"flavour": request.param}, timeout_s=280)
    assert s.returncodes == [0, 0], "\n".join(s.logs)
    return s


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_fsdp1_fault_is_bit_identical(session, case):
    assert differences(session, case) == []
    for rank in range(2):
        assert len(session.result(case, rank)["events"]) == 1


def test_fsdp1_rebind_leaves_no_reference_to_the_old_group(session):
    """verify_rebind=True runs find_stale_references after every rebind and raises on a holder."""
    assert differences(session, "verified") == []
    for rank in range(2):
        assert len(session.result("verified", rank)["events"]) == 1


def test_fsdp1_half_unsharded_trap_reproduces_without_the_fix(session):
    if session.result("trap_disabled", 0) is None:
        pytest.skip("the trap case runs in the use_orig_params=True session only")
    assert differences(session, "fwd_middle") == []
    diffs = differences(session, "trap_disabled")
    assert diffs, "with the FSDP1 reshard fix disabled the run must diverge"
    assert not any("Error" in d for d in diffs), diffs  # silent divergence, not a crash
