"""README.md's results section is generated from results/: it must match the committed results."""

from __future__ import annotations

import pytest

from experiments import readme_results as rr


def test_readme_results_section_matches_the_committed_results(capsys):
    rc = rr.main(["--check"])
    assert rc == 0, capsys.readouterr().err


def test_markdown_tables_are_split_on_non_table_lines():
    text = "intro\n| a | b |\n|---|---|\n| 1 | 2 |\n\nmore\n| c |\n|---|\n"
    assert rr.markdown_tables(text) == ["| a | b |\n|---|---|\n| 1 | 2 |", "| c |\n|---|"]


def test_first_paragraph_after_a_heading():
    text = "# t\n\n## Soak: 100 faults\n\nline one\nline two\n\nnext para\n## Other\n"
    assert rr.first_paragraph_after(text, "## Soak") == ("Soak: 100 faults", "line one\nline two")
    assert rr.first_paragraph_after(text, "## Missing") == ("", "")


def test_splice_replaces_only_the_block_and_needs_both_markers():
    readme = f"head\n{rr.BEGIN}\nold\n{rr.END}\ntail\n"
    assert rr.splice(readme, "new") == f"head\n{rr.BEGIN}\n\nnew\n\n{rr.END}\ntail\n"
    with pytest.raises(ValueError, match="needs exactly one"):
        rr.splice("no markers here", "new")


def test_a_section_wanting_a_table_that_is_not_there_names_the_fix(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "table.md").write_text("no tables\n")
    with pytest.raises(ValueError, match="python -m experiments.x"):
        rr.render_section(tmp_path, rr.Section("x", "X", "intro", tables=(0,)))


def test_a_missing_result_says_how_to_make_it(tmp_path):
    out = rr.render_section(tmp_path, rr.Section("y", "Y", "intro"))
    assert "python -m experiments.y" in out


CLAIMS = (
    "| claim | paper | ours | verdict |\n|---|---|---|---|\n"
    "| gain at age 5 | 1.2x | 1.5x | better than the paper (R/s is 34: a reason) |\n"
    "| gain at age 18 | 1.7x | 1.6x | matches the paper: within noise |\n"
)


def test_the_digest_quotes_the_named_row_with_the_verdicts_head_only(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "table.md").write_text("# x\n\n" + CLAIMS)
    line = rr.digest_line(tmp_path, rr.Section("x", "X", "intro", digest_row=("gain at age 18",)))
    assert line == ("- **X** ([table](results/x/table.md)): gain at age 18: **1.6x** (paper: 1.7x); matches the paper.")
    first = rr.digest_line(tmp_path, rr.Section("x", "X", "intro", digest_row=("no such row",)))
    assert "gain at age 5: **1.5x** (paper: 1.2x); better than the paper." in first


def test_the_digest_of_a_table_without_claims_names_its_first_columns(tmp_path):
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "table.md").write_text("| a | b | c | d | e |\n|---|---|---|---|---|\n| 1 | 2 | 3 | 4 | 5 |\n")
    assert rr.digest_line(tmp_path, rr.Section("y", "Y", "intro")).endswith(": a: 1; b: 2; c: 3; d: 4.")
    assert "python -m experiments.z" in rr.digest_line(tmp_path, rr.Section("z", "Z", "intro"))


def test_results_readme_links_are_relative_to_results(tmp_path):
    """results/README.md sits in results/, so its plot and table links must not start with results/."""
    text = rr.render()
    assert "](results/" not in text and "](goodput_vs_age/goodput_vs_age.png)" in text
