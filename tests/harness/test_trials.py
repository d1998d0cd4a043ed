"""The interleaving order of trials and the per-cell summary over trials."""

from __future__ import annotations

import math

import pytest

from harness.report.intervals import BETTER, NOISE, ONE_TRIAL, SAME, WORSE
from harness.report.trials import interleave, round_order, summarize_cells, trial_of


def test_round_order_rotates_by_the_round():
    items = ["ref", "a", "b", "c"]
    assert round_order(items, 0) == ["ref", "a", "b", "c"]
    assert round_order(items, 1) == ["a", "b", "c", "ref"]
    assert round_order(items, 5) == ["a", "b", "c", "ref"]
    assert round_order([], 3) == []


def test_interleave_runs_every_item_once_per_round_in_every_position():
    items = ["ref", "a", "b"]
    plan = interleave(items, 3)
    assert [k for k, _ in plan] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for k in range(3):
        assert sorted(i for t, i in plan if t == k) == sorted(items)
    firsts = [plan[3 * k][1] for k in range(3)]
    assert firsts == ["ref", "a", "b"]
    # over len(items) rounds every item runs once in every position of a round
    for pos in range(3):
        assert sorted(plan[3 * k + pos][1] for k in range(3)) == sorted(items)
    with pytest.raises(ValueError, match="compare.trials"):
        interleave(items, 0)


def test_trial_of_directory_names():
    assert trial_of("trial0") == 0 and trial_of("trial12") == 12
    assert trial_of("accelpact_age5") == 0 and trial_of("trialx") == 0


def _row(strategy, age, gain, measured, trial, status="ok", identical=True, **extra):
    return {
        "strategy": strategy,
        "age": age,
        "accelpact_gain_bp": gain,
        "accelpact_gain": measured,
        "goodput_bp": 100 / gain if gain else math.nan,
        "goodput": 90.0,
        "status": status,
        "bit_identical": identical,
        "trial": trial,
        "program_startup_s": 2.0 + trial,
        **extra,
    }


def test_summary_per_cell_draws_the_verdict_from_the_measured_gain():
    """The verdict reads the measured whole-run gain; the badput-based one is a diagnostic beside it."""
    rows = []
    for t, (g_cold, g_neg) in enumerate([(1.3, 0.8), (1.2, 0.7), (1.35, 0.75)]):
        # cold_restart: the badput-based gain looks like a clear win, the measured one (0.95-1.35) does not
        rows += [
            _row("cold_restart", 5, g_cold, 0.95 + 0.2 * t, t),
            _row("slow", 5, g_neg, g_neg, t),
            _row("noisy", 5, 1.3, [0.9, 1.2, 1.1][t], t),
        ]
    rows.append(_row("cold_restart", 5, 5.0, 5.0, 3, status="failed"))  # a failed run is not a trial
    rows.append(_row("single", 18, 1.5, 1.5, 0))
    out = {(r["strategy"], r["age"]): r for r in summarize_cells(rows)}
    cold = out[("cold_restart", 5)]
    assert cold["trials"] == 3 and cold["runs"] == 4
    assert cold["gain"] == pytest.approx(1.15) and (cold["gain_lo"], cold["gain_hi"]) == pytest.approx((0.95, 1.35))
    assert cold["gain_coverage"] == pytest.approx(0.75) and cold["interval_method"] == "order_statistic"
    assert cold["verdict"] == NOISE and cold["verdict_bp"] == BETTER
    assert cold["gain_ci"].endswith("(n=3)") and cold["gain_bp_ci"].startswith("1.300 [1.200, 1.350]")
    assert cold["program_startup_s"] == pytest.approx(3.0) and cold["bit_identical"] is True
    assert out[("slow", 5)]["verdict"] == WORSE
    assert out[("noisy", 5)]["verdict"] == NOISE and out[("noisy", 5)]["verdict_bp"] == BETTER
    assert out[("single", 18)]["verdict"] == ONE_TRIAL


def test_the_minimum_effect_keeps_a_tiny_gain_from_reading_as_better():
    rows = [_row("torchft", 5, 1.004, g, t) for t, g in enumerate([1.002, 1.003, 1.006, 1.004, 1.005])]
    assert summarize_cells(rows)[0]["verdict"] == SAME
    assert summarize_cells(rows, min_effect=0.0)[0]["verdict"] == BETTER


def test_notes_name_a_slow_step_and_a_load_spike():
    rows = [
        _row("accelpact_heal", 5, 1.0, 1.0, t, step_drift=1.2, load_mean=load, load_max=load + 0.5, cores_used=2)
        for t, load in enumerate([2.1, 4.4, 2.0])
    ]
    notes = summarize_cells(rows)[0]["notes"]
    assert "steps 1.20x the reference's" in notes and "load spike in 1 of 3 trials (load up to 4.9 on 2 cores)" in notes
    quiet = [dict(r, step_drift=1.03, load_mean=2.1) for r in rows]
    assert summarize_cells(quiet)[0]["notes"] == ""


def test_a_sweep_over_faults_keeps_one_cell_per_fault():
    """experiment=peers sweeps socket_reset and kill at the same ages: the same strategy and age under two
    faults are two cells, each with its own interval and verdict, and the table gets a fault column."""
    from harness.report.verdict import PRINT_COLUMNS, print_columns

    rows = []
    for t in range(3):
        rows += [
            _row("cold_restart", 5, 1.2, [1.3, 1.25, 1.35][t], t, fault="socket_reset"),
            _row("cold_restart", 5, 0.8, [0.8, 0.7, 0.75][t], t, fault="kill"),
        ]
    cells = summarize_cells(rows)
    out = {(r["strategy"], r["age"], r["fault"]): r for r in cells}
    assert set(out) == {("cold_restart", 5, "socket_reset"), ("cold_restart", 5, "kill")}
    assert out[("cold_restart", 5, "socket_reset")]["trials"] == 3 and out[("cold_restart", 5, "kill")]["trials"] == 3
    assert out[("cold_restart", 5, "socket_reset")]["verdict"] == BETTER
    assert out[("cold_restart", 5, "kill")]["verdict"] == WORSE
    assert print_columns(cells)[:3] == ("strategy", "age", "fault")
    one_fault = summarize_cells([r for r in rows if r["fault"] == "kill"])
    assert print_columns(one_fault) == PRINT_COLUMNS


def test_bit_identical_is_false_if_any_trial_differs():
    rows = [_row("a", 5, 1.1, 1.1, 0), _row("a", 5, 1.2, 1.2, 1, identical=False)]
    assert summarize_cells(rows)[0]["bit_identical"] is False


def test_median_rows_collapses_trials():
    from harness.report.trials import median_rows

    rows = [
        {"strategy": "a", "age": 5, "trial": t, "gain": g, "status": "ok", "bit_identical": True, "fallback": "no"}
        for t, g in enumerate((1.1, 1.5, 1.2))
    ]
    rows.append(
        {
            "strategy": "a",
            "age": 5,
            "trial": 3,
            "gain": 9.0,
            "status": "failed",
            "bit_identical": False,
            "fallback": "no",
        }
    )
    rows.append(
        {"strategy": "a", "age": 18, "trial": 0, "gain": 2.0, "status": "ok", "bit_identical": None, "fallback": "yes"}
    )
    out = median_rows(rows, ("strategy", "age"))
    assert [(r["strategy"], r["age"]) for r in out] == [("a", 5), ("a", 18)]
    assert out[0]["gain"] == pytest.approx(1.2) and out[0]["trials"] == 3 and out[0]["bit_identical"] is True
    assert out[1]["gain"] == 2.0 and out[1]["trials"] == 1 and out[1]["fallback"] == "yes"
    # integer columns stay integers when their median is whole (tables format them with "d")
    steps = median_rows([{"k": 1, "n": 3}, {"k": 1, "n": 5}, {"k": 1, "n": 4}], ("k",))[0]["n"]
    assert steps == 4 and isinstance(steps, int)
    assert median_rows([{"k": 1, "n": 3}, {"k": 1, "n": 4}], ("k",))[0]["n"] == 3.5
