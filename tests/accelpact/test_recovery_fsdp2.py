"""FSDP2 recovery from real faults, bit-identical to a fault-free reference run.

One 2-rank session runs the plain-loop reference and every fault case below in sequence (one
interpreter start-up for all of them); each test then checks its own case. Faults are real: a rank
shuts down its own gloo TCP connections right before the chosen collective.
"""

from __future__ import annotations

import inspect

import pytest

from accelpact.testing.compare import differences
from accelpact.testing.session import run_session

RUNNER = "experiments.workloads.fsdp_scenarios:run"

PHASES = ["forward_allgather_first", "forward_allgather_middle", "backward_reduce_scatter", "clip_allreduce", "vote"]
STEPS = 4
TEN_FAULT_STEPS = 12

SCENARIOS = [{"name": "ref", "guard": False, "steps": STEPS}]
for _phase in PHASES:
    SCENARIOS.append({"name": f"one_{_phase}", "steps": STEPS, "faults": [{"step": 1, "phase": _phase, "ranks": [1]}]})
    SCENARIOS.append(
        {"name": f"all_{_phase}", "steps": STEPS, "faults": [{"step": 2, "phase": _phase, "ranks": [0, 1]}]}
    )
SCENARIOS += [
    # Rank 1's vote completed, then its link died before optimizer.step: rank 0 stepped, rank 1 did not.
    {
        "name": "roll_forward",
        "steps": STEPS,
        "faults": [{"step": 1, "phase": "post_vote", "action": "reset_raise", "ranks": [1]}],
    },
    # A fault during recovery: the new generation's first collective fails; a second round follows.
    {
        "name": "nested",
        "steps": STEPS,
        "faults": [
            {"step": 1, "phase": "forward_allgather_middle", "ranks": [0]},
            {"step": 1, "phase": "recovery", "ranks": [1]},
        ],
    },
    # The completeness check runs inside the guard (raises if anything still holds the old group).
    {
        "name": "verified",
        "steps": STEPS,
        "verify_rebind": True,
        "faults": [{"step": 1, "phase": "backward_reduce_scatter", "ranks": [0]}],
    },
    # The FSDP2 trap with its fix disabled: must diverge from the reference.
    {
        "name": "trap_disabled",
        "steps": STEPS,
        "reset": {"clear_unsharded_grads": False},
        "faults": [{"step": 1, "phase": "backward_reduce_scatter", "ranks": [1]}],
    },
    {
        "name": "ten_faults",
        "steps": TEN_FAULT_STEPS,
        "leak_check": True,
        "faults": [{"step": s, "phase": PHASES[s % len(PHASES)], "ranks": [s % 2]} for s in range(1, 11)],
    },
]
# The ten-fault run needs its own reference of the same length.
SCENARIOS.insert(1, {"name": "ref_long", "guard": False, "steps": TEN_FAULT_STEPS})


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    # 280 s: inside pytest's 300 s per test, so a hang fails with the ranks' log tails.
    s = run_session(
        tmp_path_factory.mktemp("fsdp2"), RUNNER, SCENARIOS, world_size=2, settings={"flavour": "fsdp2"}, timeout_s=280
    )
    assert s.returncodes == [0, 0], f"rank processes failed: {s.returncodes}\n" + "\n".join(s.logs)
    return s


def _events(session, name, rank):
    res = session.result(name, rank)
    assert res is not None and res["error"] is None, res
    return res["events"]


@pytest.mark.parametrize("who", ["one", "all"])
@pytest.mark.parametrize("phase", PHASES)
def test_socket_reset_is_bit_identical(session, phase, who):
    name = f"{who}_{phase}"
    assert differences(session, name) == []
    for rank in range(2):
        events = _events(session, name, rank)
        assert len(events) == 1, events  # the fault really happened and was recovered exactly once
        assert events[0]["decision"]["action"] == "retry"
        assert events[0]["generation"] >= 1
    fired = [f for r in range(2) for f in session.result(name, r)["fired"]]
    assert {f["phase"] for f in fired} == {phase}


def test_roll_forward_when_vote_completed_on_some_ranks(session):
    assert differences(session, "roll_forward") == []
    decisions = [_events(session, "roll_forward", r)[0]["decision"] for r in range(2)]
    assert decisions[0] == decisions[1]
    assert decisions[0]["action"] == "roll_forward" and decisions[0]["apply_on"] == [1]
    assert decisions[0]["step"] == 1


def test_nested_fault_during_recovery(session):
    assert differences(session, "nested") == []
    for rank in range(2):
        events = _events(session, "nested", rank)
        assert len(events) == 1 and events[0]["rounds"] >= 2, events
        ev = events[0]
        # Every round keeps its own parts (the failed one included), and the event's parts are their
        # sums, so the whole recovery after detection is attributed (only the inter-round abort is not).
        assert len(ev["round_times"]) == ev["rounds"], ev["round_times"]
        assert all(r["agreement"] > 0 for r in ev["round_times"])
        parts = sum(ev[k] for k in ("agreement_s", "rebuild_s", "rebind_s", "first_collective_s"))
        assert ev["total_s"] - 0.05 <= parts <= ev["total_s"] + 1e-6, (parts, ev["total_s"])


def test_rebind_leaves_no_reference_to_the_old_group(session):
    assert differences(session, "verified") == []
    assert len(_events(session, "verified", 0)) == 1


def _torch_reset_clears_unsharded_grads() -> bool:
    """Whether the installed torch's ``reset_iter_state`` clears every ``_unsharded_param.grad`` itself.

    torch 2.15's ``FSDPParamGroup._reset_iter_state`` does (it sets each leaf's grad to None); 2.13's does
    not, which is the trap accelpact's reset closes. Read from the installed source, not a version number.
    """
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    fn = getattr(FSDPParamGroup, "_reset_iter_state", None)
    return fn is not None and "_unsharded_param" in inspect.getsource(fn)


def test_fsdp2_stale_grad_trap_reproduces_without_the_fix(session):
    """The fix (clearing _unsharded_param.grad) is what makes the backward-fault case identical (2.13); on a
    torch whose own reset clears those grads (2.15) the run is identical even with accelpact's fix off."""
    assert differences(session, "one_backward_reduce_scatter") == []
    diffs = differences(session, "trap_disabled")
    if _torch_reset_clears_unsharded_grads():
        assert diffs == [], diffs
        return
    assert diffs, "with the FSDP2 reset fix disabled the run should diverge from the reference"
    assert not any("Error" in d for d in diffs), diffs  # silent divergence, not a crash


def test_ten_successive_faults_identical_and_no_leak(session):
    assert differences(session, "ten_faults", reference="ref_long") == []
    for rank in range(2):
        res = session.result("ten_faults", rank)
        assert len(res["events"]) == 10
        assert [e["generation"] for e in res["events"]] == sorted({e["generation"] for e in res["events"]})
        before, after = res["resources_before"], res["resources_after"]
        for what in ("threads", "fds", "tcp"):
            assert after[what] <= before[what] + 2, (rank, what, before, after)


def test_recovery_event_fields(session):
    import json

    ev = _events(session, "one_forward_allgather_middle", 0)[0]
    json.dumps(ev)
    for key in ("detection_s", "agreement_s", "rebuild_s", "rebind_s", "first_collective_s", "total_s"):
        assert ev[key] >= 0.0
    assert ev["fault"]["type"] and ev["fault"]["message"]
    assert ev["ranks"] == [0, 1]
