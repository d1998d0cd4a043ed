"""The scale projection's plots: ETTR against cluster size (anchors starred), against the checkpoint
interval at 16k and 100k GPUs, and the badput by failure class at the largest size.
"""

from __future__ import annotations

from pathlib import Path

from experiments.provenance import stamp_figure
from harness import strategies
from harness.fleet.config import CLASSES
from harness.fleet.sources import ANCHORS
from harness.scale.entry import strategy_names


def _plotted(strategy: str) -> bool:
    """Whether a strategy gets a curve: the fault-free reference (ETTR 1 by construction) does not."""
    return not strategies.simulated()[strategy].fault_free


def plots(out: Path, by_size: dict, prov) -> None:  # noqa: ANN001
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.scale.outcomes import DESIGN_BUILDS

    projected = {p.name for p in strategies.projected_strategies()}  # dashed: rows only the simulator has
    designs = {n for n, sim in strategies.simulated().items() if sim.build in DESIGN_BUILDS}  # dotted
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = sorted(by_size)
    for s in strategy_names():
        if not _plotted(s):
            continue
        pts = [(g, p.best_ettr, p.best_ci) for g in sizes for p in by_size[g] if p.strategy == s and p.feasible]
        if pts:
            ax.errorbar(
                [x[0] for x in pts],
                [x[1] for x in pts],
                yerr=[x[2] for x in pts],
                marker="o",
                ms=3,
                capsize=2,
                label=s,
                color=strategies.color(s),
                ls=":" if s in designs else "--" if s in projected else "-",
            )
    for a in ANCHORS:
        ax.scatter([a.gpus], [a.ettr], marker="*", s=120, color="k", zorder=5)
        ax.annotate(a.name, (a.gpus, a.ettr), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("ETTR at the best checkpoint interval")
    ax.set_title(
        "Simulated ETTR vs cluster size (Llama 3 failure mix; dashed: rows only the simulator has; "
        "dotted: designs, not built)",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.subplots_adjust(bottom=0.22)
    stamp_figure(fig, prov)
    fig.savefig(out / "ettr_vs_gpus.png", dpi=130)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, g in zip(axes, (16384, 100_000)):
        for p in by_size.get(g, []):
            if not _plotted(p.strategy) or not p.feasible:
                continue
            ax.errorbar(
                [t / 60 for t in p.intervals_s],
                p.ettr,
                yerr=p.ettr_ci,
                marker=".",
                capsize=2,
                label=p.strategy,
                color=strategies.color(p.strategy),
            )
            ax.axvline(p.daly_s / 60, color=strategies.color(p.strategy), lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("checkpoint interval (minutes of work); dotted: Daly")
        ax.set_ylabel("ETTR")
        ax.set_title(f"{g:,} GPUs", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.subplots_adjust(bottom=0.25)
    stamp_figure(fig, prov)
    fig.savefig(out / "ettr_vs_interval.png", dpi=130)
    plt.close(fig)

    g = 100_000 if 100_000 in by_size else sizes[-1]
    ps = [p for p in by_size[g] if p.feasible and _plotted(p.strategy)]
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(ps)
    for cls in list(CLASSES) + ["checkpoint"]:
        vals = [p.badput.get(cls, 0.0) for p in ps]
        ax.bar([p.strategy for p in ps], vals, bottom=bottom, label=cls)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("share of wall time")
    ax.set_title(f"Badput by failure class at the best interval, {g:,} GPUs", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, rotation=15)
    ax.legend(fontsize=7)
    fig.subplots_adjust(bottom=0.3)
    stamp_figure(fig, prov)
    fig.savefig(out / "badput_by_class.png", dpi=130)
    plt.close(fig)
