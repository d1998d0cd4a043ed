"""Trials of a comparison: the interleaving order of the runs, and per cell the median, the interval and
the verdict over trials. Pure (no Hydra, no I/O).

``compare.trials=N`` runs N rounds; each round runs the fault-free reference and every cell once. The
order inside a round is the list (reference first, then the cells) rotated by the round's index, so that
over as many rounds as there are runs each run takes every position of a round once: a drift of the
host's load within a round (another process starting or ending) does not always fall on the same run.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

from harness.report.badput_goodput import PART_NAMES
from harness.report.intervals import DEFAULT_METHOD, LEVEL, MIN_EFFECT, interval, verdict

T = TypeVar("T")
TRIAL_DIR = "trial"  # runs of trial k go to <sweep>/trial<k>/


def round_order(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` rotated left by ``round_index``: round 0 keeps the order, round 1 starts at the second."""
    if not items:
        return []
    k = round_index % len(items)
    return list(items[k:]) + list(items[:k])


def interleave(items: Sequence[T], trials: int) -> list[tuple[int, T]]:
    """Every (trial, item) of ``trials`` rounds, round by round, each round in ``round_order``."""
    if trials < 1:
        raise ValueError(f"compare.trials must be 1 or more, got {trials}")
    return [(k, item) for k in range(trials) for item in round_order(items, k)]


def trial_of(dirname: str) -> int:
    """The trial index of a ``trial<k>`` directory name; 0 for any other name (a run made without trials)."""
    tail = dirname[len(TRIAL_DIR) :] if dirname.startswith(TRIAL_DIR) else ""
    return int(tail) if tail.isdigit() else 0


def as_float(v: Any) -> float:
    """A number from a row or a CSV cell; NaN for None, a bool, '' and text."""
    if v is None or isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# Columns aggregated per cell: (output name, per-trial row key). Each gets <name> (the centre), <name>_lo,
# <name>_hi, <name>_n, <name>_coverage and <name>_ci (the interval's text).
INTERVAL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("gain", "accelpact_gain"),  # AccelPact's measured whole-run goodput / this row's: the verdict's number
    ("gain_bp", "accelpact_gain_bp"),  # the same with the badput-based goodput: where the time went
    ("goodput_bp", "goodput_bp"),
    ("goodput", "goodput"),
    ("ratio_to_reference_bp", "ratio_to_reference_bp"),
    ("step_drift", "step_drift"),
)
CI_COLUMNS: tuple[str, ...] = ("gain", "gain_bp", "step_drift")
MEDIAN_COLUMNS: tuple[str, ...] = (
    "badput_s",
    "replayed_steps",
    "load_mean",
    "load_max",
    "steal_pct",
    *(f"{p}_s" for p in PART_NAMES),
)
# A cell's productive steps this far from the reference's (either way) are named in its notes.
DRIFT_NOTE = 0.10
# A cell whose runs' mean load exceeded the cores they use by half is named in its notes (a load spike).
LOAD_NOTE = 1.5


def cell_key(row: Mapping[str, Any]) -> tuple[Hashable, Hashable, Hashable]:
    """A cell: one strategy at one checkpoint age under one fault (a sweep may vary all three)."""
    return (row.get("strategy"), row.get("age"), row.get("fault"))


def cell_notes(row: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> str:
    """What the verdict's reader must know about a cell: steps off the reference's pace, a load spike."""
    notes = []
    drift = row.get("step_drift")
    if isinstance(drift, float) and not math.isnan(drift) and abs(drift - 1.0) > DRIFT_NOTE:
        notes.append(f"steps {drift:.2f}x the reference's")
    spikes = [r for r in runs if as_float(r.get("load_mean")) > LOAD_NOTE * as_float(r.get("cores_used"))]
    if spikes:
        worst = max(as_float(r.get("load_max")) for r in spikes)
        notes.append(
            f"load spike in {len(spikes)} of {len(runs)} trials (load up to {worst:.1f} on "
            f"{as_float(spikes[0].get('cores_used')):.0f} cores)"
        )
    return "; ".join(notes)


def summarize_cells(
    rows: Sequence[Mapping[str, Any]],
    method: str = DEFAULT_METHOD,
    min_effect: float = MIN_EFFECT,
    level: float = LEVEL,
) -> list[dict[str, Any]]:
    """One row per cell (strategy, age, fault: ``cell_key``) over its trials' rows (in first-seen order).

    Each output row: ``trials`` (trials whose run ended ok), the centre and ``method`` interval of every
    ``INTERVAL_COLUMNS`` value (with its true coverage), the verdict from the interval of the measured
    ``gain`` under the minimum effect ``min_effect``, the badput-based ``verdict_bp`` beside it (a
    diagnostic), medians of ``MEDIAN_COLUMNS``, ``notes`` (``cell_notes``), ``bit_identical`` (True only
    if every trial's was), ``fallback`` (the distinct reasons)."""
    groups: dict[tuple[Hashable, Hashable, Hashable], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(cell_key(r), []).append(r)
    out = []
    for (strategy, age, fault), runs in groups.items():
        ok = [r for r in runs if r.get("status") in (None, "ok")]
        row: dict[str, Any] = {"strategy": strategy, "age": age, "fault": fault, "trials": len(ok), "runs": len(runs)}
        ivs = {}
        for name, key in INTERVAL_COLUMNS:
            iv = ivs[name] = interval([as_float(r.get(key)) for r in ok], method, level)
            row[name], row[f"{name}_lo"], row[f"{name}_hi"], row[f"{name}_n"] = iv.median, iv.lo, iv.hi, iv.n
            row[f"{name}_coverage"] = iv.coverage
            if name in CI_COLUMNS:
                row[f"{name}_ci"] = iv.text()
        row["interval_method"], row["level"], row["min_effect"] = method, level, min_effect
        row["verdict"] = verdict(ivs["gain"], min_effect) if ivs["gain"].n else "-"
        row["verdict_bp"] = verdict(ivs["gain_bp"], min_effect) if ivs["gain_bp"].n else "-"
        for key in MEDIAN_COLUMNS:
            vals = sorted(v for v in (as_float(r.get(key)) for r in ok) if not math.isnan(v))
            row[key] = _median(vals)
        row["notes"] = cell_notes(row, ok)
        idents = [r.get("bit_identical") for r in ok]
        row["bit_identical"] = None if not idents or any(i is None for i in idents) else all(bool(i) for i in idents)
        reasons = sorted({str(r.get("fallback")) for r in ok if r.get("fallback") not in (None, "", "no")})
        row["fallback"] = "; ".join(reasons) or "no"
        row["paper_gain"] = next((r.get("paper_gain") for r in runs if r.get("paper_gain") is not None), None)
        out.append(row)
    return out


def _median(sorted_vals: Sequence[float]) -> float:
    n = len(sorted_vals)
    if n == 0:
        return math.nan
    mid = n // 2
    return sorted_vals[mid] if n % 2 else (sorted_vals[mid - 1] + sorted_vals[mid]) / 2


def median_rows(rows: Sequence[Mapping[str, Any]], key: Sequence[str]) -> list[dict[str, Any]]:
    """Trials collapsed: one row per distinct ``key`` values (first-seen order); every numeric column the
    median over that group's rows whose ``status`` is ok (or absent), anything else the first row's value;
    plus ``trials`` (how many rows the medians are over). Booleans are kept only when every row agrees."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in key), []).append(r)
    out = []
    for members in groups.values():
        ok = [r for r in members if r.get("status") in (None, "ok")] or members
        row: dict[str, Any] = {}
        for col in dict.fromkeys(c for r in members for c in r):
            vals = [r.get(col) for r in ok]
            if col in key:
                row[col] = members[0].get(col)
            elif all(isinstance(v, bool) or v is None for v in vals):
                row[col] = vals[0] if len(set(vals)) == 1 else None
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) or v is None for v in vals):
                nums = sorted(float(v) for v in vals if v is not None and not math.isnan(float(v)))
                med = _median(nums)
                # counts stay counts (a table formats them as integers) when the median is a whole number
                whole = all(isinstance(v, int) for v in vals if v is not None) and med == int(med) if nums else False
                row[col] = int(med) if whole else med
            else:
                row[col] = ok[0].get(col)
        row["trials"] = len([r for r in members if r.get("status") in (None, "ok")])
        out.append(row)
    return out
