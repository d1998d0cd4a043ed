"""The bootstrap interval of a median and the verdict drawn from it."""

from __future__ import annotations

import math

import pytest

from harness.report.intervals import BETTER, NOISE, ONE_TRIAL, WORSE, bootstrap_median, verdict


def test_interval_brackets_the_median_and_stays_inside_the_data():
    gains = [1.10, 1.25, 1.18, 1.31, 1.05]
    iv = bootstrap_median(gains)
    assert iv.median == pytest.approx(1.18) and iv.n == 5
    assert min(gains) <= iv.lo <= iv.median <= iv.hi <= max(gains)
    assert iv.lo < iv.hi


def test_interval_is_reproducible_and_shrinks_with_more_trials():
    few = [1.0, 1.3, 1.1, 1.2]
    assert bootstrap_median(few) == bootstrap_median(few)
    many = few * 10
    a, b = bootstrap_median(few), bootstrap_median(many)
    assert (b.hi - b.lo) < (a.hi - a.lo)


def test_one_trial_has_no_interval_and_nan_is_dropped():
    iv = bootstrap_median([1.4, math.nan])
    assert iv.n == 1 and iv.median == 1.4 and math.isnan(iv.lo) and math.isnan(iv.hi)
    assert verdict(iv) == ONE_TRIAL
    assert bootstrap_median([]).n == 0


def test_verdicts():
    assert verdict(bootstrap_median([1.2, 1.3, 1.25])) == BETTER
    assert verdict(bootstrap_median([0.7, 0.8, 0.75])) == WORSE
    # one trial on the other side of 1 pulls the interval across it
    assert verdict(bootstrap_median([0.9, 1.2, 1.25, 1.3])) == NOISE
    assert verdict(bootstrap_median([0.95, 1.05, 1.0])) == NOISE


def test_text_says_how_many_trials():
    assert bootstrap_median([1.0, 1.2, 1.1]).text().endswith("(n=3)")
    assert bootstrap_median([1.1]).text() == "1.100 (n=1)"
