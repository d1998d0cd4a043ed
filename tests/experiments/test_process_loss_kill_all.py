"""experiments.process_loss_kill_all on made-up rows (pure logic): the cells of its table, per strategy and age."""

from __future__ import annotations

from experiments import process_loss_kill_all as kill_all
from experiments.process_loss import STRATEGIES


def _row(strategy, age, goodput, trial, replayed, source, disk, identical=True, fallback="no"):
    return {
        "fault": "kill_all",
        "run": f"{strategy}_age{age}",
        "strategy": strategy,
        "age": age,
        "status": "ok",
        "goodput": goodput,
        "replayed_steps": replayed,
        "restore_source": source,
        "restore_disk_bytes": disk,
        "bit_identical": identical,
        "fallback": fallback,
        "trial": trial,
    }


ROWS = [
    {"fault": "kill_all", "run": "reference", "strategy": "reference", "age": None, "status": "ok", "goodput": 99.0},
    *[_row("accelpact_heal", 5, 90.0 + t, t, t % 2, "snapshot", 0) for t in range(5)],
    *[_row("cold_restart", 5, 60.0 + t, t, 5, "checkpoint", 1000) for t in range(5)],
    _row("checkpoint_restore", 5, 70.0, 0, 5, "checkpoint", 1000, identical=False),
    {**_row("checkpoint_restore", 5, None, 1, None, None, None), "status": "failed"},
]


def test_the_cells_are_per_strategy_and_age_with_the_median_over_trials():
    cells = kill_all.summarize(ROWS)
    assert set(cells) == {("accelpact_heal", 5), ("cold_restart", 5), ("checkpoint_restore", 5)}
    heal = cells[("accelpact_heal", 5)]
    assert heal["ok"] == heal["runs"] == 5 and heal["goodput"].median == 92.0 and heal["goodput"].n == 5
    assert heal["replayed"] == [0, 1, 0, 1, 0] and heal["sources"] == ["snapshot"] and heal["disk_bytes"] == 0
    assert heal["identical"] == 5 and heal["fallbacks"] == []
    nvrx = cells[("checkpoint_restore", 5)]
    assert (nvrx["ok"], nvrx["runs"], nvrx["identical"]) == (1, 2, 0)


def test_the_table_has_one_line_per_cell_and_names_a_refused_strategy():
    refused = {
        "fault": "kill_all",
        "run": "torchft_age5",
        "strategy": STRATEGIES[1],
        "age": 18,
        "status": "not supported",
        "reason": "no live group",
    }
    lines = kill_all.table([*ROWS, refused])
    assert lines[0].startswith("| strategy | age |") and len(lines) == 2 + 4
    [heal] = [line for line in lines if line.startswith("| accelpact_heal | 5 |")]
    assert "| 5/5 | 92 [" in heal and "| snapshot | 0 | 5/5 | no |" in heal, heal
    assert any("not supported: no live group" in line for line in lines)


def test_acceptance_names_every_heal_run_that_read_the_disk_replayed_more_or_differs():
    assert kill_all.acceptance_problems(ROWS) == []  # the baselines may read the disk and replay
    bad = [
        _row("accelpact_heal", 18, 80.0, 0, 5, "checkpoint", 1000, fallback="relaunch: no complete ..."),
        _row("accelpact_heal", 18, 80.0, 1, 2, "snapshot", 0, identical=None),
    ]
    problems = kill_all.acceptance_problems(bad)
    assert len(problems) == 4, problems
    assert "resumed from checkpoint, 1000 bytes read from disk (relaunch: no complete ...)" in problems[0]
    assert problems[1].endswith("5 steps replayed") and problems[2].endswith("2 steps replayed")
    assert problems[3].endswith("bit_identical=None")
