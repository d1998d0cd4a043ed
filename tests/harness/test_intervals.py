"""The intervals a comparison prints cover what they say, and the verdict needs the minimum effect."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.report.intervals import (
    BETTER,
    NOISE,
    ONE_TRIAL,
    SAME,
    WORSE,
    Interval,
    coverage_text,
    interval,
    order_statistic,
    order_statistic_coverage,
    t_log,
    verdict,
)

SIMULATIONS = 4000
# Binomial standard error of a coverage near 0.95 over 4000 draws is 0.0035: 4 of them never flakes on a
# correct method, and still fails a method whose coverage is off by 2 points or more.
TOLERANCE = 0.015


def _coverage(method, draw, true_centre: float, n: int, seed: int = 7) -> tuple[float, float]:
    """(observed coverage of the true centre, the coverage the method stated) over SIMULATIONS draws of n."""
    rng = np.random.default_rng(seed)
    hits, stated = 0, []
    for _ in range(SIMULATIONS):
        iv = method(draw(rng, n), 0.95)
        hits += iv.lo <= true_centre <= iv.hi
        stated.append(iv.coverage)
    return hits / SIMULATIONS, float(np.mean(stated))


def _lognormal(rng, n):
    return np.exp(rng.normal(math.log(1.2), 0.15, n))  # a gain of 1.2 with ~15% noise


def _skewed(rng, n):
    return 1.0 + rng.exponential(0.3, n)  # heavy right tail, like a run slowed by a load spike


@pytest.mark.parametrize("n", [3, 5, 6, 9])
def test_order_statistic_covers_the_median_as_stated_for_any_distribution(n):
    for draw, median in ((_lognormal, 1.2), (_skewed, 1.0 + 0.3 * math.log(2))):
        seen, stated = _coverage(order_statistic, draw, median, n)
        assert seen == pytest.approx(stated, abs=TOLERANCE), (draw.__name__, n, seen, stated)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_t_log_covers_the_geometric_mean_at_its_level_under_log_normal_noise(n):
    seen, stated = _coverage(t_log, _lognormal, 1.2, n)
    assert stated == pytest.approx(0.95)
    assert seen == pytest.approx(0.95, abs=TOLERANCE), (n, seen)


def test_the_coverage_check_catches_a_min_max_range_labelled_95_percent():
    """The old table's "95%" was the range of the trials: the simulation above must see it is not 95%."""

    def min_max_said_95(values, level):
        x = sorted(values)
        return Interval(float(np.median(x)), x[0], x[-1], len(x), 0.95, "range")

    seen, stated = _coverage(min_max_said_95, _lognormal, 1.2, 3)
    assert abs(seen - stated) > 4 * TOLERANCE  # 75% seen against 95% stated


def test_order_statistic_coverage_is_the_binomial_formula():
    assert order_statistic_coverage(2, 1) == pytest.approx(0.5)
    assert order_statistic_coverage(5, 1) == pytest.approx(1 - 2 * 0.5**5)
    assert order_statistic_coverage(6, 1) == pytest.approx(1 - 2 * 0.5**6)
    assert math.isnan(order_statistic_coverage(5, 3))  # k beyond the middle: no interval


def test_order_statistic_takes_the_narrowest_interval_that_reaches_the_level():
    iv = order_statistic(list(range(1, 21)))  # 20 values: [x(6), x(15)] covers 95.9%
    assert (iv.lo, iv.hi, iv.n) == (6.0, 15.0, 20) and iv.coverage >= 0.95
    assert order_statistic_coverage(20, 7) < 0.95  # one step narrower would not
    few = order_statistic([1.3, 1.1, 1.2, 1.05, 1.25])
    assert (few.lo, few.hi, few.median) == (1.05, 1.3, 1.2) and few.coverage == pytest.approx(0.9375)


def test_one_value_has_no_interval_and_nan_is_dropped():
    for method in ("order_statistic", "t_log"):
        iv = interval([1.4, math.nan, None], method)
        assert iv.n == 1 and iv.median == pytest.approx(1.4) and math.isnan(iv.lo) and math.isnan(iv.hi)
        assert verdict(iv) == ONE_TRIAL
        assert interval([], method).n == 0


def test_unknown_method_and_non_positive_ratios_name_the_fix():
    with pytest.raises(ValueError, match="compare.interval=order_statistic or t_log"):
        interval([1.0, 2.0], "bootstrap")
    with pytest.raises(ValueError, match="compare.interval=order_statistic"):
        t_log([1.0, -0.5, 2.0])


def _iv(lo: float, hi: float, n: int = 5) -> Interval:
    return Interval((lo + hi) / 2, lo, hi, n, 0.9375, "order_statistic")


def test_minimum_effect_rule():
    assert verdict(_iv(1.03, 1.20)) == BETTER
    assert verdict(_iv(1.002, 1.006)) == SAME  # the old table called this "better"
    assert verdict(_iv(1.002, 1.006), min_effect=0.0) == BETTER  # only without a minimum effect
    assert verdict(_iv(1.01, 1.30)) == NOISE  # could be below 2%
    assert verdict(_iv(0.80, 0.97)) == WORSE
    assert verdict(_iv(0.985, 0.99)) == SAME
    assert verdict(_iv(0.90, 1.10)) == NOISE
    assert verdict(_iv(1.05, 1.2), min_effect=0.10) == NOISE
    with pytest.raises(ValueError, match="compare.min_effect"):
        verdict(_iv(1.1, 1.2), min_effect=-0.01)


def test_text_and_coverage_text_say_how_many_trials():
    assert order_statistic([1.0, 1.2, 1.1]).text().endswith("(n=3)")
    assert order_statistic([1.1]).text() == "1.100 (n=1)"
    assert coverage_text([order_statistic([1, 2, 3, 4, 5]), order_statistic([1, 2, 3])]) == "75.0% at n=3, 93.8% at n=5"
    assert coverage_text([order_statistic([1.0])]).startswith("no interval")
