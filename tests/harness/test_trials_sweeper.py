"""The trials sweeper end to end: `python -m harness compare.trials=2` on a tiny model runs two rounds,
each with its own reference, in a rotated order, and prints the per-cell table with intervals."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from harness_test_helpers import run_harness

TINY_COMPARE = [
    "model.num_layers=2",
    "model.seq_len=32",
    "model.batch_size=2",
    "progress=false",
    "train.steps=8",
    "checkpoint.interval=4",
    "fault.at_age=1",
    "strategy=accelpact",
    "compare.trials=2",
]


def _started(run_dir: Path) -> float:
    """When the run started (its row's started_at, to the second: each run here takes several)."""
    from datetime import datetime

    row = json.loads((run_dir / "summary.json").read_text())["row"]
    return datetime.strptime(row["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 4 runs: ~2 min on 2 quiet cores, ~6 min at load 25
def test_two_trials_each_with_its_reference_in_rotated_order(tmp_path):
    sweep = tmp_path / "cmp"
    done = run_harness([*TINY_COMPARE, f"hydra.sweep.dir={sweep}"], tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for k in (0, 1):
        for name in ("reference", "accelpact_age1"):
            row = json.loads((sweep / f"trial{k}" / name / "summary.json").read_text())["row"]
            assert row["status"] == "ok" and row["load_max"] >= 0 and "steal_pct" in row
    # round 0: the reference first; round 1 (rotated by one): AccelPact first, the reference last
    assert _started(sweep / "trial0" / "reference") < _started(sweep / "trial0" / "accelpact_age1")
    assert _started(sweep / "trial1" / "accelpact_age1") < _started(sweep / "trial1" / "reference")
    table = pd.read_csv(sweep / "table.csv").set_index("strategy")
    assert table.loc["accelpact", "trials"] == 2
    assert len(pd.read_csv(sweep / "runs.csv")) == 4
    assert "gain_ci" in done.stdout and "verdict" in done.stdout
