"""Intervals around the centre of a few trials' values, each with the coverage it really has, and the
verdict a gain's interval supports under a stated minimum effect. Pure (numpy, scipy.stats).

Two methods, chosen by name (``compare.interval``; ``METHODS`` is the registry):

- ``order_statistic`` (default): the distribution-free interval for the median, ``[x(k), x(n+1-k)]`` of
  the sorted values, with the largest ``k`` whose coverage ``1 - 2 * Binom(n, 1/2).cdf(k - 1)`` still
  reaches the asked level. Its coverage is exact for any continuous distribution; with few values it
  cannot reach 95% (5 values: ``[min, max]``, 93.75%), and the interval then says what it has.
- ``t_log``: a Student-t interval on the logs of the values (for gains: paired per-trial ratios),
  exponentiated: an interval for the geometric mean, at exactly the asked level when the logs are
  roughly normal. Tighter than the order statistic at small n, but it rests on that assumption.

docs/goodput.md says why the verdict reads the interval of the measured whole-run gain and what the
minimum effect means.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

BETTER = "AccelPact better"
WORSE = "AccelPact worse"
SAME = "same within the minimum effect"
NOISE = "within noise"
ONE_TRIAL = "1 trial: no interval"
NO_DATA = "no data"
LEVEL = 0.95
MIN_EFFECT = 0.02  # "better" needs the whole interval above 1 + this (compare.min_effect)


@dataclass(frozen=True)
class Interval:
    """The centre of ``n`` values and an interval around it whose true ``coverage`` is stated (NaN bounds
    when n < 2). ``method``: the registry name of how it was drawn."""

    median: float
    lo: float
    hi: float
    n: int
    coverage: float = math.nan
    method: str = ""

    def text(self, spec: str = ".3f") -> str:
        """``1.234 [1.101, 1.350] (n=5)``; ``1.234 (n=1)`` without an interval; ``-`` without data."""
        if self.n == 0:
            return "-"
        if math.isnan(self.lo):
            return f"{self.median:{spec}} (n={self.n})"
        return f"{self.median:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}] (n={self.n})"


def _clean(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray(sorted(float(v) for v in values if v is not None and not math.isnan(float(v))), dtype=float)


@functools.cache
def order_statistic_coverage(n: int, k: int) -> float:
    """The probability that ``[x(k), x(n+1-k)]`` of ``n`` independent draws contains the true median."""
    if n < 2 or not 1 <= k <= n // 2:
        return math.nan
    return float(1.0 - 2.0 * stats.binom.cdf(k - 1, n, 0.5))


def order_statistic(values: Sequence[float | None], level: float = LEVEL) -> Interval:
    """The median and its distribution-free order-statistic interval (module docstring)."""
    x = _clean(values)
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, "order_statistic")
    med = float(np.median(x))
    if n == 1:
        return Interval(med, math.nan, math.nan, 1, math.nan, "order_statistic")
    k = 1
    while k + 1 <= n // 2 and order_statistic_coverage(n, k + 1) >= level:
        k += 1
    return Interval(med, float(x[k - 1]), float(x[n - k]), n, order_statistic_coverage(n, k), "order_statistic")


def t_log(values: Sequence[float | None], level: float = LEVEL) -> Interval:
    """The geometric mean of positive ``values`` and its Student-t interval on the log scale."""
    x = _clean(values)
    if x.size and (x <= 0).any():
        raise ValueError(f"t_log needs positive values (ratios); got {x.min():g}: use compare.interval=order_statistic")
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, "t_log")
    logs = np.log(x)
    centre = float(np.exp(logs.mean()))
    if n == 1:
        return Interval(centre, math.nan, math.nan, 1, math.nan, "t_log")
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n))
    return Interval(centre, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), n, level, "t_log")


METHODS: dict[str, Callable[[Sequence[float | None], float], Interval]] = {
    "order_statistic": order_statistic,
    "t_log": t_log,
}
DESCRIPTIONS: dict[str, str] = {
    "order_statistic": "distribution-free order-statistic interval for the median (exact coverage, any "
    "continuous distribution)",
    "t_log": "Student-t interval on the log of the paired per-trial values (a geometric mean; the coverage "
    "assumes log-normal noise)",
}
DEFAULT_METHOD = "order_statistic"


def interval(values: Sequence[float | None], method: str = DEFAULT_METHOD, level: float = LEVEL) -> Interval:
    """``values``' interval by the registered ``method``; ValueError naming the methods for an unknown one."""
    try:
        fn = METHODS[method]
    except KeyError:
        raise ValueError(
            f"unknown interval method {method!r}; try compare.interval={' or '.join(sorted(METHODS))}"
        ) from None
    return fn(values, level)


def coverage_text(ivs: Sequence[Interval]) -> str:
    """What the intervals of a table cover, for its footer: ``93.8% at n=5`` (each distinct n once)."""
    seen: dict[int, float] = {}
    for iv in ivs:
        if iv.n >= 2 and not math.isnan(iv.coverage):
            seen.setdefault(iv.n, iv.coverage)
    if not seen:
        return "no interval (fewer than 2 trials)"
    return ", ".join(f"{100 * c:.1f}% at n={n}" for n, c in sorted(seen.items()))


def verdict(gain: Interval, min_effect: float = MIN_EFFECT) -> str:
    """What the interval of AccelPact's gain (its goodput / the row's) supports, with a minimum effect
    ``min_effect`` (δ): better when the whole interval lies above ``1 + δ``, worse when wholly below
    ``1 / (1 + δ)``, the same when it lies wholly between those two, else within noise."""
    if min_effect < 0:
        raise ValueError(f"the minimum effect must be 0 or more, got {min_effect}; try compare.min_effect=0.02")
    if gain.n == 0:
        return NO_DATA
    if gain.n == 1 or math.isnan(gain.lo):
        return ONE_TRIAL
    up, down = 1.0 + min_effect, 1.0 / (1.0 + min_effect)
    if gain.lo > up:
        return BETTER
    if gain.hi < down:
        return WORSE
    if min_effect > 0 and down <= gain.lo and gain.hi <= up:
        return SAME
    return NOISE
