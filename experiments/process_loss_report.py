"""The process_loss outputs: table.md, data.csv / overhead.csv (written and read back) and goodput.png.

Everything derives from the two CSVs, so ``python -m experiments.process_loss --rederive`` rebuilds it
without running anything. Where accelpact is not the best strategy at a (fault, age), the table says by
how much and which measured badput parts made the difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments import _driver
from experiments.provenance import load_provenance, stamp_figure
from harness import strategies
from harness.report.trials import as_float

__all__ = ["write_outputs", "read_rows", "table_md"]

# The data's fault-free rows (one per fault block and trial) carry this in their strategy column.
REFERENCE = "reference"
REFERENCE_LABEL = "fault-free reference"


def under_test(data: Sequence[Mapping[str, Any]]) -> str:
    """The strategy whose gain over the others the table reports: the in-memory one the data has runs of
    (accelpact_heal; runs committed before it had its own name say accelpact)."""
    return strategies.under_test({str(r.get("strategy")) for r in data}).name


def label(strategy: str) -> str:
    """A data row's strategy as tables and legends print it (the spec's label)."""
    if strategy == REFERENCE:
        return REFERENCE_LABEL
    try:
        return strategies.get(strategy).label
    except KeyError:  # a row of a strategy no longer registered: its name
        return strategy


def _order(strategy: str) -> int:
    """Table position: the reference first, then the registry's order, then anything unregistered."""
    if strategy == REFERENCE:
        return -1
    try:
        return strategies.get(strategy).order
    except KeyError:
        return 1 << 20


def compared(data: Sequence[Mapping[str, Any]]) -> list[str]:
    """The strategies the data has runs of (the reference left out), in table order."""
    return sorted({str(r["strategy"]) for r in data if r.get("strategy") != REFERENCE}, key=lambda s: (_order(s), s))


def baselines(data: Sequence[Mapping[str, Any]]) -> list[str]:
    """The strategies AccelPact's gain is reported over: every other strategy in the data, in table order."""
    return [s for s in compared(data) if s != under_test(data)]


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return "-"
    if spec and isinstance(v, (int, float)) and not isinstance(v, bool):
        return format(v, spec)
    return str(v)


def _md(rows: Sequence[Mapping[str, Any]], cols: Sequence[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "".join("| " + " | ".join(_fmt(r.get(c[0]), c[2]) for c in cols) + " |\n" for r in rows)


def _parts(r: Mapping[str, Any]) -> dict[str, float]:
    return {k[5:-2]: as_float(v) for k, v in r.items() if k.startswith("part_") and not math.isnan(as_float(v))}


def _parts_text(r: Mapping[str, Any]) -> str:
    parts = sorted(((k, v) for k, v in _parts(r).items() if v >= 0.05), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.1f} s" for k, v in parts) or "none above 0.05 s"


def add_drift(data: Sequence[dict[str, Any]], overhead_pct: float) -> None:
    """Per run, in place: ``drift`` (its median step over the same fault block's and trial's fault-free
    reference's, measured), ``badput_s`` (every measured badput second) and ``goodput_at_ref_step``
    (derived).

    The runs of one comparison go one after another on a shared host whose load moves (4 to 18 within
    one comparison here), so a run's steps can be 1.5x slower than the reference's for reasons that are
    neither the fault nor the strategy. ``goodput_at_ref_step`` is the shared badput-based goodput
    (harness.report.badput_goodput, docs/goodput.md): useful tokens / (useful steps x the reference's
    productive step time, median over the fault block's trials, x snapshot factor + badput), with accelpact's steps charged the side-by-side
    snapshot overhead (the reference runs with no snapshots). Rows collected before ``useful_steps``
    was recorded fall back to the same idea through the median step (useful_s x reference median step /
    this run's median step).
    """
    from harness.report.badput_goodput import badput_goodput_from_row
    from harness.report.trials import _median

    refs = {(r["fault"], r.get("trial")): r for r in data if r.get("strategy") == REFERENCE}
    # One reference pace per fault block (as the comparison's table): the median over its trials'
    # references of useful seconds per useful step.
    paces: dict[Any, list[float]] = {}
    for (fault, _), ref_row in refs.items():
        u, n = as_float(ref_row.get("useful_s")), as_float(ref_row.get("useful_steps"))
        if u > 0 and n > 0:
            paces.setdefault(fault, []).append(u / n)
    pace_of = {fault: _median(sorted(v)) for fault, v in paces.items()}
    snap = 1 + overhead_pct / 100 if not math.isnan(overhead_pct) else math.nan
    ours = under_test(data)
    for r in data:
        ref_row = refs.get((r["fault"], r.get("trial")), {})
        ref, step = as_float(ref_row.get("step_median_s")), as_float(r.get("step_median_s"))
        r["drift"] = step / ref if ref > 0 and step > 0 else math.nan
        useful, tokens = as_float(r.get("useful_s")), as_float(r.get("useful_tokens"))
        badput = as_float(r.get("badput_total_s"))
        r["badput_s"] = badput
        factor = snap if r.get("strategy") == ours else 1.0
        steps, ref_pace = as_float(r.get("useful_steps")), pace_of.get(r["fault"], math.nan)
        if steps > 0 and ref_pace > 0:
            r["goodput_at_ref_step"] = badput_goodput_from_row(
                {"tokens": tokens, "steps": steps, "badput_s": badput}, ref_pace, factor
            )
            continue
        pace = useful / r["drift"] * factor if r["drift"] > 0 else math.nan
        r["goodput_at_ref_step"] = tokens / (pace + badput) if pace + badput > 0 else math.nan


def _load_text(r: Mapping[str, Any]) -> str:
    load = as_float(r.get("load_avg_run"))
    return f", load {load:.1f}" if not math.isnan(load) else ""


def best_rows(data: Sequence[Mapping[str, Any]], overhead_pct: float = math.nan) -> list[dict[str, Any]]:
    """Per (fault, age): the best measured goodput, AccelPact's gains, and the measured reason when it is
    not best, in three separate parts: (a) badput by part, (b) the side-by-side snapshot overhead,
    (c) step-time drift against the fault-free reference (with the load while each ran); then the
    derived goodput at the reference's step time, which takes (c) out and keeps (a) and (b)."""
    data = [dict(r) for r in data]
    add_drift(data, overhead_pct)
    out = []
    keys = sorted(
        {
            (r["fault"], int(as_float(r["age"])))
            for r in data
            if r.get("strategy") != REFERENCE and not math.isnan(as_float(r.get("age")))
        }
    )
    ref_of = {r["fault"]: r for r in data if r.get("strategy") == REFERENCE}
    mine = under_test(data)
    ours_label = label(mine)
    for fault, age in keys:
        at = {r["strategy"]: r for r in data if r["fault"] == fault and as_float(r.get("age")) == age}
        ok = {s: r for s, r in at.items() if r.get("status") == "ok" and not math.isnan(as_float(r.get("goodput")))}
        if not ok:
            continue
        best = max(ok, key=lambda s: as_float(ok[s]["goodput"]))
        ours = ok.get(mine)
        row: dict[str, Any] = {"fault": fault, "age": age, "best": label(best)}
        for base in baselines(data):
            row[f"gain_{base}"] = (
                as_float(ours["goodput"]) / as_float(ok[base]["goodput"])
                if ours and base in ok and as_float(ok[base]["goodput"]) > 0
                else math.nan
            )
            row[f"badput_ratio_{base}"] = (
                as_float(ours["badput_s"]) / as_float(ok[base]["badput_s"])
                if ours and base in ok and as_float(ok[base]["badput_s"]) > 0
                else math.nan
            )
        derived = {s: as_float(r.get("goodput_at_ref_step")) for s, r in ok.items()}
        row["best_at_ref_step"] = (
            label(max(derived, key=lambda s: derived[s]))
            if derived and not any(math.isnan(v) for v in derived.values())
            else ""
        )
        if ours is None:
            row["reason"] = f"{ours_label} did not finish ({at.get(mine, {}).get('status', 'no run')})"
        elif best == mine:
            row["reason"] = (
                f"best; healed from {ours.get('heal_source') or '?'}, "
                f"{int(as_float(ours.get('replayed_steps')) or 0)} step(s) replayed, parts: {_parts_text(ours)}"
            )
        else:
            b, ref = ok[best], ref_of.get(fault, {})
            name = label(best)
            row["reason"] = (
                f"measured goodput {as_float(ours['goodput']):.1f} vs {as_float(b['goodput']):.1f} tok/s. "
                f"(a) badput: {ours_label} {as_float(ours['badput_s']):.1f} s ({_parts_text(ours)}) vs {name} "
                f"{as_float(b['badput_s']):.1f} s ({_parts_text(b)}). "
                f"(b) snapshot overhead, side by side: {overhead_pct:+.1f} % per step. "
                f"(c) step-time drift: median step {ours_label} {as_float(ours.get('step_median_s')):.2f} s "
                f"({as_float(ours['drift']):.2f}x the reference's, which takes no snapshots{_load_text(ours)}), {name} "
                f"{as_float(b.get('step_median_s')):.2f} s ({as_float(b['drift']):.2f}x{_load_text(b)}); reference "
                f"{as_float(ref.get('step_median_s')):.2f} s{_load_text(ref)}. "
                f"Derived at the reference's step time: {as_float(ours['goodput_at_ref_step']):.1f} vs "
                f"{as_float(b['goodput_at_ref_step']):.1f} tok/s"
            )
        out.append(row)
    return out


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def overhead_summary(overhead: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median step with snapshots off and on (over the alternated runs) and the shared-memory bytes."""

    def med(xs: list[float]) -> float:
        xs = sorted(x for x in xs if not math.isnan(x))
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2 if xs else math.nan

    off = med([as_float(r["step_median_s"]) for r in overhead if r["snapshots"] == "off"])
    on = med([as_float(r["step_median_s"]) for r in overhead if r["snapshots"] == "on"])
    ons = [r for r in overhead if r["snapshots"] == "on"]
    return {
        "step_off_s": off,
        "step_on_s": on,
        "overhead_pct": (on / off - 1) * 100 if off > 0 else math.nan,
        "extra_ms": (on - off) * 1000,
        "wait_s_per_rank": max((as_float(r["wait_s_per_rank"]) for r in ons), default=math.nan),
        "slot_mib": max((as_float(r["slot_bytes"]) for r in ons), default=math.nan) / 2**20,
        "own_mib": max((as_float(r["own_shm_bytes"]) for r in ons), default=math.nan) / 2**20,
        "replica_mib": max((as_float(r["replica_shm_bytes"]) for r in ons), default=math.nan) / 2**20,
        "planned_mib": max((as_float(r["planned_shm_bytes"]) for r in ons), default=math.nan) / 2**20,
        "load_off": _mean([as_float(r.get("load_avg_run")) for r in overhead if r["snapshots"] == "off"]),
        "load_on": _mean([as_float(r.get("load_avg_run")) for r in ons]),
        "push_mb_s": max((as_float(r["push_mb_s"]) for r in ons), default=math.nan),
        "runs": len(overhead),
    }


def table_md(
    data: Sequence[Mapping[str, Any]], overhead: Sequence[Mapping[str, Any]], runtime_s: float, prov: Any
) -> str:
    rows = sorted(
        data,
        key=lambda r: (
            r["fault"],
            as_float(r.get("age")) if r.get("age") not in (None, "") else -1,
            _order(r["strategy"]),
        ),
    )
    for r in rows:
        r["label"] = label(r["strategy"])
        r["parts"] = _parts_text(r) if r["strategy"] != REFERENCE else ""
        if r.get("status") not in (None, "ok"):
            # A failed run's goodput counts the steps before it died: not comparable, so not shown.
            r["goodput"] = r["wall_s"] = r["parts"] = r["badput_total_s"] = r["useful_s"] = None
            if r.get("reason"):
                r["status"] = f"{r['status']}: {r['reason']}"
    ov = overhead_summary(overhead)
    add_drift(rows, as_float(ov["overhead_pct"]))
    text = [
        "# Losing a process or a host: heal in memory vs restart from disk",
        "",
        f"{prov.extra.get('model', 'mistral_tiny')} (seq 64 x batch 2 per rank) on two simulated hosts (network namespaces, one gloo rank "
        "each, each host its own snapshot root); a sync DCP checkpoint every interval; rank 1 is SIGKILLed "
        "(`kill`) or its whole host is lost with its shared memory (`host_loss`) when the newest checkpoint is "
        "5 or 18 steps old. Every run is compared with the fault-free reference on the same hosts.",
        "",
        "**Read the measured goodput with the step-time column beside it.** The runs of one fault go one "
        "after another on a 2-core host shared with other jobs, whose load moves during the comparison; a "
        "run's median step can differ from the fault-free reference's by far more than the snapshot "
        'overhead measured side by side below. What the heal changes is the badput: the "badput" column '
        "(every measured badput second, checkpoints included) and its parts. Three things are kept apart: "
        "badput (measured, per part); the snapshot overhead (measured side by side, snapshots off/on, "
        "alternated); the step-time drift (measured: each run's median step / its fault block's reference's, "
        "with the mean 1-min load average sampled every 5 s while the run ran, where recorded). "
        "\"goodput at the reference's step time\" is derived from them: the run's own badput, its useful "
        "steps at the reference's median step, accelpact's charged the side-by-side snapshot overhead.",
        "",
        "Badput parts of a heal: detection (the fault until each rank knew: the survivor caught it, the "
        "parent saw the death and launched the replacement), replacement_start, heal_transfer (up to the "
        "replacement being ready to train), and replay: the survivor's attempt in flight at the fault, thrown "
        'away and run again. "replayed steps" counts committed steps run again, so a heal with 0 of them '
        "still shows that attempt as replay. A heal never shows restart: nothing is relaunched.",
        "",
        "## Goodput by fault and checkpoint age",
        "",
        _md(
            rows,
            [
                ("fault", "fault", ""),
                ("age", "age", ".0f"),
                ("label", "strategy", ""),
                ("goodput", "goodput (tok/s)", ".1f"),
                ("wall_s", "wall (s)", ".1f"),
                ("badput_s", "badput (s)", ".1f"),
                ("step_median_s", "median step (s)", ".2f"),
                ("drift", "step / reference's", ".2f"),
                ("load_avg_run", "load avg during run", ".1f"),
                ("goodput_at_ref_step", "goodput at reference's step time (tok/s, derived)", ".1f"),
                ("replayed_steps", "replayed steps", ".0f"),
                ("heal_source", "healed from", ""),
                ("disk_bytes_read", "bytes read from disk (heal)", ".0f"),
                ("parts", "badput parts", ""),
                ("bit_identical", "bit-identical", ""),
                ("status", "status", ""),
            ],
        ),
        "",
        "## Best strategy per fault and age",
        "",
        _md(
            best_rows(data, as_float(ov["overhead_pct"])),
            [
                ("fault", "fault", ""),
                ("age", "age", ".0f"),
                ("best", "best measured goodput", ""),
                *[
                    col
                    for b in baselines(data)
                    for col in (
                        (f"gain_{b}", f"{label(under_test(data))} / {label(b)} (goodput)", ".3f"),
                        (f"badput_ratio_{b}", f"{label(under_test(data))} / {label(b)} (badput)", ".3f"),
                    )
                ],
                ("best_at_ref_step", "best at reference's step time (derived)", ""),
                ("reason", f"{label(under_test(data))}: measured reason", ""),
            ],
        ),
        "",
        "## Snapshot cost, side by side with snapshots off",
        "",
        _md(
            [ov],
            [
                ("step_off_s", "median step, snapshots off (s)", ".4f"),
                ("load_off", "load avg, off runs", ".1f"),
                ("load_on", "load avg, on runs", ".1f"),
                ("step_on_s", "median step, per-step snapshots (s)", ".4f"),
                ("overhead_pct", "overhead (%)", "+.1f"),
                ("extra_ms", "extra per step (ms)", "+.0f"),
                ("wait_s_per_rank", "blocked per rank (s)", ".2f"),
                ("slot_mib", "one slot (MiB)", ".1f"),
                ("own_mib", "own slots per rank (MiB)", ".1f"),
                ("replica_mib", "replicas held per rank (MiB)", ".1f"),
                ("planned_mib", "memory plan per rank (MiB)", ".1f"),
                ("push_mb_s", "replica push (MB/s)", ".0f"),
            ],
        ),
        "",
        f"Alternated fault-free accelpact runs ({ov['runs']} in all, snapshots off/on), the same hosts and "
        "model; overhead = median step on / off - 1. Shared-memory bytes are measured on the ranks at their "
        'clean exit (st_blocks of the slot files); the plan\'s figure is 2 own slots + 2 replicas. Where "blocked" '
        "is near 0, the overhead is not waiting: it is the CPU that the background copy, its CRC-32, the replica push "
        "and receiving the buddy's replica take from the training threads on the same cores (2 cores here, shared "
        "by both ranks and other jobs). That cost is roughly fixed per step (the extra ms), so its share grows "
        "when the host is quiet and steps are fast.",
        "",
        *_driver.closing_lines(runtime_s, prov),
    ]
    return "\n".join(text) + "\n"


def plot(out: Path, data: Sequence[Mapping[str, Any]], prov: Any) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = sorted({r["fault"] for r in data})
    fig, axes = plt.subplots(1, max(len(faults), 1), figsize=(5.2 * max(len(faults), 1), 3.8), squeeze=False)
    names = compared(data)
    for ax, fault in zip(axes[0], faults):
        rows = [r for r in data if r["fault"] == fault]
        ages = sorted({int(as_float(r["age"])) for r in rows if not math.isnan(as_float(r.get("age")))})
        ref = next((as_float(r.get("goodput")) for r in rows if r["strategy"] == REFERENCE), math.nan)
        width = 0.8 / len(names)
        for i, s in enumerate(names):
            cells = [next((r for r in rows if r["strategy"] == s and as_float(r.get("age")) == a), None) for a in ages]
            # A failed or refused run has no comparable goodput: no bar, its status written at the base.
            ys = [as_float(c.get("goodput")) if c and c.get("status") == "ok" else math.nan for c in cells]
            for j, c in enumerate(cells):
                if c and c.get("status") != "ok":
                    ax.text(
                        j + (i - (len(names) - 1) / 2) * 0.8 / len(names),
                        2,
                        str(c.get("status")).split(":")[0],
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
            try:
                color = strategies.get(s).color
            except KeyError:
                color = None
            ax.bar(
                [j + (i - (len(names) - 1) / 2) * width for j in range(len(ages))],
                ys,
                width,
                label=label(s),
                color=color,
            )
        if not math.isnan(ref):
            ax.axhline(ref, color="0.3", linestyle="--", linewidth=1, label=REFERENCE_LABEL)
        ax.set_xticks(range(len(ages)), [f"age {a}" for a in ages])
        ax.set_title(f"fault={fault}")
        ax.set_ylabel("goodput (tokens/s)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    stamp_figure(fig, prov)
    path = out / "goodput.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    def cell(k: str, v: str) -> Any:
        if v == "":
            return None
        if k == "bit_identical":
            return {"True": True, "False": False}.get(v)
        return _driver.number(v)

    return _driver.read_csv(path, cell)


def write_outputs(out: Path, data: list[dict[str, Any]], overhead: list[dict[str, Any]], runtime_s: float) -> None:
    """data.csv (every run of every trial, with the derived goodput per trial), overhead.csv, table.md and
    the plot; with trials, table.md and the plot use each run's medians over trials (``trials`` says how
    many), the derived goodput then computed from those medians."""
    from harness.report.trials import median_rows

    data = [dict(r) for r in data]
    add_drift(data, overhead_summary(overhead).get("overhead_pct", math.nan) if overhead else math.nan)
    keys = sorted({k for r in data for k in r})
    _driver.write_csv(out / "data.csv", [{k: r.get(k) for k in keys} for r in data], ".6g")
    _driver.write_csv(out / "overhead.csv", overhead, ".6g")
    prov = load_provenance(out)
    if len({r.get("trial") for r in data}) > 1:
        data = median_rows(data, ("fault", "run", "strategy", "age"))
    (out / "table.md").write_text(table_md([dict(r) for r in data], overhead, runtime_s, prov))
    plot(out, data, prov)
