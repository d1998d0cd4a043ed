"""Tests of the commit rule (accelpact.recovery.consensus.decide): properties over all per-rank states, plus examples.

Two independent references keep the tests from restating the implementation:
- `simulate` plays the commit protocol forward (every rank runs step s, the vote completes on some
  subset or on none, the fault hits each rank somewhere after that) and knows the ground truth;
- `reachable` says, by set membership over the protocol's possible end states, whether a combination
  of reports can occur at all. `decide` must accept exactly the reachable ones.
"""

from __future__ import annotations

import ast
import itertools
import pathlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelpact.errors import RankLostError, StateDivergedError, UnrecoverableError
from accelpact.recovery.consensus import Action, Decision, Phase, RankReport, decide

B, I, V, S = Phase.BEFORE_VOTE, Phase.IN_VOTE, Phase.VOTED, Phase.STEPPED  # noqa: E741 - the phases' initials
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rep(rank: int, attempt: int, committed: int, phase: Phase) -> RankReport:
    return RankReport(rank=rank, attempt_step=attempt, committed_step=committed, phase=phase)


# ---------------------------------------------------------------- references


def _start_of(s: int) -> list[tuple[int, int, Phase]]:
    """(attempt, committed, phase) forms of 'committed s-1, not yet in the vote of s'."""
    return [(s, s - 1, B), (s - 1, s - 1, S)] if s >= 1 else [(s, s - 1, B)]


def reachable(reports: list[RankReport], world_size: int) -> bool:
    """Can the commit protocol produce exactly these reports? Independent of decide's normalisation."""
    if sorted(r.rank for r in reports) != list(range(world_size)):
        return False
    forms = [(r.attempt_step, r.committed_step, r.phase) for r in reports]
    candidates = {r.committed_step for r in reports} | {r.committed_step - 1 for r in reports}
    for c in candidates:
        if c < -1:
            continue
        s = c + 1
        no_completion = set(_start_of(s)) | {(s, c, I)}
        if all(f in no_completion for f in forms):
            return True
        not_completed = {(s, c, I)}
        completed = {(s, c, V), (s, s, S), (s + 1, s, B), (s + 1, s, I)}
        if all(f in not_completed | completed for f in forms) and any(f in completed for f in forms):
            return True
    return False


@st.composite
def protocol_runs(draw):
    """A run of the protocol interrupted by a fault: (reports, world_size, expected committed, expected apply_on)."""
    n = draw(st.integers(1, 8))
    c = draw(st.integers(-1, 40))
    s = c + 1
    vote_completed_on = draw(st.sets(st.integers(0, n - 1))) if draw(st.booleans()) else set()
    reports = []
    if not vote_completed_on:
        # Nobody completed the vote: each rank failed before it or inside it.
        for r in range(n):
            a, cm, ph = draw(st.sampled_from(_start_of(s) + [(s, c, I)]))
            reports.append(rep(r, a, cm, ph))
        expected_committed, expected_apply = c, ()
    else:
        # Every rank entered the vote; it completed on `vote_completed_on` and failed on the others.
        for r in range(n):
            if r in vote_completed_on:
                a, cm, ph = draw(st.sampled_from([(s, c, V), (s, s, S), (s + 1, s, B), (s + 1, s, I)]))
            else:
                a, cm, ph = s, c, I
            reports.append(rep(r, a, cm, ph))
        expected_committed = s
        expected_apply = tuple(sorted(r.rank for r in reports if r.committed_step == c))
    shuffled = draw(st.permutations(reports))
    return list(shuffled), n, expected_committed, expected_apply


@st.composite
def arbitrary_reports(draw):
    """Any combination of per-rank states near a base step, including missing/duplicate/out-of-range ranks."""
    n = draw(st.integers(1, 8))
    base = draw(st.integers(0, 30))
    per_rank = st.tuples(st.integers(base, base + 3), st.integers(base - 2, base + 3), st.sampled_from(list(Phase)))
    reports = [rep(r, *draw(per_rank)) for r in range(n)]
    mutation = draw(st.sampled_from(["none", "none", "none", "drop", "dup", "out_of_range"]))
    if mutation == "drop" and reports:
        reports.pop(draw(st.integers(0, len(reports) - 1)))
    elif mutation == "dup":
        reports.append(rep(draw(st.integers(0, n - 1)), *draw(per_rank)))
    elif mutation == "out_of_range":
        reports.append(rep(draw(st.sampled_from([-1, n, n + 3])), *draw(per_rank)))
    return reports, n


def outcome(reports, n):
    """decide's result, or a comparable description of what it raised."""
    try:
        return decide(reports, n)
    except UnrecoverableError as exc:
        return (type(exc), str(exc), exc.ranks, exc.last_committed_step)


def check_safety(reports: list[RankReport], d: Decision) -> None:
    """After applying d every rank has the same committed step, and nobody un-steps."""
    assert d.resume_step == d.committed_step + 1
    assert list(d.apply_on) == sorted(set(d.apply_on))
    for r in reports:
        applies = r.rank in d.apply_on
        after = r.committed_step + (1 if applies else 0)
        assert after == d.committed_step, (r, d)
        assert after >= r.committed_step
        if applies:
            # It must hold the reduced gradients of `step`: it entered the vote of exactly that step.
            assert r.attempt_step == d.step and r.phase in (I, V), (r, d)
    vote_completed = any(r.committed_step >= d.step or (r.attempt_step == d.step and r.phase is V) for r in reports)
    if d.action is Action.ROLL_FORWARD:
        assert vote_completed and d.apply_on and d.committed_step == d.step
    else:
        assert not vote_completed and d.apply_on == () and d.resume_step == d.step


# ---------------------------------------------------------------- properties


@SETTINGS
@given(protocol_runs())
def test_every_protocol_state_is_decided_to_the_ground_truth(run):
    reports, n, expected_committed, expected_apply = run
    d = decide(reports, n)
    assert d.committed_step == expected_committed
    assert d.apply_on == expected_apply
    assert d.resume_step == expected_committed + 1
    check_safety(reports, d)


@SETTINGS
@given(arbitrary_reports(), st.randoms(use_true_random=False))
def test_decision_is_independent_of_report_order(case, rnd):
    reports, n = case
    shuffled = list(reports)
    rnd.shuffle(shuffled)
    assert outcome(reports, n) == outcome(shuffled, n)


@SETTINGS
@given(arbitrary_reports())
def test_decide_accepts_exactly_the_reachable_states_and_is_safe(case):
    reports, n = case
    ok = reachable(reports, n)
    try:
        d = decide(reports, n)
    except RankLostError as exc:
        missing = sorted(set(range(n)) - {r.rank for r in reports})
        assert not ok and missing and list(exc.ranks) == missing
        for rank in missing:
            assert f"{rank}" in str(exc)
        assert exc.last_committed_step == min((r.committed_step for r in reports), default=None)
        return
    except StateDivergedError as exc:
        assert not ok, f"reachable state rejected: {exc}"
        assert exc.ranks, "the error must name the ranks involved"
        for rank in exc.ranks:
            assert f"rank {rank}" in str(exc)
        assert "step" in str(exc) and str(exc.last_committed_step) in str(exc)
        return
    assert ok, f"unreachable state accepted: {reports} -> {d}"
    check_safety(reports, d)


def test_exhaustively_for_one_and_two_ranks():
    """Every combination from a window of per-rank states: accepted iff reachable, and safe when accepted."""
    base = 5
    states = list(itertools.product(range(base, base + 3), range(base - 2, base + 3), list(Phase)))
    checked = 0
    for n in (1, 2):
        for combo in itertools.product(states, repeat=n):
            reports = [rep(r, *st_) for r, st_ in enumerate(combo)]
            ok = reachable(reports, n)
            try:
                d = decide(reports, n)
            except StateDivergedError:
                assert not ok, reports
                continue
            assert ok, reports
            check_safety(reports, d)
            checked += 1
    assert checked > 20  # the window really contains accepted states


# ---------------------------------------------------------------- hand-written examples


def test_all_failed_before_vote_retries():
    d = decide([rep(0, 7, 6, B), rep(1, 7, 6, B)], 2)
    assert d == Decision(Action.RETRY, step=7, apply_on=(), resume_step=7, committed_step=6)


def test_vote_failed_everywhere_retries():
    d = decide([rep(0, 7, 6, I), rep(1, 7, 6, B), rep(2, 7, 6, I)], 3)
    assert d.action is Action.RETRY and d.step == 7 and d.committed_step == 6


def test_vote_completed_on_one_rank_rolls_forward_the_others():
    # Rank 0's vote completed, it stepped 7 and failed in step 8's forward; rank 1 is stuck in step 7's vote.
    d = decide([rep(1, 7, 6, I), rep(0, 8, 7, B)], 2)
    assert d == Decision(Action.ROLL_FORWARD, step=7, apply_on=(1,), resume_step=8, committed_step=7)


def test_vote_completed_everywhere_but_nobody_stepped_rolls_forward_all():
    d = decide([rep(0, 3, 2, V), rep(1, 3, 2, V), rep(2, 3, 2, I)], 3)
    assert d == Decision(Action.ROLL_FORWARD, step=3, apply_on=(0, 1, 2), resume_step=4, committed_step=3)


def test_stepped_is_the_same_as_starting_the_next_step():
    a = decide([rep(0, 4, 4, S), rep(1, 4, 3, I)], 2)
    b = decide([rep(0, 5, 4, B), rep(1, 4, 3, I)], 2)
    assert a == b and a.apply_on == (1,)


def test_first_step_ever():
    assert decide([rep(0, 0, -1, B)], 1) == Decision(Action.RETRY, 0, (), 0, -1)
    assert decide([rep(0, 0, -1, V), rep(1, 0, -1, I)], 2).apply_on == (0, 1)


def test_stepped_while_peer_never_entered_vote_is_divergence():
    with pytest.raises(StateDivergedError) as ei:
        decide([rep(0, 7, 7, S), rep(1, 7, 6, B)], 2)
    assert set(ei.value.ranks) == {0, 1}
    assert "step 7" in str(ei.value) and "rank 1" in str(ei.value)


def test_committed_steps_two_apart_is_divergence():
    with pytest.raises(StateDivergedError) as ei:
        decide([rep(0, 9, 8, B), rep(1, 7, 6, I)], 2)
    assert ei.value.ranks == (0, 1) and ei.value.last_committed_step == 6
    assert "8" in str(ei.value) and "6" in str(ei.value)


def test_inconsistent_single_report_is_divergence():
    with pytest.raises(StateDivergedError, match="rank 0"):
        decide([rep(0, 7, 3, I)], 1)


def test_missing_rank_is_rank_lost():
    with pytest.raises(RankLostError) as ei:
        decide([rep(0, 5, 4, B), rep(2, 6, 5, B)], 4)
    assert ei.value.ranks == (1, 3) and ei.value.last_committed_step == 4
    assert "[1, 3]" in str(ei.value) and "4" in str(ei.value)


def test_duplicate_and_out_of_range_ranks_are_divergence():
    with pytest.raises(StateDivergedError, match="duplicate"):
        decide([rep(0, 5, 4, B), rep(0, 5, 4, B)], 2)
    with pytest.raises(StateDivergedError, match="outside"):
        decide([rep(0, 5, 4, B), rep(2, 5, 4, B)], 2)


def test_report_wire_round_trip():
    r = rep(3, 12, 11, V)
    assert RankReport.from_bytes(r.to_bytes()) == r
    with pytest.raises(StateDivergedError):
        RankReport.from_bytes(b'{"rank": 1}')


def test_protocol_modules_do_not_import_torch():
    """consensus, the region rule and errors are pure: no module-level torch import (errors imports torch lazily)."""
    pkg = pathlib.Path(__file__).resolve().parents[2] / "accelpact"
    for name in ("recovery/consensus.py", "recovery/region_rule.py", "errors.py"):
        tree = ast.parse((pkg / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "torch" for a in node.names), name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "torch", name


def test_random_large_worlds_smoke():
    """A fixed-seed sweep over bigger worlds than hypothesis explores, through the same references."""
    rng = random.Random(1234)
    for _ in range(300):
        n = rng.randint(1, 8)
        c = rng.randint(-1, 10)
        s = c + 1
        completed = rng.random() < 0.5
        reports = []
        for r in range(n):
            if completed and rng.random() < 0.5:
                a, cm, ph = rng.choice([(s, c, V), (s, s, S), (s + 1, s, B), (s + 1, s, I)])
            elif completed:
                a, cm, ph = s, c, I
            else:
                a, cm, ph = rng.choice(_start_of(s) + [(s, c, I)])
            reports.append(rep(r, a, cm, ph))
        if completed and all(x.phase is I and x.attempt_step == s for x in reports):
            continue  # nobody actually completed: not this branch's case
        d = decide(reports, n)
        check_safety(reports, d)
        assert d.committed_step == (s if completed else c)


def test_report_wire_form_carries_the_fault_type_without_affecting_the_decision():
    r = RankReport(rank=1, attempt_step=3, committed_step=2, phase=Phase.BEFORE_VOTE, fault="RuntimeError")
    assert RankReport.from_bytes(r.to_bytes()) == r
    assert r.to_dict()["fault"] == "RuntimeError"
    assert "fault" not in rep(1, 3, 2, B).to_dict()  # absent, not null, when unknown
    plain = [rep(0, 3, 2, B), rep(1, 3, 2, B)]
    assert decide(plain, 2) == decide([plain[0], r], 2)
    with pytest.raises(StateDivergedError):
        RankReport.from_bytes(b'{"rank": 1, "attempt_step": 3, "committed_step": 2, "phase": "voted", "fault": 7}')


def test_report_wire_form_carries_the_injection_time_backwards_compatibly():
    r = RankReport(
        rank=1, attempt_step=3, committed_step=2, phase=Phase.IN_VOTE, fault="RuntimeError", injected_at=1764500000.125
    )
    assert RankReport.from_bytes(r.to_bytes()) == r
    assert "injected_at" not in rep(1, 3, 2, B).to_dict()  # absent, not null, when nothing was injected
    # An older rank's report (no such key) reads as "nothing injected"; a newer key an older rank
    # does not know is ignored by from_bytes (it reads the keys it needs).
    old = b'{"rank": 1, "attempt_step": 3, "committed_step": 2, "phase": "in_vote"}'
    assert RankReport.from_bytes(old).injected_at is None
    assert RankReport.from_bytes(r.to_bytes().replace(b'"fault"', b'"future_key": [1], "fault"')) == r
    assert decide([rep(0, 3, 2, I), r], 2) == decide([rep(0, 3, 2, I), rep(1, 3, 2, I)], 2)
    for bad in (b'"x"', b"true"):
        with pytest.raises(StateDivergedError):
            RankReport.from_bytes(old[:-1] + b', "injected_at": ' + bad + b"}")
