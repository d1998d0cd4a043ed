"""The goodput-vs-age plots: goodput and AccelPact's gain against checkpoint age, the fault's badput by
part, and the comparison's interval plots drawn again with the provenance footer.

Like the tables (``experiments.goodput_report``), everything here derives from data.csv's rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.goodput_model import (
    BASELINES,
    FAULT_PARTS,
    REFERENCE_STRATEGY,
    STRATEGIES,
    GainModel,
    _f,
    gains_by_age,
    implied_paper_model,
)
from experiments.provenance import stamp_figure
from harness import strategies
from harness.report.paper import PAPER_GAIN, PAPER_GAIN_SETUP

_PART_COLORS = {
    "detection": "#1b9e77",
    "agreement": "#66a61e",
    "rebuild": "#a6d854",
    "rebind": "#006d2c",
    "restart": "#d62728",
    "restore": "#8c564b",
    "replay": "#ff7f0e",
    "other": "#7f7f7f",
}


def plot(out: Path, data: Sequence[Mapping[str, Any]], fits: Sequence[Mapping[str, Any]], prov: Any) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paper = implied_paper_model()
    ages = sorted({r["age"] for r in data if r["age"] is not None})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.2))
    ref = next((r for r in data if r["strategy"] == REFERENCE_STRATEGY), None)
    if ref:
        ax.axhline(ref["goodput"], color="black", ls="--", lw=1, label="fault-free reference")
    for s in STRATEGIES:
        pts = sorted((r["age"], r["goodput"]) for r in data if r["strategy"] == s and r["age"] is not None)
        if pts:
            ax.plot([a for a, _ in pts], [g for _, g in pts], "o-", color=strategies.get(s).color, label=s)
    ax.set(
        xlabel="checkpoint age (steps committed since the newest checkpoint)",
        ylabel="whole-run goodput (tokens/s)",
        title="goodput per strategy (measured)",
    )
    ax.legend(fontsize=7.5)
    xs = [0, max(ages, default=30)]
    for b in BASELINES:
        color = strategies.get(b).color
        meas = gains_by_age(data, b)
        norm = gains_by_age(data, b, "accelpact_gain_norm")
        ax2.plot([a for a, _ in meas], [g for _, g in meas], "o-", color=color, label=f"ours vs {b} (measured)")
        ax2.plot(
            [a for a, _ in norm],
            [g for _, g in norm],
            "o--",
            mfc="none",
            color=color,
            alpha=0.7,
            label=f"ours vs {b} (load-normalized)",
        )
        fit = next(
            (f for f in fits if f["source"] == "ours (fit)" and f["baseline"] == b and f["gains"] == "measured"), None
        )
        if fit:
            m = GainModel(fit["r_over_t"], fit["s_over_t"])
            ax2.plot(
                xs,
                [m.gain(x) for x in xs],
                ":",
                color=color,
                lw=1,
                label=f"model fit vs {b}: R/s={fit['r_over_s']:.1f}, T/s={fit['t_steps']:.0f}",
            )
    ax2.plot(
        xs,
        [paper.gain(x) for x in xs],
        "-",
        color="0.4",
        lw=0.8,
        label=f"paper's implied model (cold restart): R/s={paper.r_over_s:.2f}, T/s={paper.t_steps:.0f}",
    )
    for (b, age), g in PAPER_GAIN.items():
        ax2.plot(
            [age], [g], "*", ms=14, color=strategies.get(b).color, mec="black", label=f"paper vs {b}, age {age}: {g}x"
        )
    ax2.axhline(1.0, color="0.6", lw=0.8)
    ax2.set(xlabel="checkpoint age", ylabel="AccelPact goodput / baseline goodput", title="AccelPact's whole-run gain")
    ax2.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.suptitle(
        "Whole-run goodput vs checkpoint age: mistral_tiny, 2 gloo ranks on CPU, socket reset on rank 0 "
        f"(paper: {PAPER_GAIN_SETUP})",
        fontsize=9.5,
    )
    fig.subplots_adjust(top=0.88, wspace=0.22, left=0.06, right=0.72)
    stamp_figure(fig, prov)
    p1 = out / "goodput_vs_age.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    runs = [
        r
        for s in STRATEGIES
        for r in sorted((r for r in data if r["strategy"] == s and r["age"] is not None), key=lambda r: r["age"])
    ]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.42 * len(runs) + 2), 7.2), sharex=True)
    x = list(range(len(runs)))
    for ax, unit in ((axes[0], "s"), (axes[1], "steps")):
        bottom = [0.0] * len(runs)
        for p in FAULT_PARTS:
            vals = [(_f(r[f"fault_{p}_s"]) / (_f(r["step_median_s"]) if unit == "steps" else 1.0)) for r in runs]
            vals = [0.0 if math.isnan(v) else v for v in vals]
            ax.bar(x, vals, bottom=bottom, color=_PART_COLORS[p], label=p, width=0.75)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("badput of the fault (s)" if unit == "s" else "... in the run's median steps")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=4)
    axes[0].set_title("Time lost to one socket reset, by part (mean over ranks); paper: not reported", fontsize=9)
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(
        [f"{r['strategy'].replace('checkpoint_', 'ckpt_')}\nage {r['age']}" for r in runs], fontsize=6.5, rotation=90
    )
    fig.subplots_adjust(bottom=0.2, top=0.95, hspace=0.08)
    stamp_figure(fig, prov)
    p2 = out / "recovery_breakdown.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]


def redraw_verdict_plots(out: Path, prov: Any) -> list[Path]:
    """The comparison's plots with intervals (gain_intervals.png, badput_by_part.png), drawn again from its
    table (verdict.csv) with the provenance footer: the sweep drew them without one."""
    import shutil
    import tempfile

    from experiments.provenance import footer_text
    from harness.report import plots_trials
    from harness.report.compare import PAPER_GAIN
    from harness.report.verdict import read_cells

    if not (out / "verdict.csv").exists():
        return []
    cells = read_cells(out / "verdict.csv")
    with tempfile.TemporaryDirectory() as tmp:
        drawn = [
            (
                plots_trials.plot_goodput_vs_age(Path(tmp), cells, dict(PAPER_GAIN), footer=footer_text(prov)),
                out / "gain_intervals.png",
            ),
            (plots_trials.plot_badput_by_part(Path(tmp), cells, footer=footer_text(prov)), out / "badput_by_part.png"),
        ]
        for src, dst in drawn:
            shutil.move(str(src), dst)
    return [dst for _, dst in drawn]
