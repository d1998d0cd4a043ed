"""experiments/provenance.py: the paper-vs-ours verdicts, the provenance files and the figure stamp."""

from __future__ import annotations

import json
import re

import pytest

from experiments.provenance import (
    ClaimRow,
    Provenance,
    footer_text,
    load_provenance,
    paper_vs_ours_table,
    provenance_markdown,
    stamp_figure,
    verdict,
    write_provenance,
)


def row(**kw) -> ClaimRow:
    base = dict(
        claim="goodput vs restart", paper="1.197x", ours="1.3x", paper_value=1.197, ours_value=1.3, better="higher"
    )
    base.update(kw)
    return ClaimRow(**base)


def test_verdict_follows_the_direction_in_which_ours_is_better():
    assert verdict(row(ours_value=1.5)).startswith("better than the paper")
    assert verdict(row(ours_value=0.5, reason="slow restarts here")) == "worse than the paper: slow restarts here"
    # Lower is better: the same numbers flip.
    assert verdict(row(better="lower", ours_value=0.5)).startswith("better than the paper")
    assert verdict(row(better="lower", ours_value=1.5, reason="r")).startswith("worse than the paper")


def test_within_tolerance_is_a_match_either_side():
    assert verdict(row(ours_value=1.197 * 1.05)).startswith("matches the paper")
    assert verdict(row(ours_value=1.197 * 0.95)).startswith("matches the paper")
    assert verdict(row(ours_value=1.197 * 0.95, tolerance=0.01, reason="r")).startswith("worse")


def test_worse_without_a_reason_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="ClaimRow.reason"):
        verdict(row(ours_value=0.5))
    with pytest.raises(ValueError, match="ClaimRow.reason"):
        verdict(row(comparable=False))
    with pytest.raises(ValueError, match="ClaimRow.reason"):
        verdict(row(better=None, ours_value=3.0))


def test_not_comparable_and_missing_paper_figure():
    assert verdict(row(comparable=False, reason="CPU vs GPU")) == "not comparable: CPU vs GPU"
    assert verdict(row(paper="", paper_value=None)) == "no paper figure"
    assert verdict(row(better=None, ours_value=3.0, reason="smaller model")) == "differs from the paper: smaller model"
    with pytest.raises(ValueError, match="better"):
        row(better="up")


def test_table_has_paper_ours_and_verdict_columns_and_escapes_pipes():
    text = paper_vs_ours_table(
        [row(ours_value=0.5, ours="0.5x | slow", reason="restart costs 9 s"), dict(claim="tuned", paper="", ours="+3%")]
    )
    lines = text.strip().splitlines()
    assert lines[0] == "| claim | paper | ours | verdict |"
    assert len(lines) == 4
    assert "worse than the paper: restart costs 9 s" in lines[2]
    assert "0.5x \\| slow" in lines[2]
    assert "(not reported)" in lines[3] and "no paper figure" in lines[3]
    with pytest.raises(ValueError):
        paper_vs_ours_table([])


def test_write_provenance_names_command_code_and_machine(tmp_path):
    path = write_provenance(tmp_path / "res", "python -m experiments.x --quick", {"sizes": "tiny", "nested": {"a": 1}})
    data = json.loads(path.read_text())
    assert data["command"] == "python -m experiments.x --quick"
    assert re.fullmatch(r"[0-9a-f]{40}", data["git_sha"])  # this test runs inside the repo's checkout
    assert data["git_dirty"] in (True, False)
    m = data["machine"]
    assert m["cpu_cores"] >= 1 and m["mem_total_gib"] > 0 and m["torch"] and m["python"]
    assert "load_avg_1_5_15" in m and "gpus" in m
    assert data["extra"]["nested"] == {"a": 1}
    md = (tmp_path / "res" / "provenance.md").read_text()
    assert "`python -m experiments.x --quick`" in md and data["git_sha"] in md and "sizes: tiny" in md
    assert load_provenance(tmp_path / "res") == Provenance.from_dict(data)


def _prov(**kw) -> Provenance:
    base = dict(
        command="python -m experiments.ckpt_overhead",
        git_sha="a" * 40,
        git_dirty=True,
        date="2025-01-02T03:04:05+00:00",
        machine={
            "cpu_cores": 2,
            "mem_total_gib": 23.4,
            "gpus": [],
            "torch": "2.13.0",
            "python": "3.11",
            "cpu_model": "Xeon",
            "load_avg_1_5_15": [1.0, 2.0, 3.0],
        },
    )
    base.update(kw)
    return Provenance(**base)


def test_markdown_and_footer_say_dirty_and_machine():
    md = provenance_markdown(_prov())
    assert "uncommitted changes" in md and "2 cores (Xeon)" in md and "load average 1.0/2.0/3.0" in md
    assert "uncommitted" not in provenance_markdown(_prov(git_dirty=False))
    foot = footer_text(_prov())
    assert "python -m experiments.ckpt_overhead" in foot and "aaaaaaaaaa-dirty" in foot and "no GPU" in foot


def test_stamp_figure_puts_the_footer_in_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    stamp_figure(fig, _prov())
    texts = [t.get_text() for t in fig.texts]
    plt.close(fig)
    assert footer_text(_prov()) in texts
