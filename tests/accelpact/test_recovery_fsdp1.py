"""FSDP1 (FullyShardedDataParallel) recovery, use_orig_params True and False, plus its reset trap."""

from __future__ import annotations

import pytest

from accelpact.testing.compare import differences
from accelpact.testing.session import run_session

RUNNER = "experiments.workloads.fsdp_scenarios:run"

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
    sc.append(
        {
            "name": "verified",
            "steps": STEPS,
            "verify_rebind": True,
            "faults": [{"step": 2, "phase": "backward_reduce_scatter", "ranks": [1]}],
        }
    )
    if with_trap:
        sc.append(
            {
                "name": "trap_disabled",
                "steps": STEPS,
                "reset": {"reshard_fsdp1_handles": False},
                "faults": [{"step": 1, "phase": "forward_allgather_middle", "ranks": [1]}],
            }
        )
    return sc


FLAVOURS = ("fsdp1_orig", "fsdp1_flat")


@pytest.fixture(scope="module")
def both_flavours(tmp_path_factory):
    """One 2-rank session runs the scenarios of both flavours (each scenario names its flavour; names are
    prefixed with it): a session's start, torch and the model library imported in each rank, costs
    more than its scenarios."""
    scenarios = [
        {**sc, "name": f"{flavour}-{sc['name']}", "flavour": flavour}
        for flavour in FLAVOURS
        for sc in _scenarios(flavour == "fsdp1_orig")
    ]
    # 560 s: the two sessions' former 280 s each; the first test to use it gets that, plus margin.
    s = run_session(tmp_path_factory.mktemp("fsdp1"), RUNNER, scenarios, timeout_s=560)
    assert s.returncodes == [0, 0], "\n".join(s.logs)
    return s


@pytest.fixture(params=FLAVOURS)
def session(request, both_flavours):
    return both_flavours, f"{request.param}-"


@pytest.mark.timeout(620)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_fsdp1_fault_is_bit_identical(session, case):
    s, p = session
    assert differences(s, p + case, p + "ref") == []
    for rank in range(2):
        assert len(s.result(p + case, rank)["events"]) == 1


@pytest.mark.timeout(620)
def test_fsdp1_rebind_leaves_no_reference_to_the_old_group(session):
    """verify_rebind=True runs find_stale_references after every rebind and raises on a holder."""
    s, p = session
    assert differences(s, p + "verified", p + "ref") == []
    for rank in range(2):
        assert len(s.result(p + "verified", rank)["events"]) == 1


@pytest.mark.timeout(620)
def test_fsdp1_half_unsharded_trap_reproduces_without_the_fix(session):
    s, p = session
    if s.result(p + "trap_disabled", 0) is None:
        pytest.skip("the trap case runs in the use_orig_params=True scenarios only")
    assert differences(s, p + "fwd_middle", p + "ref") == []
    diffs = differences(s, p + "trap_disabled", p + "ref")
    assert diffs, "with the FSDP1 reshard fix disabled the run must diverge"
    assert not any("Error" in d for d in diffs), diffs  # silent divergence, not a crash
