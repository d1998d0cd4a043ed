"""experiments._driver and experiments.registry: the pieces every experiment driver shares."""

from __future__ import annotations

import csv
import math
import tempfile

from experiments import _driver
from experiments.registry import README_ORDER, REGISTRY, SECTIONS
from harness.report.paper import PAPER_GAIN


def test_quick_runs_never_write_into_results(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the quick run's temp dir lands in tmp_path
    ap = _driver.parser("doc", "demo", "quick")
    quick = _driver.output_dir(ap.parse_args(["--quick"]), "demo")
    assert quick.parent == tmp_path and quick.is_dir()
    assert _driver.output_dir(ap.parse_args(["--out", str(tmp_path / "o")]), "demo") == tmp_path / "o"
    # --rederive reads the committed measurement, even with --quick.
    assert _driver.output_dir(ap.parse_args(["--quick"]), "bit_identity", rederive=True) == _driver.results_dir(
        "bit_identity"
    )


def test_write_csv_formats_floats_and_leaves_none_empty(tmp_path):
    path = tmp_path / "x.csv"
    _driver.write_csv(path, [{"a": 1.23456789, "b": None, "c": "t"}, {"a": math.pi, "b": 2, "c": "u"}], ".3f")
    assert list(csv.reader(path.open())) == [["a", "b", "c"], ["1.235", "", "t"], ["3.142", "2", "u"]]
    _driver.write_csv(path, [])
    assert path.read_text() == ""


def test_registry_and_readme_name_the_same_experiments_once():
    names = [e.name for e in REGISTRY]
    assert len(set(names)) == len(names)
    assert sorted(README_ORDER) == sorted(names)
    assert [s.name for s in SECTIONS] == list(README_ORDER)
    assert all(s.title and s.intro for s in SECTIONS)


def test_paper_gain_is_keyed_by_baseline_and_age():
    assert PAPER_GAIN[("cold_restart", 5)] == 1.197
    assert all(isinstance(b, str) and isinstance(a, int) and g > 1 for (b, a), g in PAPER_GAIN.items())
