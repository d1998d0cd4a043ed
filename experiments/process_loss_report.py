"""The process_loss outputs: table.md, data.csv / overhead.csv (written and read back) and goodput.png.

Everything derives from the two CSVs, so ``python -m experiments.process_loss --rederive`` rebuilds it
without running anything. Where accelpact is not the best strategy at a (fault, age), the table says by
how much and which measured badput parts made the difference.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from experiments import _driver
from experiments.provenance import load_provenance, stamp_figure

__all__ = ["write_outputs", "read_rows", "table_md"]

LABELS = {"reference": "fault-free reference", "accelpact": "accelpact (heal in memory)",
          "cold_restart": "cold restart", "checkpoint_restore": "NVRx checkpoint restore"}
ORDER = ("reference", "accelpact", "cold_restart", "checkpoint_restore")


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


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
    return {k[5:-2]: _f(v) for k, v in r.items() if k.startswith("part_") and not math.isnan(_f(v))}


def _parts_text(r: Mapping[str, Any]) -> str:
    parts = sorted(((k, v) for k, v in _parts(r).items() if v >= 0.05), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.1f} s" for k, v in parts) or "none above 0.05 s"


def best_rows(data: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (fault, age): the best goodput, AccelPact's gains, and the measured reason when it is not best."""
    out = []
    keys = sorted({(r["fault"], int(_f(r["age"]))) for r in data if r.get("strategy") != "reference"
                   and not math.isnan(_f(r.get("age")))})
    for fault, age in keys:
        at = {r["strategy"]: r for r in data if r["fault"] == fault and _f(r.get("age")) == age}
        ok = {s: r for s, r in at.items() if r.get("status") == "ok" and not math.isnan(_f(r.get("goodput")))}
        if not ok:
            continue
        best = max(ok, key=lambda s: _f(ok[s]["goodput"]))
        ours = ok.get("accelpact")
        row: dict[str, Any] = {"fault": fault, "age": age, "best": LABELS.get(best, best)}
        for base in ("cold_restart", "checkpoint_restore"):
            row[f"gain_{base}"] = (_f(ours["goodput"]) / _f(ok[base]["goodput"])
                                   if ours and base in ok and _f(ok[base]["goodput"]) > 0 else math.nan)
        if ours is None:
            row["reason"] = f"accelpact did not finish ({at.get('accelpact', {}).get('status', 'no run')})"
        elif best == "accelpact":
            row["reason"] = (f"best; healed from {ours.get('heal_source') or '?'}, "
                             f"{int(_f(ours.get('replayed_steps')) or 0)} step(s) replayed, parts: {_parts_text(ours)}")
        else:
            b = ok[best]
            row["reason"] = (f"{_f(ours['wall_s']) - _f(b['wall_s']):+.1f} s wall vs {LABELS.get(best, best)}: "
                             f"median step {_f(ours.get('step_median_s')):.2f} s vs {_f(b.get('step_median_s')):.2f} s "
                             f"(per-step snapshots and replica pushes share the cores with training); "
                             f"accelpact's parts {_parts_text(ours)}; {LABELS.get(best, best)}'s {_parts_text(b)}")
        out.append(row)
    return out


def overhead_summary(overhead: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median step with snapshots off and on (over the alternated runs) and the shared-memory bytes."""
    def med(xs: list[float]) -> float:
        xs = sorted(x for x in xs if not math.isnan(x))
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2 if xs else math.nan

    off = med([_f(r["step_median_s"]) for r in overhead if r["snapshots"] == "off"])
    on = med([_f(r["step_median_s"]) for r in overhead if r["snapshots"] == "on"])
    ons = [r for r in overhead if r["snapshots"] == "on"]
    return {"step_off_s": off, "step_on_s": on, "overhead_pct": (on / off - 1) * 100 if off > 0 else math.nan,
            "wait_s_per_rank": max((_f(r["wait_s_per_rank"]) for r in ons), default=math.nan),
            "slot_mib": max((_f(r["slot_bytes"]) for r in ons), default=math.nan) / 2**20,
            "own_mib": max((_f(r["own_shm_bytes"]) for r in ons), default=math.nan) / 2**20,
            "replica_mib": max((_f(r["replica_shm_bytes"]) for r in ons), default=math.nan) / 2**20,
            "planned_mib": max((_f(r["planned_shm_bytes"]) for r in ons), default=math.nan) / 2**20,
            "push_mb_s": max((_f(r["push_mb_s"]) for r in ons), default=math.nan),
            "runs": len(overhead)}


def table_md(data: Sequence[Mapping[str, Any]], overhead: Sequence[Mapping[str, Any]], runtime_s: float,
             prov: Any) -> str:
    rows = sorted(data, key=lambda r: (r["fault"], _f(r.get("age")) if r.get("age") not in (None, "") else -1,
                                       ORDER.index(r["strategy"]) if r["strategy"] in ORDER else 9))
    for r in rows:
        r["label"] = LABELS.get(r["strategy"], r["strategy"])
        if r.get("status") not in (None, "ok") and r.get("reason"):
            r["status"] = f"{r['status']}: {r['reason']}"
        r["parts"] = _parts_text(r) if r["strategy"] != "reference" else ""
    ov = overhead_summary(overhead)
    text = ["# Losing a process or a host: heal in memory vs restart from disk", "",
            "mistral_tiny (seq 64 x batch 2 per rank) on two simulated hosts (network namespaces, one gloo rank "
            "each, each host its own snapshot root); a sync DCP checkpoint every interval; rank 1 is SIGKILLed "
            "(`kill`) or its whole host is lost with its shared memory (`host_loss`) when the newest checkpoint is "
            "5 or 18 steps old. Every run is compared with the fault-free reference on the same hosts.", "",
            "## Goodput by fault and checkpoint age", "",
            _md(rows, [("fault", "fault", ""), ("age", "age", ".0f"), ("label", "strategy", ""),
                       ("goodput", "goodput (tok/s)", ".1f"), ("wall_s", "wall (s)", ".1f"),
                       ("replayed_steps", "replayed steps", ".0f"), ("heal_source", "healed from", ""),
                       ("disk_bytes_read", "bytes read from disk (heal)", ".0f"), ("parts", "badput parts", ""),
                       ("bit_identical", "bit-identical", ""), ("status", "status", "")]), "",
            "## Best strategy per fault and age", "",
            _md(best_rows(data), [("fault", "fault", ""), ("age", "age", ".0f"), ("best", "best goodput", ""),
                                  ("gain_cold_restart", "accelpact / cold restart", ".3f"),
                                  ("gain_checkpoint_restore", "accelpact / NVRx", ".3f"),
                                  ("reason", "accelpact: measured reason", "")]), "",
            "## Snapshot cost, side by side with snapshots off", "",
            _md([ov], [("step_off_s", "median step, snapshots off (s)", ".4f"),
                       ("step_on_s", "median step, per-step snapshots (s)", ".4f"),
                       ("overhead_pct", "overhead (%)", "+.1f"), ("wait_s_per_rank", "blocked per rank (s)", ".2f"),
                       ("slot_mib", "one slot (MiB)", ".1f"), ("own_mib", "own slots per rank (MiB)", ".1f"),
                       ("replica_mib", "replicas held per rank (MiB)", ".1f"),
                       ("planned_mib", "memory plan per rank (MiB)", ".1f"),
                       ("push_mb_s", "replica push (MB/s)", ".0f")]), "",
            f"Alternated fault-free accelpact runs ({ov['runs']} in all, snapshots off/on), the same hosts and "
            "model; overhead = median step on / off - 1. Shared-memory bytes are measured on the ranks at their "
            "clean exit (st_blocks of the slot files); the plan's figure is 2 own slots + 2 replicas. Where \"blocked\" "
            "is near 0, the overhead is not waiting: it is the CPU that the background copy, CRC-32s and replica push "
            "take from the training threads on the same cores (2 cores here, shared by both ranks and other jobs).", "",
            *_driver.closing_lines(runtime_s, prov)]
    return "\n".join(text) + "\n"


def plot(out: Path, data: Sequence[Mapping[str, Any]], prov: Any) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness import strategies

    faults = sorted({r["fault"] for r in data})
    fig, axes = plt.subplots(1, max(len(faults), 1), figsize=(5.2 * max(len(faults), 1), 3.8), squeeze=False)
    names = [s for s in ORDER if s != "reference"]
    for ax, fault in zip(axes[0], faults):
        rows = [r for r in data if r["fault"] == fault]
        ages = sorted({int(_f(r["age"])) for r in rows if not math.isnan(_f(r.get("age")))})
        ref = next((_f(r["goodput"]) for r in rows if r["strategy"] == "reference"), math.nan)
        width = 0.8 / len(names)
        for i, s in enumerate(names):
            ys = [next((_f(r["goodput"]) for r in rows if r["strategy"] == s and _f(r.get("age")) == a), math.nan)
                  for a in ages]
            try:
                color = strategies.get(s).color
            except KeyError:
                color = None
            ax.bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(ages))], ys, width, label=LABELS[s],
                   color=color)
        if not math.isnan(ref):
            ax.axhline(ref, color="0.3", linestyle="--", linewidth=1, label=LABELS["reference"])
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
    keys = sorted({k for r in data for k in r})
    _driver.write_csv(out / "data.csv", [{k: r.get(k) for k in keys} for r in data], ".6g")
    _driver.write_csv(out / "overhead.csv", overhead, ".6g")
    prov = load_provenance(out)
    (out / "table.md").write_text(table_md([dict(r) for r in data], overhead, runtime_s, prov))
    plot(out, data, prov)
