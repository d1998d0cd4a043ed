"""Calibration: the engine, fed with this machine's measured costs and the exact fault schedules of the
committed goodput_vs_age runs, must give each run's measured whole-run goodput (tokens / wall seconds).

What is taken from the measurements and what the engine computes:
- Per run (the shared 2-core host's load moves them from run to run): the step time, as the run's useful
  seconds over its steps (its mean first-execution step), and the checkpoint write, as the run's
  checkpoint seconds (one save lands inside the measured window: after step interval-1; the save after
  the last step falls after the window's end).
- Per strategy (median over the age sweep, so no run is fed its own recovery): the job-wide stop (in-memory
  recovery + restart + restore) and the work destroyed by the fault itself (the in-flight attempt and the
  gaps around it: the fault's ``other`` seconds, plus for an in-memory retry the thrown-away attempt).
- The engine computes the rest: the fault lands ``age`` steps after the checkpoint plus that destroyed
  work, the rollback (to the checkpoint, or the step in flight for AccelPact) sets the replay, and the
  wall time is where the work reaches the run's step count.

With trials (a ``trial`` column: several runs per (strategy, age), each trial with its own reference), every
run is still replayed with its own step and checkpoint write, so each trial's runs are calibrated against
that trial's measured pace; the per-strategy costs are the medians over all trials' runs. The verdict is
per (strategy, age) cell: the median over trials of the error (simulated / measured - 1) and its order-statistic
interval (``error_intervals``); a sweep of one trial has no interval. A file without a ``trial``
column is one trial.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from harness.fleet.config import ScaleConfigError
from harness.scale.engine import CHECKPOINT, ROLLBACK_CODE, STEP, Lanes, Schedule, simulate
from harness.strategies import simulated

_BADPUT = (
    "detection_s",
    "agreement_s",
    "rebuild_s",
    "rebind_s",
    "restart_s",
    "restore_s",
    "replay_s",
    "checkpoint_s",
    "other_s",
)
# The calibration's acceptance: each (strategy, age) cell's median error over trials within 5%
# (tests/scale/test_scale_calibration.py and test_scale_heal_calibration.py enforce it on the committed data).
LIMIT = 0.05
# How each harness strategy recovers from the calibration fault (a socket reset: a transient network
# fault), from the strategy registry (``Simulation.calibration_rollback``).
ROLLBACK = {
    name: ROLLBACK_CODE[sim.calibration_rollback]
    for name, sim in simulated().items()
    if sim.calibration_rollback is not None
}


@dataclass(frozen=True)
class MeasuredRun:
    strategy: str
    age: int | None  # None for the fault-free reference
    goodput: float  # tokens / wall s, as the harness measured it
    tokens: float
    step_s: float  # useful seconds / steps
    median_step_s: float
    checkpoint_s: float
    trial: int = 0  # the sweep's round (0 when data.csv has no ``trial`` column: one trial)


@dataclass(frozen=True)
class MeasuredCosts:
    """One strategy's recovery from the calibration fault, medians over the runs (every age and trial)."""

    strategy: str
    downtime_s: float  # in-memory recovery + restart + restore
    destroyed_s: float  # work the fault destroyed in flight (plus the gaps around it)
    runs: int


@dataclass(frozen=True)
class CalibrationRow:
    strategy: str
    age: int | None
    measured: float
    simulated: float
    simulated_median_step: float  # the same with the median step instead of the mean: the missed cost
    trial: int = 0

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0

    @property
    def error_median_step(self) -> float:
        return self.simulated_median_step / self.measured - 1.0


def _f(row: dict[str, str], key: str) -> float:
    return float(row[key]) if row.get(key, "") not in ("", None) else 0.0


def age_of(row: dict[str, str]) -> int | None:
    """A data.csv row's checkpoint age; None for the fault-free reference (an empty or nan cell)."""
    v = (row.get("age") or "").strip()
    return None if v.lower() in ("", "nan", "none") else int(float(v))


def trial_of(row: dict[str, str]) -> int:
    """A data.csv row's trial; 0 when the file has no ``trial`` column (a sweep of one trial)."""
    v = (row.get("trial") or "").strip()
    return 0 if v == "" else int(float(v))


def check_one_run_per_trial(keys: list[tuple], where: str) -> None:
    """Refuse a sweep with two ok runs for the same cell and trial: the interval over trials would count
    one trial twice."""
    seen: set[tuple] = set()
    for k in keys:
        if k in seen:
            raise ScaleConfigError(
                f"{where} has two ok runs for cell {k[:-1]} in trial {k[-1]}: the calibration expects one run per "
                "cell and trial (give each round its own `trial` value, or regenerate the file with the experiment)"
            )
        seen.add(k)


def load_runs(results_dir: str | Path) -> tuple[list[MeasuredRun], list[dict[str, str]], dict]:
    """The ok runs in ``results_dir/data.csv`` (every trial's) and the sweep's settings from its
    provenance.json."""
    d = Path(results_dir)
    extra = json.loads((d / "provenance.json").read_text())["extra"]
    steps = int(extra["steps"])
    with (d / "data.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "ok"]
    runs = []
    for r in rows:
        useful = _f(r, "wall_s") - sum(_f(r, k) for k in _BADPUT)
        runs.append(
            MeasuredRun(
                r["strategy"],
                age_of(r),
                _f(r, "goodput"),
                _f(r, "tokens"),
                useful / steps,
                _f(r, "step_median_s"),
                _f(r, "checkpoint_s"),
                trial_of(r),
            )
        )
    check_one_run_per_trial([(r.strategy, r.age, r.trial) for r in runs], f"{d}/data.csv")
    return runs, rows, extra


def measured_costs(rows: list[dict[str, str]]) -> dict[str, MeasuredCosts]:
    """Per strategy: the medians of the fault's stop and of the work it destroyed, over the sweep (every age
    and every trial: one cost per strategy, as the projection uses it)."""
    out = {}
    for strategy in ROLLBACK:
        mine = [r for r in rows if r["strategy"] == strategy]
        if not mine:
            continue
        stop = [
            sum(_f(r, f"fault_{k}_s") for k in ("detection", "agreement", "rebuild", "rebind", "restart", "restore"))
            for r in mine
        ]
        # The destroyed attempt: for a retry in memory the harness labels it replay (the step re-ran);
        # for a restore-based strategy replay is the `age` whole steps, which the engine computes itself.
        destroyed = [
            _f(r, "fault_other_s") + (_f(r, "fault_replay_s") if ROLLBACK[strategy] == STEP else 0.0) for r in mine
        ]
        out[strategy] = MeasuredCosts(strategy, statistics.median(stop), statistics.median(destroyed), len(mine))
    return out


def own_costs(row: dict[str, str], strategy: str) -> MeasuredCosts:
    """One run's own stop and destroyed work (the same columns ``measured_costs`` takes medians of)."""
    stop = sum(_f(row, f"fault_{k}_s") for k in ("detection", "agreement", "rebuild", "rebind", "restart", "restore"))
    destroyed = _f(row, "fault_other_s") + (_f(row, "fault_replay_s") if ROLLBACK[strategy] == STEP else 0.0)
    return MeasuredCosts(strategy, stop, destroyed, 1)


def _simulate(
    runs: list[MeasuredRun],
    costs: dict[str, MeasuredCosts] | list[MeasuredCosts | None],
    steps: int,
    interval: int,
    use_median: bool,
) -> np.ndarray:
    n = len(runs)
    step = np.array([r.median_step_s if use_median else r.step_s for r in runs])
    down = np.zeros((n, 1))
    roll = np.full((n, 1), CHECKPOINT)
    t_fail = np.full((n, 1), np.inf)
    for i, r in enumerate(runs):
        if r.age is None:
            continue
        cost = cast(
            MeasuredCosts, costs[i] if isinstance(costs, list) else costs[r.strategy]
        )  # a run with an age has costs
        down[i, 0] = cost.downtime_s
        roll[i, 0] = ROLLBACK[r.strategy]
        # The fault hits `age` steps after the checkpoint (taken after step interval-1), once the destroyed
        # work has run; before it, exactly one checkpoint write has happened.
        progress = (interval + r.age) * step[i] + cost.destroyed_s
        t_fail[i, 0] = progress + r.checkpoint_s * (progress // (interval * step[i]))
    lanes = Lanes(step, interval * step, np.array([r.checkpoint_s for r in runs]), down, roll, np.zeros((n, 1)))
    res = simulate(lanes, work_s=steps * step, schedule=Schedule(t_fail, np.zeros((n, 1), dtype=int)))
    return np.array([r.tokens for r in runs]) / res.wall_s


def calibrate(results_dir: str | Path, own: bool = False) -> list[CalibrationRow]:
    """Simulated vs measured whole-run goodput for every run (every trial's) of a goodput_vs_age-style sweep.

    ``own=False`` (the calibration): every run is fed its strategy's median costs (``measured_costs``), so no
    run is fed its own recovery; on a loaded host a cold restart's stop moves from run to run (7-23 s in one
    5-trial sweep at load ~4), and that spread shows as the error's interval. ``own=True`` (the engine's
    replay check): every run is fed its own measured stop and destroyed work, so what is left is the
    engine's accounting of the schedule, the rollback, the replay and the checkpoint."""
    runs, rows, extra = load_runs(results_dir)
    costs: dict[str, MeasuredCosts] | list[MeasuredCosts | None] = measured_costs(rows)
    if own:
        costs = [
            own_costs(row, r.strategy) if r.age is not None and r.strategy in ROLLBACK else None
            for r, row in zip(runs, rows)
        ]
    steps, interval = int(extra["steps"]), int(extra["interval"])
    sim = _simulate(runs, costs, steps, interval, use_median=False)
    sim_med = _simulate(runs, costs, steps, interval, use_median=True)
    return [
        CalibrationRow(r.strategy, r.age, r.goodput, float(a), float(b), r.trial) for r, a, b in zip(runs, sim, sim_med)
    ]


def error_text(median: float, lo: float, hi: float, n: int) -> str:
    """``+1.2% [-0.4%, +2.5%] (n=3)``; with one trial ``+1.2% (n=1: no interval)``."""
    if n < 2 or lo != lo:
        return f"{median:+.1%} (n={n}: no interval)"
    return f"{median:+.1%} [{lo:+.1%}, {hi:+.1%}] (n={n})"


@dataclass(frozen=True)
class CalibrationError:
    """The simulator's error on one (strategy, age) cell over the trials of a sweep: median and order-statistic interval
    (NaN bounds with one trial), beside the cell's median measured and simulated goodput."""

    strategy: str
    age: int | None
    error_median: float
    error_lo: float
    error_hi: float
    trials: int
    measured: float = float("nan")  # median over the cell's trials, tokens / wall s
    simulated: float = float("nan")  # median over the cell's trials
    error_median_step: float = float("nan")  # median over trials of the error with the median step

    def text(self) -> str:
        return error_text(self.error_median, self.error_lo, self.error_hi, self.trials)


def error_intervals(rows: list[CalibrationRow]) -> list[CalibrationError]:
    """Per (strategy, age), in the order the cells first appear, the calibration error (simulated /
    measured - 1) over the sweep's trials: its median and distribution-free order-statistic interval (coverage 1 - 2^(1-n) for [min, max])
    (harness.report.intervals). A sweep of one trial gives n=1 and no interval."""
    from harness.report.intervals import order_statistic  # lazy: scipy

    groups: dict[tuple[str, int | None], list[CalibrationRow]] = {}
    for r in rows:
        groups.setdefault((r.strategy, r.age), []).append(r)
    out = []
    for (strategy, age), mine in groups.items():
        iv = order_statistic([r.error for r in mine])
        out.append(
            CalibrationError(
                strategy,
                age,
                iv.median,
                iv.lo,
                iv.hi,
                iv.n,
                statistics.median(r.measured for r in mine),
                statistics.median(r.simulated for r in mine),
                statistics.median(r.error_median_step for r in mine),
            )
        )
    return out
