"""A 95% interval around the median of a few trials' gains, and the verdict it supports. Pure (numpy).

The interval is a percentile bootstrap of the median over trials: resample the trials with replacement,
take each resample's median, and keep the 2.5th and 97.5th percentiles. With a handful of trials it
cannot reach beyond the smallest and largest gain, which is the honest width for so few. The resampling
uses a fixed seed, so the same gains always print the same interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

BETTER = "AccelPact better"
WORSE = "AccelPact worse"
NOISE = "within noise"
ONE_TRIAL = "1 trial: no interval"
NO_DATA = "no data"
RESAMPLES = 4000
SEED = 20


@dataclass(frozen=True)
class Interval:
    """Median of ``n`` values and a ``level`` interval around it (NaN bounds when n < 2)."""

    median: float
    lo: float
    hi: float
    n: int
    level: float = 0.95

    def text(self, spec: str = ".3f") -> str:
        """``1.234 [1.101, 1.350] (n=5)``; ``1.234 (n=1)`` without an interval; ``-`` without data."""
        if self.n == 0:
            return "-"
        if math.isnan(self.lo):
            return f"{self.median:{spec}} (n={self.n})"
        return f"{self.median:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}] (n={self.n})"


def bootstrap_median(values: Sequence[float], level: float = 0.95, resamples: int = RESAMPLES,
                     seed: int = SEED) -> Interval:
    """The median of ``values`` (NaNs dropped) and its percentile-bootstrap ``level`` interval."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    med = float(np.median(x))
    if x.size == 1:
        return Interval(med, math.nan, math.nan, 1, level)
    rng = np.random.default_rng(seed)
    meds = np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(meds, [alpha, 1.0 - alpha])
    return Interval(med, float(lo), float(hi), int(x.size), level)


def verdict(gain: Interval, equal: float = 1.0) -> str:
    """What the interval of AccelPact's gain (its goodput / the row's) supports: better when it lies
    wholly above ``equal``, worse when wholly below, else within noise."""
    if gain.n == 0:
        return NO_DATA
    if gain.n == 1:
        return ONE_TRIAL
    if gain.lo > equal:
        return BETTER
    if gain.hi < equal:
        return WORSE
    return NOISE
