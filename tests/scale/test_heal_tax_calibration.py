"""The cost model of per-step protection against the committed measurement (results/heal_tax/calibration.json,
written by ``python -m experiments.heal_tax``): at 2 model sizes x 2 tokens-per-step settings, with snapshots
alone and with a confirmed push every step, the model's prediction lies inside each cell's interval. Nothing
is run: the test reads the file. The model takes only the parts' measured rates, the cell's state bytes and
its unprotected step, so a wrong formula (a missing part, a push charged once instead of on both sides of the
host) moves predictions out of the intervals."""

from __future__ import annotations

import pytest

from harness.advise.calibration import cell_rows, load, platform_from

DATA = load()
ROWS = cell_rows(DATA)


def test_the_committed_measurement_covers_2_sizes_x_2_token_settings_with_5_or_more_trials():
    cells = DATA["cells"]
    assert len({c["model"]["hidden"] for c in cells.values()}) == 2
    assert len({c["tokens_per_step"] for c in cells.values()}) == 2
    assert len(cells) == 4
    assert all(len(c["overhead"][m]) >= 5 for c in cells.values() for m in ("snap", "push"))
    prov = DATA["provenance"]
    assert prov["git_sha"] and prov["command"].startswith("python -m experiments.heal_tax") and prov["machine"]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.cell}-{r.mode}")
def test_model_prediction_inside_the_measured_interval(row):
    assert row.lo <= row.predicted <= row.hi, (
        f"{row.cell} {row.mode}: model {row.predicted:+.3f} outside the measured [{row.lo:+.3f}, {row.hi:+.3f}]")


def test_the_model_is_not_flat():
    """The prediction moves with what it should: more state per step costs more, a push costs more than none."""
    by = {(r.cell, r.mode): r.predicted for r in ROWS}
    for cell in DATA["cells"]:
        assert by[(cell, "push")] > by[(cell, "snap")] > 0
    rates = DATA["rates"]
    p = platform_from(DATA)
    assert p.copy_gbps == rates["copy_gbps"] and p.push_gbps == rates["push_gbps"] and p.copy_overlap == 0
