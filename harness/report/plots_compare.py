"""Plots of a comparison (PNG, matplotlib Agg), written into the comparison's directory.

- ``goodput_vs_age.png``: whole-run goodput against checkpoint age per strategy (the reference as a
  line), and AccelPact's gain over each baseline against age with the paper's figures marked.
- ``timeline.png``: a per-rank timeline of one run (the cold restart at the largest age by default):
  steps, replayed steps, checkpoint stalls, restarts, restores, in-memory recoveries and faults.
- ``recovery_breakdown.png``: per strategy and age, the badput charged to the fault, stacked by part
  (detection, agreement, rebuild, rebind, restart, restore, replay, other).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import events as ev
from harness import strategies
from harness.faults import registry as faults
from harness.report.goodput import GoodputReport, load_report

GOODPUT_FILE = "goodput_vs_age.png"
TIMELINE_FILE = "timeline.png"
BREAKDOWN_FILE = "recovery_breakdown.png"
_PARTS = ("detection", "agreement", "rebuild", "rebind", "restart", "restore", "replay", "other")


def _color(strategy: str) -> str | None:
    try:
        return strategies.get(strategy).color
    except KeyError:  # a row of a strategy this checkout does not register: matplotlib picks
        return None


def _plt() -> Any:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    return plt


def _legend(ax: Any, **kwargs: Any) -> None:
    """A legend where the axes have labelled artists (an empty one only makes matplotlib warn)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def plot_goodput_vs_age(
    out: Path, table: Sequence[dict[str, Any]], paper_gain: dict[tuple[str, int], float] | None = None
) -> Path:
    """Goodput per strategy against checkpoint age, and AccelPact's gain with the paper's figures."""
    plt = _plt()
    reference = strategies.reference()
    ours = strategies.under_test({str(r["strategy"]) for r in table}).name
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in table:
        if r["strategy"] == reference.label and r["age"] is None:
            ax.axhline(r["goodput"], color="black", linestyle="--", label="fault-free reference")
    for s in sorted({r["strategy"] for r in table if r["age"] is not None}):
        pts = sorted((r["age"], r["goodput"]) for r in table if r["strategy"] == s and r["age"] is not None)
        ax.plot([a for a, _ in pts], [g for _, g in pts], "o-", color=_color(s), label=s)
        if s != ours:
            gains = sorted(
                (r["age"], r["accelpact_gain"])
                for r in table
                if r["strategy"] == s and r["age"] is not None and _ok(r["accelpact_gain"])
            )
            ax2.plot([a for a, _ in gains], [g for _, g in gains], "o-", color=_color(s), label=f"ours vs {s}")
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
    ax.set(
        xlabel="checkpoint age (steps committed since the newest checkpoint)",
        ylabel="goodput (tokens/s)",
        title="whole-run goodput",
    )
    ax2.axhline(1.0, color="grey", linewidth=0.8)
    ax2.set(xlabel="checkpoint age", ylabel="AccelPact goodput / baseline goodput", title="AccelPact's gain")
    _legend(ax, fontsize=7)
    _legend(ax2, fontsize=7)
    fig.tight_layout()
    path = out / GOODPUT_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(out: Path, events: Sequence[Mapping[str, Any] | ev.Event], title: str) -> Path:
    plt = _plt()
    events = ev.typed(events)
    ranks = sorted({e.rank for e in events if e.rank >= 0})
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.8 * max(1, len(ranks))))
    draw_timeline(ax, events)
    ax.legend(handles=timeline_legend(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set(title=title)
    fig.tight_layout()
    path = out / TIMELINE_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TIMELINE_COLORS: tuple[tuple[str, str], ...] = (
    ("tab:green", "step"),
    ("tab:orange", "replayed step"),
    ("tab:blue", "checkpoint stall"),
    ("tab:gray", "restart (launch -> ready)"),
    ("tab:brown", "restore"),
    ("tab:purple", "in-memory recovery"),
    ("red", "fault"),
)


def timeline_legend() -> list[Any]:
    """The legend handles of :func:`draw_timeline`'s colours."""
    from matplotlib.patches import Patch  # lazy: matplotlib

    return [Patch(color=c, label=lbl) for c, lbl in TIMELINE_COLORS]


def draw_timeline(ax: Any, events: Sequence[Mapping[str, Any] | ev.Event], t0: float | None = None) -> float:
    """One run's timeline on ``ax``: a row per rank with its steps (replays in orange), checkpoint stalls,
    restarts, restores, in-memory recoveries, and a red line at every fault. ``t0``: the time origin (None:
    the run's first step). Returns the origin used."""
    events = ev.typed(events)
    ranks = sorted({e.rank for e in events if e.rank >= 0})
    steps = ev.of_type(events, ev.Step)
    if t0 is None:
        t0 = min((e.t_start for e in steps), default=0.0)
    seen: set[tuple[int, int]] = set()
    for s in sorted(steps, key=lambda e: (e.incarnation, e.t_start)):
        key = (s.rank, s.step)
        replay = key in seen or s.replay
        seen.add(key)
        ax.barh(
            s.rank,
            s.t_end - s.t_start,
            left=s.t_start - t0,
            height=0.5,
            color="tab:orange" if replay else "tab:green",
            edgecolor="white",
            linewidth=0.3,
        )

    def span(spans: Sequence[tuple[int, float, float]], color: str, height: float = 0.7) -> None:
        for rank, a, b in spans:
            if rank >= 0:
                ax.barh(rank, b - a, left=a - t0, height=height, color=color, alpha=0.8)

    span([(e.rank, e.t_start, e.t_end) for e in ev.of_type(events, ev.Checkpoint)], "tab:blue")
    span([(e.rank, e.t_start, e.t_end) for e in ev.of_type(events, ev.Restore)], "tab:brown")
    span(
        [(e.rank, e.t_launch, e.t_ready) for e in ev.of_type(events, ev.Restart) if e.t_launch is not None],
        "tab:gray",
        0.3,
    )
    for e in events:
        if isinstance(e, ev.Recovery) and e.rank >= 0:
            ax.barh(e.rank, max(e.t - e.t_begin, 0.02), left=e.t_begin - t0, height=0.8, color="tab:purple")
        if isinstance(e, ev.Fault):
            ax.axvline(e.t - t0, color="red", linewidth=1.5)
        if isinstance(e, ev.Fallback):
            ax.axvline(e.t - t0, color="magenta", linestyle=":")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set(xlabel="seconds since the first step")
    return t0


def fault_breakdown(report: GoodputReport) -> dict[str, float]:
    """Seconds charged to the run's faults, by part (mean over ranks, summed over faults). Pure."""
    out = {p: 0.0 for p in _PARTS}
    for f in report.faults:
        for p in _PARTS:
            out[p] += getattr(f.badput, f"{p}_s")
    return out


def plot_breakdown(out: Path, runs: Sequence[tuple[str, dict[str, float]]]) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(runs)), 4))
    bottoms = [0.0] * len(runs)
    cmap = plt.get_cmap("tab10")
    for i, part in enumerate(_PARTS):
        vals = [parts[part] for _, parts in runs]
        ax.bar(range(len(runs)), vals, bottom=bottoms, label=part, color=cmap(i))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(runs)), [name for name, _ in runs], rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="seconds lost to the fault (mean over ranks)", title="recovery time, broken down")
    _legend(ax, fontsize=7)
    fig.tight_layout()
    path = out / BREAKDOWN_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(
    out: Path,
    table: Sequence[dict[str, Any]],
    runs: Sequence[tuple[Path, dict[str, Any]]],
    timeline_run: Path | None = None,
    paper_gain: dict[tuple[str, int], float] | None = None,
    timeline_strategy: str | None = None,
) -> list[Path]:
    """The three plots of a comparison; ``runs`` are (run_dir, results row). The timeline shows
    ``timeline_run``, else the largest-age run of ``timeline_strategy`` (else any faulted run). With no
    ``table`` (a comparison with trials draws its own goodput plot) the goodput plot is left out."""
    paths = [plot_goodput_vs_age(out, table, paper_gain)] if table else []
    faulted = [(d, r) for d, r in runs if r.get("fault") not in (None, faults.NO_FAULT)]
    if timeline_run is None and faulted:
        pick = sorted(faulted, key=lambda dr: (dr[1].get("strategy") != timeline_strategy, -(dr[1].get("age") or 0)))
        timeline_run = pick[0][0]
    if timeline_run is not None:
        row = next((r for d, r in runs if d == timeline_run), {})
        title = f"{Path(timeline_run).name}: {row.get('strategy')}, {row.get('fault')} at age {row.get('age')}"
        paths.append(plot_timeline(out, ev.load_events(timeline_run), title))
    bars = [(f"{r.get('strategy')}\nage {r.get('age')}", fault_breakdown(load_report(str(d)))) for d, r in faulted]
    if bars:
        paths.append(plot_breakdown(out, bars))
    return paths
