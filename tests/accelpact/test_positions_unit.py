"""accelpact.common.positions: the one-element vote tells agreeing ranks from diverged ones, the same on every rank."""

from __future__ import annotations

import itertools

import pytest

from accelpact.common.positions import NO_LOOP_STEP, Position, agreed, count_of, describe, encode


def _vote(world: int, *ps: Position) -> int:
    return sum(encode(p, world) for p in ps)


def test_equal_positions_agree_and_any_difference_is_found():
    base = Position("step", 1_000_000, 0, 1_000_000)
    for n in (2, 3, 8, 1000):
        summed = _vote(n, *[base] * n)
        assert agreed(summed, n) and count_of(summed, n) == n and summed < 2**63
    others = [
        Position("step", 1_000_001, 0, 1_000_000),
        Position("step", 1_000_000, 0, 1_000_001),
        Position("step", 1_000_000, 0, 999_999),
        Position("region", 1_000_000, 0, 1_000_000),
        Position("step", 1_000_000, 1, 1_000_000),
        Position("finish", 1_000_001, 1, NO_LOOP_STEP),
        Position("step", 1_000_000, 0, NO_LOOP_STEP),
    ]
    for other, n in itertools.product(others, (2, 3, 8, 1000)):
        # (3, 5) sums as (4, 4) does: the squares tell them apart, on every rank alike.
        assert not agreed(_vote(n, *[base] * (n - 1), other), n), (other, n)
        assert count_of(_vote(n, *[base] * (n - 1), other), n) == n
    lo, mid, hi = (Position("step", s, 0, s) for s in (3, 4, 5))
    assert not agreed(_vote(3, lo, hi, mid), 3)
    with pytest.raises(ValueError, match="at most"):
        encode(base, 2**21)


def test_the_message_names_every_rank_and_the_loop_that_ignored_a_rolled_back():
    text = describe({0: Position("step", 3, 0, 4), 1: Position("step", 3, 0, 3)})
    assert "rank 0: in guard.step of step 3, the loop at step 4" in text
    assert "rank 1: in guard.step of step 3, the loop at step 3" in text
    assert "rank(s) [0]" in text and "back.resume_step" in text
    text = describe({0: Position("finish", 8, 1), 1: Position("step", 7, 0)})
    assert "rank 0: in guard.finish after step 7" in text and "same order" in text
