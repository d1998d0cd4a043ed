"""The cost model of per-step protection against the committed measurement (results/heal_tax/calibration.json,
written by ``python -m experiments.heal_tax``): at 2 model sizes x 2 tokens-per-step settings, with snapshots
alone and with a confirmed push every step, the model's prediction lies inside each cell's interval. Nothing
is run: the test reads the file.

The model takes only the parts' rates measured alone, the cell's state bytes and its unprotected step (CPU
seconds), nothing fitted to the cells. Two measures of the tax are checked: step time (the acceptance's) and
CPU per step. In the committed quiet run (load 0.3-2.6, blocks of 8 steps) their intervals are 8-19 and
5-19 points wide; at load 7-13 with blocks of 4 steps they were 72-183 and 10-30."""

from __future__ import annotations

import pytest

from harness.advise.calibration import cell_rows, load, platform_from

DATA = load()
ROWS = cell_rows(DATA)
# CPU intervals the model misses in the committed run, each a strict expected failure (a new measurement
# that covers it forces its marker off). The quiet run at c274e01 has none; the earlier one at load 7-13
# missed tiny_t128 with a push (+13.9% predicted, [+14.4, +31.4] measured).
CPU_MISSES: set[tuple[str, str]] = set()


def test_the_committed_measurement_covers_2_sizes_x_2_token_settings_with_5_or_more_trials():
    cells = DATA["cells"]
    assert len({c["model"]["hidden"] for c in cells.values()}) == 2
    assert len({c["tokens_per_step"] for c in cells.values()}) == 2
    assert len(cells) == 4
    assert all(
        len(c["overhead"][m]) >= 5 and len(c["cpu_overhead"][m]) >= 5 for c in cells.values() for m in ("snap", "push")
    )
    prov = DATA["provenance"]
    assert prov["git_sha"] and prov["command"].startswith("python -m experiments.heal_tax") and prov["machine"]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.cell}-{r.mode}")
def test_model_inside_the_step_time_interval(row):
    assert row.lo <= row.predicted <= row.hi, (
        f"{row.cell} {row.mode}: model {row.predicted:+.3f} outside the measured [{row.lo:+.3f}, {row.hi:+.3f}]"
    )


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, marks=pytest.mark.xfail(strict=True, reason="the committed miss"))
        if (r.cell, r.mode) in CPU_MISSES
        else r
        for r in ROWS
    ],
    ids=lambda r: f"{r.cell}-{r.mode}",
)
def test_model_inside_the_cpu_interval(row):
    assert row.cpu_lo <= row.predicted <= row.cpu_hi, (
        f"{row.cell} {row.mode}: model {row.predicted:+.3f} outside CPU [{row.cpu_lo:+.3f}, {row.cpu_hi:+.3f}]"
    )


def test_the_model_is_not_flat():
    """The prediction moves with what it should: a push costs more than none, a longer step less."""
    by = {(r.cell, r.mode): r.predicted for r in ROWS}
    for cell in DATA["cells"]:
        assert by[(cell, "push")] > by[(cell, "snap")] > 0
    assert by[("tiny_t512", "push")] < by[("tiny_t128", "push")]
    rates = DATA["rates"]
    p = platform_from(DATA)
    assert p.copy_gbps == rates["copy_gbps"] and p.push_gbps == rates["push_gbps"] and p.copy_overlap == 0
