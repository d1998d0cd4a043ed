"""No source module over 450 lines: a module past that has usually grown a second idea, which wants its own
module (and its own name). Counted as ``wc -l`` counts them, after ruff's formatting."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450
SOURCES = ("accelpact", "harness", "experiments", "benchmarks", "examples")


def long_modules(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    out = []
    for top in SOURCES:
        for path in sorted((root / top).rglob("*.py")):
            n = path.read_bytes().count(b"\n")
            if n > limit:
                out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def test_no_source_module_is_over_450_lines():
    long = long_modules()
    assert not long, f"modules over {MAX_LINES} lines (split each along its ideas):\n" + "\n".join(long)


def test_the_count_sees_a_long_module(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "harness" / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert long_modules(tmp_path) == [f"harness/long.py: {MAX_LINES + 1} lines"]
