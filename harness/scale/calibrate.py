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
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.scale.engine import CHECKPOINT, ROLLBACK_CODE, STEP, Lanes, Schedule, simulate
from harness.strategies import simulated

_BADPUT = ("detection_s", "agreement_s", "rebuild_s", "rebind_s", "restart_s", "restore_s", "replay_s",
           "checkpoint_s", "other_s")
# How each harness strategy recovers from the calibration fault (a socket reset: a transient network
# fault), from the strategy registry (``Simulation.calibration_rollback``).
ROLLBACK = {name: ROLLBACK_CODE[sim.calibration_rollback] for name, sim in simulated().items()
            if sim.calibration_rollback is not None}


@dataclass(frozen=True)
class MeasuredRun:
    strategy: str
    age: int | None  # None for the fault-free reference
    goodput: float  # tokens / wall s, as the harness measured it
    tokens: float
    step_s: float  # useful seconds / steps
    median_step_s: float
    checkpoint_s: float


@dataclass(frozen=True)
class MeasuredCosts:
    """One strategy's recovery from the calibration fault, medians over the runs."""

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

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0

    @property
    def error_median_step(self) -> float:
        return self.simulated_median_step / self.measured - 1.0


def _f(row: dict[str, str], key: str) -> float:
    return float(row[key]) if row.get(key, "") not in ("", None) else 0.0


def load_runs(results_dir: str | Path) -> tuple[list[MeasuredRun], list[dict[str, str]], dict]:
    """The runs in ``results_dir/data.csv`` and the sweep's settings from its provenance.json."""
    d = Path(results_dir)
    extra = json.loads((d / "provenance.json").read_text())["extra"]
    steps = int(extra["steps"])
    rows = [r for r in csv.DictReader((d / "data.csv").open()) if r["status"] == "ok"]
    runs = []
    for r in rows:
        useful = _f(r, "wall_s") - sum(_f(r, k) for k in _BADPUT)
        runs.append(MeasuredRun(r["strategy"], int(r["age"]) if r["age"] else None, _f(r, "goodput"),
                                _f(r, "tokens"), useful / steps, _f(r, "step_median_s"), _f(r, "checkpoint_s")))
    return runs, rows, extra


def measured_costs(rows: list[dict[str, str]]) -> dict[str, MeasuredCosts]:
    """Per strategy: the medians of the fault's stop and of the work it destroyed, over the sweep."""
    out = {}
    for strategy in ROLLBACK:
        mine = [r for r in rows if r["strategy"] == strategy]
        if not mine:
            continue
        stop = [sum(_f(r, f"fault_{k}_s") for k in ("detection", "agreement", "rebuild", "rebind", "restart",
                                                      "restore")) for r in mine]
        # The destroyed attempt: for a retry in memory the harness labels it replay (the step re-ran);
        # for a restore-based strategy replay is the `age` whole steps, which the engine computes itself.
        destroyed = [_f(r, "fault_other_s") + (_f(r, "fault_replay_s") if ROLLBACK[strategy] == STEP else 0.0)
                     for r in mine]
        out[strategy] = MeasuredCosts(strategy, statistics.median(stop), statistics.median(destroyed), len(mine))
    return out


def _simulate(runs: list[MeasuredRun], costs: dict[str, MeasuredCosts], steps: int, interval: int,
              use_median: bool) -> np.ndarray:
    n = len(runs)
    step = np.array([r.median_step_s if use_median else r.step_s for r in runs])
    down = np.zeros((n, 1))
    roll = np.full((n, 1), CHECKPOINT)
    t_fail = np.full((n, 1), np.inf)
    for i, r in enumerate(runs):
        if r.age is None:
            continue
        cost = costs[r.strategy]
        down[i, 0] = cost.downtime_s
        roll[i, 0] = ROLLBACK[r.strategy]
        # The fault hits `age` steps after the checkpoint (taken after step interval-1), once the destroyed
        # work has run; before it, exactly one checkpoint write has happened.
        progress = (interval + r.age) * step[i] + cost.destroyed_s
        t_fail[i, 0] = progress + r.checkpoint_s * (progress // (interval * step[i]))
    lanes = Lanes(step, interval * step, np.array([r.checkpoint_s for r in runs]), down, roll, np.zeros((n, 1)))
    res = simulate(lanes, work_s=steps * step, schedule=Schedule(t_fail, np.zeros((n, 1), dtype=int)))
    return np.array([r.tokens for r in runs]) / res.wall_s


def calibrate(results_dir: str | Path) -> list[CalibrationRow]:
    """Simulated vs measured whole-run goodput for every run of a goodput_vs_age-style sweep."""
    runs, rows, extra = load_runs(results_dir)
    costs = measured_costs(rows)
    steps, interval = int(extra["steps"]), int(extra["interval"])
    sim = _simulate(runs, costs, steps, interval, use_median=False)
    sim_med = _simulate(runs, costs, steps, interval, use_median=True)
    return [CalibrationRow(r.strategy, r.age, r.goodput, float(a), float(b)) for r, a, b in zip(runs, sim, sim_med)]


@dataclass(frozen=True)
class CalibrationError:
    """The simulator's error on one (strategy, age) cell over the trials of a sweep: median and 95% interval."""

    strategy: str
    age: int | None
    error_median: float
    error_lo: float
    error_hi: float
    trials: int


def error_intervals(rows: list[CalibrationRow]) -> list[CalibrationError]:
    """Per (strategy, age), the calibration error (simulated / measured - 1) over the sweep's trials: its
    median and percentile-bootstrap 95% interval (harness.report.intervals). A sweep of one trial gives
    n=1 and no interval."""
    from harness.report.intervals import bootstrap_median

    groups: dict[tuple[str, int | None], list[float]] = {}
    for r in rows:
        groups.setdefault((r.strategy, r.age), []).append(r.error)
    out = []
    for (strategy, age), errors in groups.items():
        iv = bootstrap_median(errors)
        out.append(CalibrationError(strategy, age, iv.median, iv.lo, iv.hi, iv.n))
    return out
