"""Plots of a comparison with trials (PNG, matplotlib Agg), from the per-cell rows of
``harness.report.verdict`` (centres and intervals over trials, each interval with the coverage it has).

- ``goodput_vs_age.png``: measured whole-run goodput per strategy against checkpoint age, and AccelPact's
  measured gain over each baseline with its interval as an error bar on every point (the verdict's
  number; the badput-based gain, a diagnostic, as a hollow marker beside it), the paper's figures as stars.
- ``badput_by_part.png``: per strategy and age, the median badput stacked by part (docs/goodput.md's names).
- ``timeline.png`` and ``recovery_breakdown.png``: one trial's runs, as ``harness.report.plots_compare``.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import strategies
from harness.report import plots_compare
from harness.report.badput_goodput import PART_NAMES
from harness.report.plots_compare import GOODPUT_FILE, _color, _legend, _plt

BADPUT_FILE = "badput_by_part.png"


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _err(rows: Sequence[dict[str, Any]], key: str) -> list[list[float]]:
    """Matplotlib's asymmetric error bars (below, above) for ``key`` from its ``_lo``/``_hi`` columns (0 if none)."""
    lo = [r[key] - r[f"{key}_lo"] if _ok(r.get(f"{key}_lo")) else 0.0 for r in rows]
    hi = [r[f"{key}_hi"] - r[key] if _ok(r.get(f"{key}_hi")) else 0.0 for r in rows]
    return [lo, hi]


def _interval(row: dict[str, Any], key: str) -> Any:
    """The ``Interval`` of ``key`` in a cell row (for its coverage)."""
    from harness.report.intervals import Interval  # lazy: numpy, scipy

    def num(k: str) -> float:
        v = row.get(k)
        return float(v) if _ok(v) else math.nan  # type: ignore[arg-type]  # _ok: a number

    return Interval(
        num(key),
        num(f"{key}_lo"),
        num(f"{key}_hi"),
        int(row.get(f"{key}_n") or 0),
        num(f"{key}_coverage"),
        str(row.get("interval_method") or ""),
    )


def _footer(fig: Any, footer: str | None) -> None:
    """Provenance text under the axes (command, git sha, machine) for a committed figure."""
    if footer:
        width = int(fig.get_figwidth() * 20)  # characters of 6-pt monospace that fit the figure's width
        text = "\n".join(textwrap.fill(line, width) for line in footer.splitlines())
        fig.subplots_adjust(bottom=max(fig.subplotpars.bottom, 0.22))
        fig.text(0.01, 0.01, text, fontsize=6, color="0.35", ha="left", va="bottom", family="monospace")


def plot_goodput_vs_age(
    out: Path,
    cells: Sequence[dict[str, Any]],
    paper_gain: dict[tuple[str, int], float] | None = None,
    footer: str | None = None,
) -> Path:
    plt = _plt()
    ours = next((r["ours"] for r in cells if r.get("ours")), strategies.under_test().name)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for r in cells:
        if r["age"] is None and _ok(r.get("goodput")):
            ax.axhline(r["goodput"], color="black", linestyle="--", label="fault-free reference")
    faults = list(dict.fromkeys(r.get("fault") for r in cells if r["age"] is not None))
    # One series per strategy, or per (strategy, fault) when the sweep varied the fault: points of two
    # faults at one age are different cells and must not share a line.
    series = list(dict.fromkeys((r["strategy"], r.get("fault")) for r in cells if r["age"] is not None))
    for i, (s, f) in enumerate(series):
        name = s if len(faults) < 2 else f"{s}, {f}"
        style = "-" if len(faults) < 2 else ("-", "--", ":", "-.")[faults.index(f) % 4]
        mine = [r for r in cells if r["strategy"] == s and r.get("fault") == f and r["age"] is not None]
        pts = sorted((r for r in mine if _ok(r.get("goodput"))), key=lambda r: r["age"])
        if pts:
            ax.errorbar(
                [r["age"] for r in pts],
                [r["goodput"] for r in pts],
                yerr=_err(pts, "goodput"),
                fmt="o" + style,
                capsize=3,
                color=_color(s),
                label=name,
            )
        if s == ours:
            continue
        gains = sorted((r for r in mine if _ok(r.get("gain"))), key=lambda r: r["age"])
        if not gains:
            continue
        dx = 0.15 * (i + 1)  # side by side, so intervals at the same age do not hide each other
        n = "/".join(sorted({str(r["trials"]) for r in gains}))
        ax2.errorbar(
            [r["age"] + dx for r in gains],
            [r["gain"] for r in gains],
            yerr=_err(gains, "gain"),
            fmt="o" + style,
            capsize=4,
            color=_color(s),
            label=f"ours vs {name} (measured whole-run, n={n})",
        )
        diag = [r for r in gains if _ok(r.get("gain_bp"))]
        ax2.errorbar(
            [r["age"] + dx + 0.3 for r in diag],
            [r["gain_bp"] for r in diag],
            yerr=_err(diag, "gain_bp"),
            fmt="o",
            mfc="none",
            capsize=2,
            color=_color(s),
            alpha=0.6,
            label=f"ours vs {name} (badput-based, diagnostic)",
        )
    for (s, age), gain in (paper_gain or {}).items():
        ax2.plot(
            [age],
            [gain],
            "*",
            markersize=14,
            color=_color(s),
            markeredgecolor="black",
            label=f"paper vs {s} (age {age}): {gain}x",
        )
    from harness.report.intervals import coverage_text  # lazy: numpy, scipy

    covered = coverage_text([_interval(r, "gain") for r in cells if r["age"] is not None and r["strategy"] != ours])
    method = next((str(r["interval_method"]) for r in cells if r.get("interval_method")), "")
    ax.set(
        xlabel="checkpoint age (steps committed since the newest checkpoint)",
        ylabel="measured whole-run goodput (tokens/s)",
        title=f"goodput (median, {method} interval)",
    )
    ax2.axhline(1.0, color="grey", linewidth=0.8)
    delta = next((float(r["min_effect"]) for r in cells if _ok(r.get("min_effect"))), 0.0)
    if delta > 0:
        ax2.axhspan(1.0 / (1.0 + delta), 1.0 + delta, color="0.9", zorder=0, label=f"minimum effect ±{delta:.0%}")
    ax2.set(
        xlabel="checkpoint age",
        ylabel="AccelPact goodput / baseline goodput",
        title=f"AccelPact's measured gain (coverage {covered})",
    )
    _legend(ax, fontsize=7)
    _legend(ax2, fontsize=6)
    fig.tight_layout()
    _footer(fig, footer)
    path = out / GOODPUT_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_badput_by_part(out: Path, cells: Sequence[dict[str, Any]], footer: str | None = None) -> Path:
    """Stacked median badput by part, one bar per cell (strategy, age, fault), the reference first."""
    plt = _plt()
    bars = [r for r in cells if any(_ok(r.get(f"{p}_s")) for p in PART_NAMES)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(bars)), 4.5))
    bottoms = [0.0] * len(bars)
    cmap = plt.get_cmap("tab20")
    for i, part in enumerate(PART_NAMES):
        vals = [float(r.get(f"{part}_s")) if _ok(r.get(f"{part}_s")) else 0.0 for r in bars]  # type: ignore[arg-type]
        if not any(v > 0 for v in vals):
            continue
        ax.bar(range(len(bars)), vals, bottom=bottoms, label=part, color=cmap(i))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    several = len({r.get("fault") for r in bars if _ok(r["age"])}) > 1
    labels = [
        f"{r['strategy']}"
        + ("" if not _ok(r["age"]) else f"\nage {int(r['age'])}")
        + (f"\n{r.get('fault')}" if several and _ok(r["age"]) else "")
        + f"\nn={int(r['trials'])}"
        for r in bars
    ]
    ax.set_xticks(range(len(bars)), labels, fontsize=7)
    ax.set(ylabel="badput, seconds (median over trials, mean over ranks)", title="badput by part")
    _legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    _footer(fig, footer)
    path = out / BADPUT_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(
    out: Path,
    cells: Sequence[dict[str, Any]],
    one_trial: Sequence[tuple[Path, dict[str, Any]]],
    paper_gain: dict[tuple[str, int], float] | None = None,
) -> list[Path]:
    """The comparison's plots; ``one_trial``: (run_dir, row) of one trial, for its timeline and breakdown."""
    baseline = max(paper_gain, key=lambda k: k[1])[0] if paper_gain else None
    # The timeline and the per-fault breakdown of one trial; the goodput plot is the one with intervals.
    others = plots_compare.plot_all(out, [], one_trial, timeline_strategy=baseline)
    return [plot_goodput_vs_age(out, cells, paper_gain), plot_badput_by_part(out, cells), *others]
