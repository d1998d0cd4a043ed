"""The comparison's verdict table: every run's goodputs per trial, then per cell the centre over trials,
the interval of AccelPact's measured gain (with the coverage it really has) and the verdict under the
minimum effect, printed and written with the plots.

Input is one row per run and trial (``harness.report.compare.trial_rows``: the measured whole-run
goodput, the badput-based one beside it, AccelPact's gain as that trial's AccelPact run over that trial's
run of the row's strategy). Writes ``table.md`` and ``table.csv`` (one row per cell), ``runs.csv`` (one
row per run and trial) and the plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import strategies
from harness.report.intervals import DEFAULT_METHOD, DESCRIPTIONS, LEVEL, MIN_EFFECT, Interval, coverage_text
from harness.report.table import cell, format_table
from harness.report.trials import summarize_cells, trial_of

PRINT_COLUMNS: tuple[str, ...] = (
    "strategy",
    "age",
    "trials",
    "goodput",
    "gain_ci",
    "verdict",
    "gain_bp_ci",
    "step_drift_ci",
    "badput_s",
    "replayed_steps",
    "paper_gain",
    "fallback",
    "bit_identical",
    "notes",
    "status",
)


def print_columns(cells: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """``PRINT_COLUMNS``, with a ``fault`` column after ``age`` when the sweep varied the fault."""
    if len({c.get("fault") for c in cells if c.get("age") is not None}) < 2:
        return PRINT_COLUMNS
    at = PRINT_COLUMNS.index("age") + 1
    return (*PRINT_COLUMNS[:at], "fault", *PRINT_COLUMNS[at:])


def _trial(run_dir: Path, sweep_dir: Path) -> int:
    return trial_of(run_dir.parent.name) if run_dir.parent != sweep_dir else 0


def _status(cell: dict[str, Any]) -> str:
    failed = cell["runs"] - cell["trials"]
    return "ok" if not failed else f"{failed} of {cell['runs']} failed"


def footer(cells: Sequence[dict[str, Any]]) -> str:
    """How to read the verdict table: the interval method, the coverage its intervals really have, the
    minimum effect and what every column is."""
    method = next((str(c["interval_method"]) for c in cells if c.get("interval_method")), DEFAULT_METHOD)
    delta = next((float(c["min_effect"]) for c in cells if c.get("min_effect") is not None), MIN_EFFECT)
    ours = next((str(c["ours"]) for c in cells if c.get("ours")), "AccelPact")
    level = next((float(c["level"]) for c in cells if c.get("level") is not None), LEVEL)
    gains = [
        Interval(c["gain"], c["gain_lo"], c["gain_hi"], int(c["gain_n"]), c.get("gain_coverage", math.nan), method)
        for c in cells
        if c.get("age") is not None and c.get("gain_n")
    ]
    n = sorted({c["trials"] for c in cells if c["age"] is not None})
    return (
        f"trials per cell: {', '.join(map(str, n))} (each trial: the reference and every run, in a rotated "
        f"order). gain_ci: {ours}'s measured whole-run goodput / this row's, paired by trial: centre "
        f"[interval] (n trials); interval: {method}, the {DESCRIPTIONS.get(method, method)}; coverage "
        f"{coverage_text(gains)} (asked: {level:.0%}). verdict: from gain_ci with a minimum effect of "
        f"{delta:.0%}: better when the whole interval lies above {1 + delta:.2f}, worse when below "
        f"{1 / (1 + delta):.3f}, the same when it lies between them, else within noise. goodput: measured "
        "whole-run goodput (useful tokens / wall seconds, first step to last), median; every cost of the "
        "strategy is in it. gain_bp_ci: the same gain on the badput-based goodput (useful steps x the "
        "references' median productive step + the run's measured badput): a diagnostic of where the time "
        "went, blind to a slower step (docs/goodput.md). step_drift_ci: the run's productive step / its "
        "trial's reference's. badput_s: every measured badput second (mean over ranks), median; by part in "
        "table.csv. notes: steps more than 10% off the reference's pace, a load spike (mean load above 1.5x "
        "the cores used). Every run of every trial: runs.csv."
    )


def write_tables(out_dir: Path, runs: list[dict[str, Any]], cells: list[dict[str, Any]], title: str) -> str:
    """``runs.csv``, ``table.csv`` and ``table.md``; returns the printed table."""
    import pandas as pd  # lazy: pandas

    pd.DataFrame(runs).to_csv(out_dir / "runs.csv", index=False)
    pd.DataFrame(cells).to_csv(out_dir / "table.csv", index=False)
    columns = print_columns(cells)
    text = format_table(cells, columns)
    md = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in cells:
        md.append("| " + " | ".join(cell(r.get(c)).replace("|", "/") for c in columns) + " |")
    md += ["", footer(cells), ""]
    (out_dir / "table.md").write_text("\n".join(md))
    return text


def read_cells(table_csv: Path) -> list[dict[str, Any]]:
    """A comparison's ``table.csv`` (one row per cell, as ``write_tables`` wrote it) read back, NaN as None:
    what the plots of ``harness.report.plots_trials`` take, for drawing them again elsewhere."""
    import pandas as pd  # lazy: pandas

    return [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}  # type: ignore[misc]
        for r in pd.read_csv(table_csv).to_dict("records")
    ]


def load_warning(runs: Sequence[dict[str, Any]]) -> str | None:
    """One line when some runs ran with more load than cores, else None."""
    over = [
        r
        for r in runs
        if isinstance(r.get("load_max"), (int, float))
        and isinstance(r.get("cores_used"), (int, float))
        and not math.isnan(r["load_max"])
        and r["load_max"] > r["cores_used"]
    ]
    if not over:
        return None
    worst = max(r["load_max"] for r in over)
    return (
        f"load: {len(over)} of {len(runs)} runs ran with the load average above the cores they use (up to "
        f"{worst:.1f}); their measured goodput is slowed: trials interleave so that it slows every strategy alike, "
        "and the notes column names the cells a load spike hit (docs/goodput.md)"
    )


def finish_trials(
    out_dir: Path,
    runs: list[dict[str, Any]],
    entries: Sequence[tuple[Path, dict[str, Any]]],
    title: str,
    paper_gain: dict[tuple[str, int], float],
    method: str = DEFAULT_METHOD,
    min_effect: float = MIN_EFFECT,
    ours: str | None = None,
    level: float = LEVEL,
) -> list[dict[str, Any]]:
    """Per-cell verdicts, files and plots of a finished comparison sweep from its per-run rows ``runs``
    (``harness.report.compare.trial_rows``); ``entries``: (run_dir, results row), for the timeline.
    ``method`` and ``min_effect``: the interval and the verdict's minimum effect (``compare.*``); ``ours``:
    the strategy whose gain is reported (None: the in-memory strategy among the runs)."""
    PAPER_GAIN = paper_gain
    cells = summarize_cells(runs, method, min_effect, level)
    ours = strategies.under_test({str(c["strategy"]) for c in cells}, ours).name
    for c in cells:
        c["status"] = _status(c)
        c["ours"] = ours
        if c["strategy"] == ours:  # its gain over itself is 1 by definition: no verdict to draw
            c["verdict"] = c["verdict_bp"] = c["gain_ci"] = c["gain_bp_ci"] = "-"
        if c["paper_gain"] is None and c["age"] is not None:
            c["paper_gain"] = PAPER_GAIN.get((c["strategy"], c["age"]))
    text = write_tables(out_dir, runs, cells, title)
    print(f"\n{title}\n{text}\n  table: {out_dir / 'table.md'} (every run: {out_dir / 'runs.csv'})", flush=True)
    warning = load_warning(runs)
    if warning:
        print(f"  {warning}", flush=True)
    try:
        from harness.report import plots_trials

        first = [
            (d, r) for d, r in entries if _trial(d, out_dir) == min((_trial(x, out_dir) for x, _ in entries), default=0)
        ]
        paths = plots_trials.plot_all(out_dir, cells, first, paper_gain=PAPER_GAIN)
        print("  plots: " + ", ".join(str(p) for p in paths), flush=True)
    except Exception as exc:  # noqa: BLE001 - a plot must never cost the table
        print(f"warning: comparison plots failed: {type(exc).__name__}: {exc}")
    return cells
