"""The comparison table: one row per run (strategy, age, goodput, ratios, badput breakdown), pure.

Rows come from each run's saved ``GoodputReport`` (``harness.report.goodput``). Which run is the
reference and which is AccelPact, and the order of the rows, come from the strategy registry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from harness import strategies
from harness.report.goodput import Badput, GoodputReport, goodput_ratio

BREAKDOWN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Badput))
TABLE_COLUMNS: tuple[str, ...] = (
    "strategy",
    "age",
    "fault",
    "goodput",
    "ratio_to_reference",
    "accelpact_gain",
    "wall_s",
    "tokens",
    "faults",
    "replayed_steps",
    *BREAKDOWN_COLUMNS,
    "fallback",
    "bit_identical",
)


@dataclass(frozen=True)
class RunSummary:
    """What the comparison table needs from one run."""

    strategy: str
    report: GoodputReport
    age: int | None = None  # checkpoint age the fault schedule targeted
    fault: str | None = None  # fault kind of the schedule, None for the reference
    bit_identical: bool | None = None  # final state equal to the fault-free reference's; None = not checked


def _find(runs: Sequence[RunSummary], strategy: str, age: int | None, fault: str | None) -> RunSummary | None:
    """The run of ``strategy`` that matches ``age`` (and ``fault`` where both have one), else any of it."""
    same = [r for r in runs if r.strategy == strategy]
    for pick in (
        lambda r: r.age == age and (r.fault is None or fault is None or r.fault == fault),
        lambda r: r.age is None,
        lambda r: True,
    ):
        hits = [r for r in same if pick(r)]
        if hits:
            return hits[0]
    return None


def comparison_table(runs: Sequence[RunSummary], ours: str | None = None) -> list[dict[str, Any]]:
    """One row per run, columns ``TABLE_COLUMNS``, sorted by age then strategy.

    - ``ratio_to_reference``: goodput / the fault-free ("none") run's goodput at the same age (else any
      reference in the list); NaN when the list has no reference.
    - ``accelpact_gain``: the AccelPact run's goodput (same age and fault) / this row's goodput. This is the
      paper's figure: 1.197x on the cold_restart row at age 5. NaN when there is no AccelPact run.
      ``ours``: which strategy is AccelPact here (None: ``strategies.under_test`` of the runs present).
    - breakdown columns: whole-run badput in seconds (mean over ranks), summing to wall_s minus useful time.
    - ``fallback``: "; "-joined reasons accelpact fell back to checkpoint restore ("" when it did not).
    """
    reference = strategies.reference().name
    under_test = strategies.under_test({r.strategy for r in runs}, ours).name
    order = {s.name: s.order for s in strategies.specs()}
    rows: list[dict[str, Any]] = []
    for run in runs:
        ref = _find(runs, reference, run.age, run.fault)
        accelpact = _find(runs, under_test, run.age, run.fault)
        rep = run.report
        row: dict[str, Any] = {
            "strategy": run.strategy,
            "age": run.age,
            "fault": run.fault,
            "goodput": rep.goodput,
            "ratio_to_reference": goodput_ratio(rep, ref.report) if ref else math.nan,
            "accelpact_gain": (
                accelpact.report.goodput / rep.goodput if accelpact is not None and rep.goodput > 0 else math.nan
            ),
            "wall_s": rep.timeline.wall_s,
            "tokens": rep.tokens,
            "faults": len(rep.faults),
            "replayed_steps": rep.replayed_steps,
            **rep.badput.as_dict(),
            "fallback": "; ".join(rep.fallbacks),
            "bit_identical": run.bit_identical,
        }
        rows.append(row)
    rows.sort(
        key=lambda r: (
            r["age"] is None,
            r["age"] if r["age"] is not None else 0,
            order.get(r["strategy"], len(order)),
            r["strategy"],
        )
    )
    return rows


def cell(value: Any) -> str:
    """One table cell as text: '-' for nothing (None, NaN, ''), yes/no, 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value) if value != "" else "-"


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text rendering of ``comparison_table`` rows (what ``python -m harness`` prints)."""
    columns = list(columns or TABLE_COLUMNS)
    body = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in body)
    return "\n".join(lines)
