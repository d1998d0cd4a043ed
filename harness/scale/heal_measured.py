"""AccelPact's in-memory heal as measured in results/process_loss: its costs, and the check that the engine
reproduces those runs' goodput.

results/process_loss/data.csv holds, per run, the harness's badput parts of the fault (columns
``part_<name>_s``): for a heal ``part_detection_s`` (the fault until every rank knew),
``part_replacement_start_s``, ``part_heal_transfer_s`` (up to the replacement being ready) and
``part_replay_s`` (the survivor's attempt in flight, thrown away), plus ``part_other_s``; for a restart
``part_restart_s``, ``part_restore_s`` and ``part_replay_s`` (the ``age`` replayed steps). Its ``fault``
column is ``kill`` (a SIGKILLed rank, host fine: this simulator's ``process_crash``) or ``host_loss`` (the
rank's host gone with its shared memory: ``gpu_host_loss``).

What is taken from the measurements, as ``harness.scale.calibrate`` does for results/goodput_vs_age:
- per run: the step (``useful_s`` / the sweep's steps) and the non-fault badput (``badput_total_s`` minus
  the fault's parts: the one checkpoint write inside the measured window, and the per-step noise the
  harness charges as badput);
- per (strategy, fault), medians over the ages: the job-wide stop (detection + replacement start + heal
  transfer, or restart + restore) and the work the fault destroyed (``part_other_s``, plus for a heal the
  thrown-away attempt, ``part_replay_s``).
The engine computes the rest; the measured goodput is the ``goodput`` column, the harness's useful tokens over
the timeline's wall (``useful_s + badput_total_s``).

With trials (a ``trial`` column, each trial with its own reference) every run is replayed with its own step
and non-fault badput, and the medians above are over all trials' runs. The verdict is per (fault, strategy,
age) cell: the medians over trials of the measured and simulated goodput, and the error's median with its
order-statistic interval (``heal_error_intervals``; one trial: no interval).

The same medians feed the projection (``harness.scale.outcomes.rebind_and_heal_in_memory``): the parts
measured at 2 ranks are the heal's size-independent cost; ``harness.scale.scaling`` adds what grows.
"""

from __future__ import annotations

import csv
import functools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.fleet.config import ScaleConfigError
from harness.scale.calibrate import age_of, check_one_run_per_trial, error_text, trial_of
from harness.scale.engine import CHECKPOINT, STEP, Lanes, Schedule, simulate

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "process_loss"
# The harness's fault kinds in that experiment -> this simulator's failure classes.
FAULT_CLASS = {"kill": "process_crash", "host_loss": "gpu_host_loss"}
# The outcome builders (harness.scale.outcomes) whose heal of a lost process or host uses these costs.
HEAL_BUILDS = (
    "harness.scale.outcomes:rebind_and_heal_in_memory",
    "harness.scale.outcomes:reconfigure_and_heal_in_memory",
)
HEAL_PARTS = ("detection", "replacement_start", "heal_transfer")
RESTART_PARTS = ("detection", "agreement", "rebuild", "rebind", "restart", "restore")
_ALL_PARTS = (
    "agreement",
    "checkpoint",
    "detection",
    "heal_transfer",
    "other",
    "rebind",
    "rebuild",
    "replacement_start",
    "replay",
    "restart",
    "restore",
    "snapshot_overhead",
)


def _f(row: dict[str, str], key: str) -> float:
    v = row.get(key, "")
    if v in ("", None):
        return 0.0
    x = float(v)
    return 0.0 if x != x else x  # nan: the column does not apply to this run


@dataclass(frozen=True)
class HealCosts:
    """One fault's heal, medians over the measured runs of every age and trial (seconds), and where each came
    from."""

    fault: str
    parts: dict[str, float]  # detection, replacement_start, heal_transfer: the job-wide stop
    destroyed_s: float  # the attempt in flight thrown away (+ the gaps around it)
    runs: int
    source: str

    @property
    def stop_s(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class HealCalibrationRow:
    """One measured run of results/process_loss against the engine's replay of it."""

    fault: str
    strategy: str  # the harness strategy that ran (the process_loss row's ``strategy``)
    heals: bool  # healed in memory (rollback to the step in flight) rather than restored from disk
    age: int | None
    measured: float
    simulated: float
    stop_s: float  # the median stop fed to the engine
    trial: int = 0

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0


@dataclass(frozen=True)
class HealCalibrationCell:
    """One (fault, strategy, recovery, age) cell of results/process_loss over its trials: the medians of the
    measured and simulated goodput, and the error's median with its order-statistic interval (NaN bounds with
    one trial)."""

    fault: str
    strategy: str
    heals: bool
    age: int | None
    trials: int
    measured: float
    simulated: float
    error_median: float
    error_lo: float
    error_hi: float
    stop_s: float  # the median stop fed to the engine (one per fault, strategy and recovery)

    def text(self) -> str:
        return error_text(self.error_median, self.error_lo, self.error_hi, self.trials)


def _rows(results_dir: Path) -> tuple[list[dict[str, str]], dict]:
    data = results_dir / "data.csv"
    if not data.exists():
        raise ScaleConfigError(
            f"{data} is missing: the heal's costs come from the committed process_loss runs; "
            "run `python -m experiments.process_loss` or restore the file from git"
        )
    extra = json.loads((results_dir / "provenance.json").read_text())["extra"]
    rows = [r for r in csv.DictReader(data.open()) if r.get("status") == "ok"]
    for need in ("fault", "strategy", "heal_source", "useful_s", "useful_tokens", "badput_total_s"):
        if rows and need not in rows[0]:
            raise ScaleConfigError(
                f"{data} has no column {need!r}: the heal calibration reads it (see "
                "harness/scale/heal_measured.py); regenerate with experiments.process_loss"
            )
    return rows, extra


def _shown(d: Path) -> str:
    try:
        return d.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(d)


def _heals(row: dict[str, str]) -> bool:
    return row.get("heal_source", "") not in ("", "nan", "-")


@functools.lru_cache(maxsize=4)
def measured_heal(results_dir: str = str(RESULTS)) -> dict[str, HealCosts]:
    """{harness fault kind: HealCosts} from the heal runs (rows with a ``heal_source``) of process_loss."""
    d = Path(results_dir)
    rows, _ = _rows(d)
    out = {}
    for fault in FAULT_CLASS:
        mine = [r for r in rows if r["fault"] == fault and _heals(r)]
        if not mine:
            raise ScaleConfigError(
                f"{d}/data.csv has no heal run for fault={fault}: the heal's {FAULT_CLASS[fault]} "
                "cost needs one; run `python -m experiments.process_loss`"
            )
        parts = {p: statistics.median(_f(r, f"part_{p}_s") for r in mine) for p in HEAL_PARTS}
        destroyed = statistics.median(_f(r, "part_other_s") + _f(r, "part_replay_s") for r in mine)
        trials = len({trial_of(r) for r in mine})
        out[fault] = HealCosts(
            fault,
            parts,
            destroyed,
            len(mine),
            f"{_shown(d)}/data.csv, fault={fault}, "
            f"median over {len(mine)} heal runs ({trials} trial{'s' if trials != 1 else ''}) "
            "of columns " + ", ".join(f"part_{p}_s" for p in HEAL_PARTS),
        )
    return out


def calibrate_heal(results_dir: str | Path = RESULTS, own: bool = False) -> list[HealCalibrationRow]:
    """Every ok run of a process_loss-style sweep (reference, heals, restarts; every trial's), measured vs
    simulated goodput. ``own=True``: every run is fed its own stop and destroyed attempt instead of the
    medians (the engine's replay check, as ``harness.scale.calibrate.calibrate(own=True)``)."""
    d = Path(results_dir)
    rows, extra = _rows(d)
    check_one_run_per_trial([(r["fault"], r["strategy"], age_of(r), trial_of(r)) for r in rows], f"{d}/data.csv")
    steps, interval = int(extra["steps"]), int(extra["interval"])

    def stop(r: dict[str, str]) -> float:
        return sum(_f(r, f"part_{p}_s") for p in (HEAL_PARTS if _heals(r) else RESTART_PARTS))

    def destroyed(r: dict[str, str]) -> float:
        # A heal throws the attempt in flight away (labelled replay); a restore replays `age` whole steps,
        # which the engine computes itself from the rollback.
        return _f(r, "part_other_s") + (_f(r, "part_replay_s") if _heals(r) else 0.0)

    # One stop and one destroyed attempt per (fault, strategy, recovery): medians over every age and trial.
    # The recovery is in the key so that a trial whose heal fell back to a restart is not fed a heal's stop.
    groups: dict[tuple[str, str, bool], list[dict[str, str]]] = {}
    for r in rows:
        if age_of(r) is not None:
            groups.setdefault((r["fault"], r["strategy"], _heals(r)), []).append(r)
    med = {k: (statistics.median(map(stop, v)), statistics.median(map(destroyed, v))) for k, v in groups.items()}

    n = len(rows)
    step = np.array([_f(r, "useful_s") / steps for r in rows])
    ckpt = np.array([max(0.0, _f(r, "badput_total_s") - sum(_f(r, f"part_{p}_s") for p in _ALL_PARTS)) for r in rows])
    down, roll, t_fail = np.zeros((n, 1)), np.full((n, 1), CHECKPOINT), np.full((n, 1), np.inf)
    for i, r in enumerate(rows):
        age = age_of(r)
        if age is None:
            continue
        s, gone = (stop(r), destroyed(r)) if own else med[(r["fault"], r["strategy"], _heals(r))]
        down[i, 0] = s
        roll[i, 0] = STEP if _heals(r) else CHECKPOINT
        # The fault hits `age` steps after the checkpoint taken after step interval-1 (one write before it).
        progress = (interval + age) * step[i] + gone
        t_fail[i, 0] = progress + ckpt[i] * (progress // (interval * step[i]))
    lanes = Lanes(step, interval * step, ckpt, down, roll, np.zeros((n, 1)))
    res = simulate(lanes, work_s=steps * step, schedule=Schedule(t_fail, np.zeros((n, 1), dtype=int)))
    out = []
    for i, r in enumerate(rows):
        # The harness's goodput: useful tokens over the timeline's wall (useful_s + badput_total_s).
        out.append(
            HealCalibrationRow(
                r["fault"],
                r["strategy"],
                _heals(r),
                age_of(r),
                _f(r, "goodput"),
                float(_f(r, "useful_tokens") / res.wall_s[i]),
                float(down[i, 0]),
                trial_of(r),
            )
        )
    return out


def heal_error_intervals(rows: list[HealCalibrationRow]) -> list[HealCalibrationCell]:
    """Per (fault, strategy, recovery, age), in the order the cells first appear: the medians over the
    cell's trials and the error's median with its distribution-free order-statistic interval (coverage 1 - 2^(1-n) for [min, max])
    (harness.report.intervals). One trial gives n=1 and no interval."""
    from harness.report.intervals import order_statistic  # lazy: scipy

    groups: dict[tuple[str, str, bool, int | None], list[HealCalibrationRow]] = {}
    for r in rows:
        groups.setdefault((r.fault, r.strategy, r.heals, r.age), []).append(r)
    out = []
    for (fault, strategy, heals, age), mine in groups.items():
        iv = order_statistic([r.error for r in mine])
        out.append(
            HealCalibrationCell(
                fault,
                strategy,
                heals,
                age,
                iv.n,
                statistics.median(r.measured for r in mine),
                statistics.median(r.simulated for r in mine),
                iv.median,
                iv.lo,
                iv.hi,
                statistics.median(r.stop_s for r in mine),
            )
        )
    return out
