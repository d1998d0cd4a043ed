"""experiments.mixed_faults: the advisor's settings as overrides, the skip row of a refused strategy, and the
badput by fault class. Pure logic over hand-made rows (no run starts)."""

from __future__ import annotations

import math

from experiments import mixed_faults, mixed_faults_report
from harness.advise.advice import TraceAdviceRow
from harness.advise.cost import Cadence
from harness.schema import CompareConfig


def _row(name: str, every: int | None, cadence: Cadence | None = None) -> TraceAdviceRow:
    return TraceAdviceRow(name, every, cadence, 0.03, 40.0)


def test_each_strategy_runs_at_its_advised_interval_and_only_the_heal_takes_the_cadence():
    cad = Cadence(every=2, push_every=3, confirm=True)
    heal = mixed_faults.strategy_overrides("accelpact_heal", _row("accelpact_heal", 33, cad))
    assert heal == [
        "strategy=accelpact_heal",
        "checkpoint.interval=33",
        "strategy.snapshot.every=2",
        "strategy.snapshot.push_every=3",
        "strategy.snapshot.confirm_push=true",
        "strategy.snapshot.max_tax=null",  # the advisor's cadence holds: no tax budget re-chooses it
    ]
    assert mixed_faults.strategy_overrides("cold_restart", _row("cold_restart", 8)) == [
        "strategy=cold_restart",
        "checkpoint.interval=8",
    ]
    # torchft's simulated row may carry no cadence of the heal's; a strategy with no row never saves
    assert mixed_faults.strategy_overrides("torchft", _row("torchft_peer_heal", None, cad)) == [
        "strategy=torchft",
        "checkpoint.interval=0",
    ]
    assert mixed_faults.strategy_overrides("gemini", None) == ["strategy=gemini", "checkpoint.interval=0"]


def test_the_advisor_rows_of_the_harness_strategies_follow_the_simulators_names():
    assert mixed_faults.ADVISOR_ROW["torchft"] == "torchft_peer_heal"
    assert set(mixed_faults.STRATEGIES) >= {"accelpact_heal", "checkpoint_restore", "cold_restart", "torchft", "gemini"}


def _cell(strategy: str, goodput: float, gain: float) -> dict:
    return {
        "strategy": strategy,
        "trials": 2,
        "runs": 2,
        "goodput": goodput,
        "goodput_lo": goodput * 0.9,
        "goodput_hi": goodput * 1.1,
        "goodput_n": 2,
        "gain": gain,
        "gain_lo": gain * 0.95,
        "gain_hi": gain * 1.05,
        "gain_n": 2,
        "gain_coverage": 0.5,
        "gain_ci": f"{gain:.3f}",
        "verdict": "AccelPact better",
        "badput_s": 10.0,
        "replayed_steps": 3,
        "bit_identical": True,
    }


def test_a_refused_strategy_keeps_its_row_with_the_reason_and_ratios_are_to_the_reference():
    from harness.report.intervals import DESCRIPTIONS, Interval, coverage_text

    cells = [
        _cell("none (reference)", 100.0, math.nan),
        _cell("accelpact_heal", 80.0, 1.0),
        _cell("cold_restart", 40.0, 2.0),
    ]
    lines = mixed_faults_report._goodput_table(
        cells,
        {"gemini": "strategy=gemini needs lm-resiliency: `pip install -e '.[gemini]'`"},
        CompareConfig(),
        DESCRIPTIONS,
        Interval,
        coverage_text,
        mixed_faults_report.fired_faults(
            [
                {"strategy": "cold_restart", "status": "ok", "faults": 4},
                {"strategy": "cold_restart", "status": "ok", "faults": 3},
                {"strategy": "cold_restart", "status": "failed", "faults": 0},
            ]
        ),
        4,
    )
    text = "\n".join(lines)
    gemini = next(line for line in lines if line.startswith("| `gemini`"))
    assert "not run" in gemini and "pip install -e '.[gemini]'" in gemini
    cold = next(line for line in lines if line.startswith("| `cold_restart`"))
    assert "| 0.40 |" in cold and "2.000" in cold and "AccelPact better" in cold
    assert "| 3-4 of 4 |" in cold  # the faults fired, over the runs that ended ok
    heal = next(line for line in lines if line.startswith("| `accelpact_heal`"))
    assert "| 0.80 |" in heal and "AccelPact better" not in heal  # no gain over itself
    ref = next(line for line in lines if line.startswith("| fault-free reference"))
    assert "| 1.00 |" in ref  # the comparison labels the reference "none (reference)"
    assert "50.0% at n=2" in text  # the coverage the intervals really have, not the level asked
