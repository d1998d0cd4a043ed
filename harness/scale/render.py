"""Tables of projections: plain text for the terminal, markdown for results/scale_projection/table.md."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from harness.fleet.config import CLASSES
from harness.fleet.sources import ANCHORS, Anchor
from harness.scale.project import Projection
from harness.strategies import simulated


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _minutes(s: float) -> str:
    if s is None or math.isnan(s):
        return "-"
    return "never" if math.isinf(s) else f"{s / 60:.0f} min"


def nearest_anchor(gpus: int) -> Anchor | None:
    """The published ETTR anchor for a cluster within 25% of ``gpus``, if any."""
    near = [a for a in ANCHORS if 0.8 <= a.gpus / gpus <= 1.25]
    return min(near, key=lambda a: abs(a.gpus - gpus)) if near else None


def anchors_for(gpus: int) -> str:
    """The published anchor near ``gpus``, as one cell."""
    a = nearest_anchor(gpus)
    return f"{a.name}: {a.text} ({a.gpus:,} GPUs)" if a else "none published at this size"


def ettr_cell(p: Projection) -> str:
    if not p.feasible:
        return "never finishes"
    return f"{_pct(p.best_ettr)} ± {100 * p.best_ci:.1f}" if p.best_ci == p.best_ci else _pct(p.best_ettr)


def text_table(projections: Sequence[Projection]) -> str:
    """What ``python -m harness experiment=project_scale`` prints: one line per strategy."""
    head = ("strategy", "ETTR (95% CI)", "best interval", "Daly", "what drives it")
    body = []
    for p in projections:
        body.append(
            (
                p.strategy,
                ettr_cell(p),
                _minutes(p.best_interval_s) if p.feasible else "-",
                _minutes(p.daly_s) if p.feasible else "-",
                p.driver if p.feasible else p.reason,
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def anchor_table_md(by_size: Mapping[int, Sequence[Projection]]) -> str:
    """The headline: per size and strategy, ETTR at its best interval beside the published anchor, and in
    one line what drives the difference (the gap to the anchor, then the largest badput and its cause)."""
    lines = [
        "| GPUs | strategy | ETTR at best interval (95% CI, ± points) | best interval | Young / Daly | "
        "published anchor | what drives the difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for gpus, projections in by_size.items():
        a = nearest_anchor(gpus)
        cell = f"{a.name} {a.ettr:.0%} ({a.text})" if a else "none at this size"
        for p in projections:
            yd = f"{_minutes(p.young_s)} / {_minutes(p.daly_s)}" if p.feasible else "-"
            why = p.driver if p.feasible else p.reason
            sim = simulated().get(p.strategy)
            fault_free = sim is not None and sim.fault_free
            if a and p.feasible and not fault_free:
                # A whole-job-stop strategy is compared with the source's synchronous figure when it has one.
                ref, what = (
                    (a.sync_ettr, f"{a.name}'s synchronous {a.sync_ettr:.0%}")
                    if a.sync_ettr is not None and sim is not None and sim.synchronous
                    else (a.ettr, a.name)
                )
                why = f"{100 * (p.best_ettr - ref):+.1f} pts vs {what}; largest loss: {why}"
            elif fault_free:
                why = "no failures drawn: the upper bound"
            lines.append(
                f"| {gpus:,} | {p.strategy} | {ettr_cell(p)} | "
                f"{_minutes(p.best_interval_s) if p.feasible else '-'} | {yd} | {cell} | {why} |"
            )
    return "\n".join(lines)


def badput_table_md(by_size: Mapping[int, Sequence[Projection]]) -> str:
    """Badput at the best interval, as a share of wall time, by failure class (stop + replayed work)."""
    cols = list(CLASSES) + ["checkpoint"]
    lines = ["| GPUs | strategy | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for gpus, projections in by_size.items():
        for p in projections:
            if p.feasible:
                lines.append(
                    f"| {gpus:,} | {p.strategy} | " + " | ".join(_pct(p.badput.get(c, 0.0)) for c in cols) + " |"
                )
    return "\n".join(lines)


def strategy_legend_md() -> str:
    return "\n".join(f"- `{name}`: {sim.label}" for name, sim in simulated().items())
