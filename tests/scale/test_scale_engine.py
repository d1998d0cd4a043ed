"""The event engine against closed forms and hand-computed timelines (harness.scale.engine)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.scale import analytic
from harness.scale.engine import CHECKPOINT, NONE, STEP, Lanes, Schedule, simulate

LAM = 1 / 3600.0  # one failure an hour
D = 600.0  # a fixed 10-minute recovery


def _lanes(n, *, tau, c, rollback, step, d=D, lam=LAM):
    return Lanes(
        np.full(n, step),
        np.full(n, tau),
        np.full(n, c),
        np.full((n, 1), d),
        np.full((n, 1), rollback, dtype=int),
        np.full((n, 1), lam),
    )


def _within_mc_error(values, expected):
    mean, se = values.mean(), values.std(ddof=1) / np.sqrt(values.size)
    # 4 standard errors: a correct engine fails this about once in 16,000 seeds; a wrong rule misses by far more.
    assert abs(mean - expected) < 4 * se + 1e-4, (mean, expected, se)


def test_in_memory_recovery_matches_exp_minus_lambda_d():
    res = simulate(
        _lanes(200, tau=np.inf, c=0.0, rollback=STEP, step=1e-6), horizon_s=800 * 3600, rng=np.random.default_rng(1)
    )
    _within_mc_error(res.ettr, analytic.ettr_step_rollback(LAM, D))


@pytest.mark.parametrize("tau,c", [(1800.0, 60.0), (7200.0, 300.0)])
def test_checkpoint_rollback_matches_the_segment_formula(tau, c):
    res = simulate(
        _lanes(200, tau=tau, c=c, rollback=CHECKPOINT, step=10.0), horizon_s=800 * 3600, rng=np.random.default_rng(2)
    )
    _within_mc_error(res.ettr, analytic.ettr_checkpoint_rollback(LAM, D, tau, c))


def test_the_two_rollbacks_are_told_apart():
    """The closed forms differ by more than the Monte Carlo error, so the tests above can fail."""
    assert analytic.ettr_step_rollback(LAM, D) - analytic.ettr_checkpoint_rollback(LAM, D, 1800, 60) > 0.1


def test_no_failure_finite_work_is_work_plus_checkpoints():
    lanes = _lanes(1, tau=10.0, c=2.0, rollback=CHECKPOINT, step=1.0, lam=0.0)
    res = simulate(lanes, work_s=35.0, schedule=Schedule(np.full((1, 1), np.inf), np.zeros((1, 1), dtype=int)))
    assert res.wall_s[0] == pytest.approx(35.0 + 3 * 2.0) and res.finished[0]
    # Work that ends exactly on an interval writes no checkpoint after it (as the harness's window).
    res = simulate(lanes, work_s=30.0, schedule=Schedule(np.full((1, 1), np.inf), np.zeros((1, 1), dtype=int)))
    assert res.wall_s[0] == pytest.approx(30.0 + 2 * 2.0)


@pytest.mark.parametrize("rollback,lost", [(CHECKPOINT, 4.5), (STEP, 0.5), (NONE, 0.0)])
def test_one_scheduled_failure_by_hand(rollback, lost):
    """Work 20 s, checkpoint every 10 s (write 1 s), a failure at wall 15.5 s (work 14.5), stop 3 s."""
    lanes = Lanes(
        np.array([1.0]), np.array([10.0]), np.array([1.0]), np.array([[3.0]]), np.array([[rollback]]), np.zeros((1, 1))
    )
    res = simulate(lanes, work_s=20.0, schedule=Schedule(np.array([[15.5]]), np.zeros((1, 1), dtype=int)))
    # Rollback none starts a fresh segment after the stop, so the remaining work (5.5) needs no write.
    writes = 1.0
    assert res.wall_s[0] == pytest.approx(20.0 + writes + 3.0 + lost)
    assert res.lost_s[0, 0] == pytest.approx(lost) and res.downtime_s[0, 0] == pytest.approx(3.0)
    assert res.wall_s[0] == pytest.approx(
        res.useful_s[0] + res.checkpoint_s[0] + res.downtime_s.sum() + res.lost_s.sum()
    )


def test_a_failure_during_recovery_restarts_it():
    lanes = Lanes(
        np.array([1.0]), np.array([np.inf]), np.array([0.0]), np.array([[5.0]]), np.array([[STEP]]), np.zeros((1, 1))
    )
    res = simulate(lanes, work_s=10.0, schedule=Schedule(np.array([[4.0, 6.0]]), np.zeros((1, 2), dtype=int)))
    # Stop from 4 to 6 (hit again), then a full 5 s: 10 work + 2 + 5.
    assert res.wall_s[0] == pytest.approx(17.0) and res.failures[0, 0] == 2


def test_young_and_daly():
    assert analytic.young_interval(60, 3600) == pytest.approx(np.sqrt(2 * 60 * 3600))
    assert (
        analytic.young_interval(60, 3600) - 60
        < analytic.daly_interval(60, 3600)
        < 1.1 * analytic.young_interval(60, 3600)
    )
    assert analytic.daly_interval(10_000, 3600) == 3600
