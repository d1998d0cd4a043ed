"""Projection: every strategy at one cluster size, over a grid of checkpoint intervals, by Monte Carlo.

For each strategy the grid spans 1/8x to 8x Daly's interval for the failures that roll that strategy back
to its checkpoint; the best interval is the grid point with the highest mean ETTR (Young and Daly are
printed beside it as a cross-check). A strategy whose failures arrive faster than it recovers
(sum over classes of rate x downtime >= 1) is reported as never finishing, with no number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.fleet.config import (
    CLASSES,
    ROLLBACK_CHECKPOINT,
    Cluster,
    FailureClass,
    Outcome,
    check_mix,
    check_number,
    check_outcomes,
)
from harness.scale import analytic
from harness.scale.engine import ROLLBACK_CODE, Lanes, mean_ci, simulate
from harness.scale.outcomes import outcome_table
from harness.strategies import simulated

GRID_FACTORS = tuple(float(x) for x in np.geomspace(1 / 8, 8, 10))


@dataclass(frozen=True)
class Projection:
    """One strategy at one cluster size."""

    strategy: str
    gpus: int
    feasible: bool
    reason: str = ""  # why it never finishes, when it does not
    intervals_s: tuple[float, ...] = ()  # work between checkpoints, the grid
    ettr: tuple[float, ...] = ()  # mean ETTR per grid point
    ettr_ci: tuple[float, ...] = ()  # 95% half-width per grid point
    best_interval_s: float = float("nan")
    best_ettr: float = float("nan")
    best_ci: float = float("nan")
    young_s: float = float("nan")
    daly_s: float = float("nan")
    badput: Mapping[str, float] = field(
        default_factory=dict
    )  # fraction of wall at the best interval, by class + checkpoint
    driver: str = ""  # one line: what costs this strategy most


def job_rates(mix: Mapping[str, FailureClass], gpus: int) -> np.ndarray:
    check_mix(mix)
    return np.array([mix[c].job_rate_per_s(gpus) for c in CLASSES])


def mttf_h(mix: Mapping[str, FailureClass], gpus: int) -> float:
    total = job_rates(mix, gpus).sum()
    return float("inf") if total == 0 else 1.0 / total / 3600.0


def _grid(cluster: Cluster, rates: np.ndarray, rollback_ckpt: np.ndarray) -> tuple[np.ndarray, float, float]:
    lam = float((rates * rollback_ckpt).sum())
    c = max(cluster.checkpoint_write_s, cluster.step_s)
    if lam == 0:
        young = daly = cluster.horizon_s / 8
    else:
        young, daly = analytic.young_interval(c, 1 / lam), analytic.daly_interval(c, 1 / lam)
    grid = np.array([max(cluster.step_s, round(daly * f / cluster.step_s) * cluster.step_s) for f in GRID_FACTORS])
    return np.unique(grid), young, daly


def _driver(cluster: Cluster, strategy: str, badput: Mapping[str, float], table: Mapping) -> str:
    parts = sorted(((v, k) for k, v in badput.items() if k not in ("checkpoint", "protection")), reverse=True)
    tail = f"; per-step protection {badput['protection']:.1%}" if badput.get("protection") else ""
    if not parts or parts[0][0] <= 0:
        return f"checkpoint writes {badput.get('checkpoint', 0):.1%}{tail}"
    share, cls = parts[0]
    outcome = table[strategy][cls]
    top = sorted(outcome.parts.items(), key=lambda kv: -kv[1])[:2]
    how = " + ".join(f"{k} {v:.0f} s" for k, v in top if v >= 0.5) or "sub-second stop"
    roll = {"checkpoint": "replay to checkpoint", "step": "one step lost", "none": "no replay"}[outcome.rollback]
    return f"{cls} {share:.1%} ({how}; {roll}); checkpoint writes {badput.get('checkpoint', 0):.1%}{tail}"


def project(
    cluster: Cluster,
    mix: Mapping[str, FailureClass],
    strategies: Sequence[str] | None = None,
    trials: int = 16,
    seed: int = 0,
    outcomes: Mapping[str, Mapping[str, Outcome]] | None = None,
    tax: Mapping[str, float] | None = None,
) -> list[Projection]:
    """Monte Carlo ETTR per strategy and checkpoint interval at ``cluster.gpus``; all lanes in one run.
    ``strategies``: default every simulated strategy (``harness.strategies.simulated``).
    ``outcomes``: rows that replace a strategy's outcome table (the advisor's heal at a given cadence).
    ``tax``: a strategy's per-step protection cost as a fraction of the step: its steps take (1 + tax) x
    ``cluster.step_s`` of wall for a step's work, so its ETTR is the engine's / (1 + tax), and the difference
    is reported as badput ``protection``."""
    sims = simulated()
    strategies = tuple(sims) if strategies is None else tuple(strategies)
    table = outcome_table(cluster, strategies)
    if outcomes:
        check_outcomes(outcomes, tuple(outcomes))
        table.update({s: dict(rows) for s, rows in outcomes.items() if s in table})
    tax = {s: check_number(f"tax.{s}", t) for s, t in (tax or {}).items()}
    rates = job_rates(mix, cluster.gpus)
    K = len(CLASSES)
    out: dict[str, Projection] = {}
    blocks: list[tuple[str, np.ndarray, float, float]] = []
    step_l, tau_l, c_l, d_l, r_l, rate_l = [], [], [], [], [], []
    for s in strategies:
        d = np.array([table[s][c].downtime_s for c in CLASSES])
        roll = np.array([ROLLBACK_CODE[table[s][c].rollback] for c in CLASSES])
        fault_free = sims[s].fault_free
        lam = np.zeros(K) if fault_free else rates
        load = float((lam * d).sum())
        if load >= 1.0:
            out[s] = Projection(
                s,
                cluster.gpus,
                False,
                reason=(
                    f"never finishes: a failure every {1 / lam.sum():.0f} s against a mean recovery of "
                    f"{load / lam.sum():.0f} s (failure rate x recovery time = {load:.2f} >= 1)"
                ),
            )
            continue
        if fault_free:
            grid, young, daly = np.array([np.inf]), float("nan"), float("nan")
        else:
            grid, young, daly = _grid(
                cluster, rates, np.array([table[s][c].rollback == ROLLBACK_CHECKPOINT for c in CLASSES])
            )
        blocks.append((s, grid, young, daly))
        n = len(grid) * trials
        step_l.append(np.full(n, cluster.step_s * (1 + tax.get(s, 0.0))))
        tau_l.append(np.repeat(grid, trials))
        c_l.append(np.full(n, cluster.checkpoint_write_s))
        d_l.append(np.tile(d, (n, 1)))
        r_l.append(np.tile(roll, (n, 1)))
        rate_l.append(np.tile(lam, (n, 1)))
    if blocks:
        lanes = Lanes(
            np.concatenate(step_l),
            np.concatenate(tau_l),
            np.concatenate(c_l),
            np.concatenate(d_l),
            np.concatenate(r_l),
            np.concatenate(rate_l),
        )
        res = simulate(lanes, horizon_s=cluster.horizon_s, rng=np.random.default_rng(seed))
        ettr = res.ettr
        i = 0
        for s, grid, young, daly in blocks:
            means, cis = [], []
            keep = 1.0 / (1.0 + tax.get(s, 0.0))
            for _ in grid:
                m, ci = mean_ci(ettr[i : i + trials] * keep)
                means.append(m)
                cis.append(ci)
                i += trials
            b = int(np.nanargmax(means))
            lo = i - (len(grid) - b) * trials
            sl = slice(lo, lo + trials)
            wall = res.wall_s[sl].sum()
            badput = {
                c: float((res.downtime_s[sl, k].sum() + res.lost_s[sl, k].sum()) / wall) for k, c in enumerate(CLASSES)
            }
            badput["checkpoint"] = float(res.checkpoint_s[sl].sum() / wall)
            if tax.get(s):
                badput["protection"] = float(res.useful_s[sl].sum() / wall * (1 - keep))
            out[s] = Projection(
                s,
                cluster.gpus,
                True,
                intervals_s=tuple(map(float, grid)),
                ettr=tuple(means),
                ettr_ci=tuple(cis),
                best_interval_s=float(grid[b]),
                best_ettr=means[b],
                best_ci=cis[b],
                young_s=young,
                daly_s=daly,
                badput=badput,
                driver="no failures" if sims[s].fault_free else _driver(cluster, s, badput, table),
            )
    return [out[s] for s in strategies]
