"""The heal's calibration against the committed results/process_loss runs, and the projection's use of its parts.

The engine's replay check (every run fed its own measured stop and destroyed attempt) reproduces each (fault,
strategy, age) cell's measured goodput within 5% (the median error over the trials): what is checked is the
engine's accounting of the heal (rollback to the step in flight, no replay from the checkpoint) and of the
restarts. The calibration proper (the median parts) is reported with its intervals by
experiments/scale_projection: a measurement of how much the costs moved between runs, not a pass/fail check."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from harness import strategies
from harness.fleet.config import Cluster
from harness.scale import calibrate as cal
from harness.scale import heal_measured as heal
from harness.scale.outcomes import outcome_table

RESULTS = Path(__file__).resolve().parents[2] / "results" / "process_loss"
TOLERANCE = cal.LIMIT


@pytest.fixture(scope="module")
def rows():
    if not (RESULTS / "data.csv").exists():
        pytest.fail(f"{RESULTS}/data.csv is missing: the heal calibration needs the committed process_loss runs")
    return heal.calibrate_heal(RESULTS)


def test_both_faults_have_heal_runs(rows):
    assert {(r.fault, r.heals) for r in rows if r.age is not None} >= {("kill", True), ("host_loss", True)}


def test_the_engine_replays_every_run_from_its_own_costs_within_5_percent():
    misses = [
        f"{c.strategy} {c.fault} age {c.age}: simulated {c.simulated:.0f} vs measured {c.measured:.0f} "
        f"(medians over trials; error {c.text()})"
        for c in heal.heal_error_intervals(heal.calibrate_heal(RESULTS, own=True))
        if abs(c.error_median) > TOLERANCE
    ]
    assert not misses, "; ".join(misses)


def test_every_cell_of_the_calibration_is_reported(rows):
    cells = heal.heal_error_intervals(rows)
    assert {(c.fault, c.heals) for c in cells if c.age is not None} >= {("kill", True), ("host_loss", True)}
    assert all(c.trials >= 1 and c.measured > 0 and c.simulated > 0 for c in cells)


def test_a_heal_that_replayed_to_the_checkpoint_misses(monkeypatch):
    """Negative control: the same runs replayed as if the heal restored from disk (rollback to the checkpoint,
    no heal parts) miss by far more than 5% at age 18, so the check above can fail."""
    monkeypatch.setattr(heal, "_heals", lambda row: False)
    wrong = [
        c
        for c in heal.heal_error_intervals(heal.calibrate_heal(RESULTS, own=True))
        if c.strategy == strategies.healer().name and c.age == 18
    ]
    assert wrong and all(abs(c.error_median) > 2 * TOLERANCE for c in wrong)


def test_projection_uses_the_measured_parts():
    with (RESULTS / "data.csv").open() as fh:
        kills = [
            r
            for r in csv.DictReader(fh)
            if r["fault"] == "kill" and r["status"] == "ok" and r.get("heal_source") not in ("", "nan", None)
        ]
    detection = statistics.median(float(r["part_detection_s"]) for r in kills)
    transfer = statistics.median(float(r["part_heal_transfer_s"]) for r in kills)
    healing = [n for n, sim in strategies.simulated().items() if sim.build == heal.HEAL_BUILDS[0]]
    assert healing, "no simulated strategy heals in memory"
    for name in healing:
        assert "projected" not in strategies.simulated()[name].label  # measured: not a projection
        crash = outcome_table(Cluster(gpus=16), (name,))[name]["process_crash"]
        assert crash.rollback == "step"
        assert crash.parts["detection"] == pytest.approx(detection)
        assert crash.parts["heal_transfer"] == pytest.approx(transfer)
