"""The calibrations over trials, on synthetic sweeps (pure logic, no harness runs): a data.csv with 3 trials
gives per cell the medians over trials, the error's 95% interval and n=3, each trial's runs are replayed at
their own pace, the costs are medians over every trial's runs, and a 1-trial file (no ``trial`` column)
still works and says it has no interval."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from experiments import scale_projection_calibration as spc
from harness.fleet.config import ScaleConfigError
from harness.scale import calibrate as cal
from harness.scale import heal_measured as heal

STEPS, INTERVAL, TOKENS = 8, 4, 800.0
# Per trial: the step (each trial's host load differs), the cold restart's restart cost, and a factor on
# the measured goodput so that the simulator's error differs from trial to trial.
STEP_S = (0.20, 0.26, 0.18)
RESTART_S = (1.0, 1.6, 1.2)
NOISE = (1.00, 1.03, 0.98)

GVA_COLUMNS = [
    "run",
    "strategy",
    "age",
    "status",
    "goodput",
    "wall_s",
    "tokens",
    "step_median_s",
    "detection_s",
    "agreement_s",
    "rebuild_s",
    "rebind_s",
    "restart_s",
    "restore_s",
    "replay_s",
    "checkpoint_s",
    "other_s",
    "fault_detection_s",
    "fault_agreement_s",
    "fault_rebuild_s",
    "fault_rebind_s",
    "fault_restart_s",
    "fault_restore_s",
    "fault_replay_s",
    "fault_other_s",
]


def _gva_row(strategy: str, age: int | None, step: float, restart: float, noise: float) -> dict:
    """A goodput_vs_age row whose badput parts add up to its wall (as the harness writes them)."""
    parts = {"checkpoint_s": 0.1, "other_s": 0.01}
    fault = {}
    if strategy == "accelpact":
        fault = {"detection_s": 0.05, "agreement_s": 0.01, "replay_s": 0.5 * step}  # the attempt retried in memory
    elif strategy == "cold_restart":
        fault = {"restart_s": restart, "restore_s": 0.3, "replay_s": age * step}
    parts.update(fault)
    wall = STEPS * step + sum(parts.values())
    row = {k: 0.0 for k in GVA_COLUMNS}
    row.update(parts)
    row.update({f"fault_{k}": v for k, v in fault.items()})
    row.update(
        run=f"{strategy}_age{age}" if age is not None else "reference",
        strategy=strategy,
        age="" if age is None else age,
        status="ok",
        goodput=noise * TOKENS / wall,
        wall_s=wall,
        tokens=TOKENS,
        step_median_s=0.97 * step,
    )
    return row


def _write(d: Path, rows: list[dict], columns: list[str], extra: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    with (d / "data.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    (d / "provenance.json").write_text(json.dumps({"command": "synthetic", "extra": extra}))
    return d


def gva_sweep(d: Path, trials: int) -> Path:
    rows = []
    for k in range(trials):
        for strategy, age in (("none", None), ("accelpact", 1), ("cold_restart", 1), ("cold_restart", 3)):
            rows.append({**_gva_row(strategy, age, STEP_S[k], RESTART_S[k], NOISE[k]), "trial": k})
    columns = GVA_COLUMNS + ["trial"] if trials > 1 else GVA_COLUMNS
    if trials == 1:  # a file of one trial as committed before trials: no trial column at all
        rows = [{c: r[c] for c in GVA_COLUMNS} for r in rows]
    return _write(d, rows, columns, {"steps": STEPS, "interval": INTERVAL})


PL_COLUMNS = [
    "run",
    "fault",
    "strategy",
    "heal_source",
    "age",
    "status",
    "goodput",
    "useful_s",
    "useful_tokens",
    "badput_total_s",
    "part_detection_s",
    "part_replacement_start_s",
    "part_heal_transfer_s",
    "part_restart_s",
    "part_restore_s",
    "part_replay_s",
    "part_other_s",
    "part_checkpoint_s",
]
HEAL_DETECTION_S = (0.04, 0.09, 0.05)


def _pl_row(fault: str, strategy: str, age: int | None, k: int) -> dict:
    step = STEP_S[k]
    parts = {}
    if strategy == "accelpact":
        parts = {
            "part_detection_s": HEAL_DETECTION_S[k],
            "part_replacement_start_s": 0.04,
            "part_heal_transfer_s": 0.2,
            "part_replay_s": 0.5 * step,
            "part_other_s": 0.05,
        }
    elif strategy == "cold_restart":
        parts = {
            "part_restart_s": RESTART_S[k],
            "part_restore_s": 0.3,
            "part_replay_s": age * step,
            "part_other_s": 0.02,
        }
    useful = STEPS * step
    badput = sum(parts.values()) + 0.1  # the one checkpoint write inside the window
    row = {c: "" for c in PL_COLUMNS}
    row.update(parts)
    row.update(
        run=f"{strategy}_age{age}",
        fault=fault,
        strategy=strategy,
        heal_source="own" if strategy == "accelpact" else "",
        age="" if age is None else age,
        status="ok",
        goodput=NOISE[k] * TOKENS / (useful + badput),
        useful_s=useful,
        useful_tokens=TOKENS,
        badput_total_s=badput,
        trial=k,
    )
    return row


def pl_sweep(d: Path, trials: int) -> Path:
    rows = [
        _pl_row(fault, strategy, age, k)
        for k in range(trials)
        for fault in ("kill", "host_loss")
        for strategy, age in (("reference", None), ("accelpact", 2), ("cold_restart", 2))
    ]
    columns = PL_COLUMNS + ["trial"] if trials > 1 else PL_COLUMNS
    if trials == 1:
        rows = [{c: r[c] for c in PL_COLUMNS} for r in rows]
    return _write(d, rows, columns, {"steps": STEPS, "interval": INTERVAL})


def _read(d: Path) -> list[dict[str, str]]:
    with (d / "data.csv").open() as fh:
        return list(csv.DictReader(fh))


# --- goodput_vs_age -------------------------------------------------------------------------------------


def test_three_trials_give_per_cell_medians_and_an_interval(tmp_path):
    d = gva_sweep(tmp_path / "gva", 3)
    runs = cal.calibrate(d)
    assert len(runs) == 12 and sorted({r.trial for r in runs}) == [0, 1, 2]
    cells = {(c.strategy, c.age): c for c in cal.error_intervals(runs)}
    assert set(cells) == {("none", None), ("accelpact", 1), ("cold_restart", 1), ("cold_restart", 3)}
    written = _read(d)
    for (strategy, age), c in cells.items():
        mine = [r for r in runs if (r.strategy, r.age) == (strategy, age)]
        errors = [r.error for r in mine]
        assert c.trials == 3
        assert c.measured == pytest.approx(
            statistics.median(
                float(w["goodput"])
                for w in written
                if w["strategy"] == strategy and w["age"] == ("" if age is None else str(age))
            )
        )
        assert c.simulated == pytest.approx(statistics.median(r.simulated for r in mine))
        assert c.error_median == pytest.approx(statistics.median(errors))
        # The errors differ by trial (NOISE), so the bootstrap interval has width, within their range.
        assert min(errors) - 1e-12 <= c.error_lo < c.error_hi <= max(errors) + 1e-12
        assert c.error_lo <= c.error_median <= c.error_hi
        assert c.text().endswith("(n=3)") and "[" in c.text()


def test_each_trial_is_replayed_at_its_own_pace(tmp_path):
    """A fault-free reference run's simulated goodput follows its own trial's step: the trials' references
    are not pooled into one pace."""
    runs = [r for r in cal.calibrate(gva_sweep(tmp_path / "gva", 3)) if r.strategy == "none"]
    by_trial = {r.trial: r for r in runs}
    for k in (1, 2):
        # tokens / (steps x step + the one checkpoint write + the per-step noise), as the runs were written
        expected = [TOKENS / (STEPS * STEP_S[j] + 0.11) for j in (0, k)]
        assert by_trial[k].simulated / by_trial[0].simulated == pytest.approx(expected[1] / expected[0], rel=0.02)


def test_costs_are_medians_over_every_trials_runs(tmp_path):
    d = gva_sweep(tmp_path / "gva", 3)
    _, rows, _ = cal.load_runs(d)
    costs = cal.measured_costs(rows)
    # cold_restart: 2 ages x 3 trials, each stop = restart + restore of its trial
    assert costs["cold_restart"].runs == 6
    assert costs["cold_restart"].downtime_s == pytest.approx(statistics.median(r + 0.3 for r in RESTART_S))
    assert costs["accelpact"].runs == 3


def test_one_trial_file_still_calibrates_and_has_no_interval(tmp_path):
    d = gva_sweep(tmp_path / "gva1", 1)
    assert "trial" not in _read(d)[0]
    runs = cal.calibrate(d)
    assert {r.trial for r in runs} == {0}
    cells = cal.error_intervals(runs)
    assert len(cells) == 4
    for c in cells:
        run = next(r for r in runs if (r.strategy, r.age) == (c.strategy, c.age))
        assert c.trials == 1 and math.isnan(c.error_lo) and math.isnan(c.error_hi)
        assert c.error_median == pytest.approx(run.error) and c.measured == pytest.approx(run.measured)
        assert "no interval" in c.text()
    assert "no interval" in spc.largest_miss_md(cells)
    assert "no interval" in spc.calibration_md(cells)


def test_two_runs_of_one_cell_in_one_trial_are_refused(tmp_path):
    d = gva_sweep(tmp_path / "gva", 3)
    rows = _read(d)
    rows.append(dict(rows[1]))
    _write(d, rows, list(rows[0]), {"steps": STEPS, "interval": INTERVAL})
    with pytest.raises(ScaleConfigError, match="one run per cell and trial"):
        cal.calibrate(d)


def test_largest_miss_is_the_cell_with_the_largest_median_error():
    """Over medians, not runs: one trial's outlier (+9%) does not make its cell the largest miss when another
    cell misses by 3% in every trial."""
    rows = [cal.CalibrationRow("accelpact", 5, 100.0, sim, sim, k) for k, sim in enumerate((101.0, 109.0, 100.5))]
    rows += [cal.CalibrationRow("cold_restart", 5, 100.0, sim, sim, k) for k, sim in enumerate((103.0, 103.2, 102.9))]
    text = spc.largest_miss_md(cal.error_intervals(rows))
    assert text.startswith("Largest miss (median error over trials): cold_restart age 5, +3.0% [")
    assert "(n=3)" in text and "limit is 5%" in text
    assert "| cold_restart | 5 | 3 | 100 | 103 | +3.0% [" in spc.calibration_md(cal.error_intervals(rows))


# --- process_loss (the heal) -----------------------------------------------------------------------------


def test_heal_three_trials_give_per_cell_medians_and_an_interval(tmp_path):
    d = pl_sweep(tmp_path / "pl", 3)
    runs = heal.calibrate_heal(d)
    assert len(runs) == 18
    cells = {(c.fault, c.strategy, c.age): c for c in heal.heal_error_intervals(runs)}
    assert len(cells) == 6
    written = _read(d)
    for (fault, strategy, age), c in cells.items():
        mine = [r for r in runs if (r.fault, r.strategy, r.age) == (fault, strategy, age)]
        errors = [r.error for r in mine]
        assert c.trials == 3 and c.heals == (strategy == "accelpact")
        assert c.measured == pytest.approx(
            statistics.median(float(w["goodput"]) for w in written if (w["fault"], w["strategy"]) == (fault, strategy))
        )
        assert c.simulated == pytest.approx(statistics.median(r.simulated for r in mine))
        assert c.error_median == pytest.approx(statistics.median(errors))
        assert min(errors) - 1e-12 <= c.error_lo < c.error_hi <= max(errors) + 1e-12
        assert c.text().endswith("(n=3)")
    # The stop fed to every heal run is one median over all trials' heal runs of that fault.
    heal_stop = statistics.median(det + 0.04 + 0.2 for det in HEAL_DETECTION_S)
    assert cells[("kill", "accelpact", 2)].stop_s == pytest.approx(heal_stop)
    assert cells[("kill", "cold_restart", 2)].stop_s == pytest.approx(statistics.median(r + 0.3 for r in RESTART_S))
    costs = heal.measured_heal(str(d))
    assert costs["kill"].runs == 3 and "(3 trials)" in costs["kill"].source
    assert costs["kill"].parts["detection"] == pytest.approx(statistics.median(HEAL_DETECTION_S))
    md = spc.heal_calibration_md(list(cells.values()))
    assert "| kill (process_crash) | accelpact | heal in memory | 2 | 3 |" in md
    assert "of any cell:" in spc.heal_largest_miss_md(list(cells.values()))


def test_heal_one_trial_file_still_calibrates_and_has_no_interval(tmp_path):
    d = pl_sweep(tmp_path / "pl1", 1)
    assert "trial" not in _read(d)[0]
    cells = heal.heal_error_intervals(heal.calibrate_heal(d))
    assert len(cells) == 6
    assert all(c.trials == 1 and math.isnan(c.error_lo) and "no interval" in c.text() for c in cells)
    assert "no interval" in spc.heal_largest_miss_md(cells)
