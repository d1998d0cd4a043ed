"""The tables and the timeline of ``experiments.mixed_faults``, from its finished runs.

The numbers are the comparison's (``harness.report.compare.trial_rows`` per run and trial, then
``harness.report.trials.summarize_cells`` per strategy: the measured whole-run goodput and the gain of
accelpact_heal over each strategy, paired by trial, with the harness's interval and its true coverage, and
the verdict under the minimum effect). This module adds what a trace run needs beside them: the badput each
fault class cost (each fault's badput, from the run's goodput report, charged to the class its trace event
was drawn as), bit identity where the strategy promises it, the advisor's settings, the trace's table, and a
timeline of one trial per strategy. Writes table.md, table.csv (per strategy), runs.csv (per run),
timeline.png into the output directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import _driver
from experiments.mixed_faults import FULL, OURS
from experiments.provenance import footer_text, load_provenance

TIMELINE = "timeline.png"
# Strategies that do not promise a final state bit-identical to the fault-free run, and why.
NO_IDENTITY_PROMISE: dict[str, str] = {
    "torchft": "a step with a replica group out averages fewer gradients, so its end differs by design",
}


def entries(sweep: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(run dir, results row) of every run under ``sweep/trial<k>/<name>``."""
    out = []
    for summary in sorted(sweep.glob("trial*/*/summary.json")):
        row = json.loads(summary.read_text()).get("row", {})
        if row:
            out.append((summary.parent, row))
    return out


def class_badput(runs: Sequence[tuple[Path, dict[str, Any]]], trace: Any) -> dict[str, dict[str, float]]:
    """Per strategy, per fault class: the median over trials of the badput seconds its faults cost."""
    from harness.report.goodput import load_report

    cls_of = {e.step: e.cls for e in trace.events}
    per: dict[str, dict[str, list[float]]] = {}
    for d, row in runs:
        if row.get("status") != "ok" or _is_reference(row.get("strategy")):
            continue
        sums: dict[str, float] = {c: 0.0 for c in sorted(set(cls_of.values()))}
        for f in load_report(str(d)).faults:
            c = cls_of.get(f.step, "unmatched")
            sums[c] = sums.get(c, 0.0) + f.badput.total_s
        for c, s in sums.items():
            per.setdefault(str(row["strategy"]), {}).setdefault(c, []).append(s)
    return {s: {c: _median(v) for c, v in by.items()} for s, by in per.items()}


def fired_faults(runs: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per strategy, the fewest and the most faults that fired in a run (the trace's faults a run never
    reached do not fire: a step a rank skips, as a restarted torchft group does, injects nothing)."""
    per: dict[str, list[int]] = {}
    for r in runs:
        if r.get("status") == "ok" and isinstance(r.get("faults"), (int, float)):
            per.setdefault(str(r["strategy"]), []).append(int(r["faults"]))
    return {s: (min(v), max(v)) for s, v in per.items()}


def _median(vals: Sequence[float]) -> float:
    v = sorted(vals)
    if not v:
        return math.nan
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def _is_reference(strategy: Any) -> bool:
    """The fault-free reference's cell (the comparison labels it, e.g. ``none (reference)``)."""
    from harness import strategies

    ref = strategies.reference()
    return strategy in (ref.name, ref.label)


def _label(strategy: Any) -> str:
    return "fault-free reference" if _is_reference(strategy) else f"`{strategy}`"


def _num(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def plot_timelines(out: Path, runs: Sequence[tuple[Path, dict[str, Any]]], trace: Any, footer: str) -> Path | None:
    """One trial (the first) of every strategy and the reference, one panel each, on one time axis."""
    from harness import events as ev
    from harness.report.plots_compare import _plt, draw_timeline, timeline_legend

    first = min((int(d.parent.name.removeprefix("trial")) for d, _ in runs), default=None)
    picked = [(d, r) for d, r in runs if first is not None and d.parent.name == f"trial{first}"]
    if not picked:
        return None
    picked.sort(key=lambda dr: (not _is_reference(dr[1].get("strategy")), str(dr[1].get("strategy"))))
    plt = _plt()
    fig, axes = plt.subplots(len(picked), 1, figsize=(13, 1.6 * len(picked) + 1.4), sharex=True, squeeze=False)
    kind_of = {e.step: e.kind for e in trace.events}
    for ax, (d, row) in zip(axes[:, 0], picked):
        events = ev.load_events(d)
        t0 = draw_timeline(ax, events)
        for f in ev.of_type(ev.typed(events), ev.Fault):
            label = kind_of.get(f.step, f.fault) if f.step is not None else f.fault
            ax.annotate(
                f"{label}@{f.step}",
                (f.t - t0, 1.02),
                xycoords=("data", "axes fraction"),
                fontsize=6,
                rotation=30,
                color="red",
            )
        name = "fault-free reference" if _is_reference(row.get("strategy")) else str(row.get("strategy"))
        ax.set_title(
            f"{name}: goodput {_num(row.get('goodput'))} tokens/s, {row.get('faults') or 0} faults, "
            f"{row.get('replayed_steps') or 0} replayed steps",
            fontsize=8,
            loc="left",
            pad=14,
        )
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("seconds since the run's first step")
    axes[0, 0].legend(handles=timeline_legend(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.text(0.01, 0.005, footer, fontsize=6, color="0.35", family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path = out / TIMELINE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(
    out: Path,
    sweep: Path,
    trace: Any,
    cal: Any,
    rows: dict[str, Any],
    settings: dict[str, list[str]],
    missing: dict[str, str],
    runtime_s: float,
) -> list[dict[str, Any]]:
    """table.md, table.csv, runs.csv and timeline.png in ``out`` from the runs under ``sweep``."""
    import pandas as pd

    from harness.report.compare import trial_rows
    from harness.report.intervals import DESCRIPTIONS, Interval, coverage_text
    from harness.report.trials import summarize_cells
    from harness.schema import CompareConfig

    cmp = CompareConfig()
    found = entries(sweep)
    runs = trial_rows(sweep, found, OURS) if found else []
    cells = summarize_cells(runs, cmp.interval, cmp.min_effect, cmp.level) if runs else []
    pd.DataFrame(runs).to_csv(out / "runs.csv", index=False)
    pd.DataFrame(cells).to_csv(out / "table.csv", index=False)
    prov = load_provenance(out)
    by_class = class_badput(found, trace)
    lines = [
        "# Every strategy over one seeded fault trace (Llama 3 mix): whole-run goodput",
        "",
        f"mistral_tiny (2 layers, seq 64 x batch 1) on 2 gloo ranks, each on its own network-namespace host "
        f"(`cluster=local_hosts`), {trace.steps} steps under `fault=mixed`: {len(trace.events)} faults of the "
        f"trace below, the same for every strategy and every trial. Each trial runs the fault-free reference "
        f"and every strategy once, in a rotated order (`python -m experiments.mixed_faults`).",
        "",
    ]
    trials = int(prov.extra.get("trials") or 0)
    if prov.extra.get("quick") or trace.steps < FULL.steps or trials < FULL.trials:
        lines += [
            f"**Not the full size**: {trace.steps} steps and {trials} trial(s) "
            f"(`python -m experiments.mixed_faults`: {FULL.steps} steps, ~{FULL.faults:g} faults, {FULL.trials} trials). Its "
            "intervals are wider, and its trace is short.",
            "",
        ]
    if missing:
        lines += ["Not run here (the harness's own reason):", *[f"- `{s}`: {why}" for s, why in missing.items()], ""]
    fired = fired_faults(runs)
    lines += _goodput_table(cells, missing, cmp, DESCRIPTIONS, Interval, coverage_text, fired, len(trace.events))
    lines += _part_table(cells)
    lines += _class_table(by_class, trace)
    lines += _advice_table(rows, settings, missing, cal)
    lines += ["## The trace", "", trace.table_md(cal.step_s), ""]
    lines += ["| step | fault | rank | class | Table 5 cause |", "|---|---|---|---|---|"]
    lines += [f"| {e.step} | `{e.kind}` | {e.rank} | {e.cls} | {e.cause} |" for e in trace.events]
    lines += [""]
    try:
        if plot_timelines(out, found, trace, footer_text(prov)):
            lines += [
                "## Timeline",
                "",
                f"![one trial per strategy]({TIMELINE}): the first trial of every strategy. Green: a step; orange: a "
                "replayed step; blue: a checkpoint stall; gray: a restart; brown: a restore; purple: an in-memory "
                "recovery; red lines: the faults, each labelled with its kind and step.",
                "",
            ]
    except Exception as exc:  # noqa: BLE001 - a plot must never cost the table
        print(f"warning: the timeline failed: {type(exc).__name__}: {exc}")
    lines += _driver.closing_lines(runtime_s, prov)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return cells


def _goodput_table(
    cells: list[dict[str, Any]],
    missing: dict[str, str],
    cmp: Any,
    descriptions: Any,
    interval_cls: Any,
    coverage_text: Any,
    fired: dict[str, tuple[int, int]] | None = None,
    planned: int = 0,
) -> list[str]:
    lines = [
        "## Whole-run goodput, and the gain of accelpact_heal",
        "",
        "| strategy | trials | faults fired | goodput, tokens/s: median [interval] | of the reference's | gain of "
        "accelpact_heal [interval] | verdict | badput s | replayed steps | bit-identical to the reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref = next((c for c in cells if _is_reference(c["strategy"])), None)
    gains = []
    for c in cells:
        name = _label(c["strategy"])
        good = f"{_num(c['goodput'])} [{_num(c['goodput_lo'])}, {_num(c['goodput_hi'])}] (n={c['goodput_n']})"
        share = c["goodput"] / ref["goodput"] if ref and ref["goodput"] else math.nan
        if _is_reference(c["strategy"]) or c["strategy"] == OURS:
            gain, verdict = "-", "-"
        else:
            gain, verdict = c.get("gain_ci") or "-", c.get("verdict") or "-"
            gains.append(
                interval_cls(
                    c["gain"],
                    c["gain_lo"],
                    c["gain_hi"],
                    int(c["gain_n"] or 0),
                    c.get("gain_coverage", math.nan),
                    cmp.interval,
                )
            )
        ident = c.get("bit_identical")
        ident_txt = "-" if ident is None else ("yes" if ident else "no")
        if c["strategy"] in NO_IDENTITY_PROMISE:
            ident_txt += f" (not promised: {NO_IDENTITY_PROMISE[c['strategy']]})"
        if _is_reference(c["strategy"]):
            ident_txt = "-"
        lo, hi = (fired or {}).get(str(c["strategy"]), (0, 0))
        shots = "-" if _is_reference(c["strategy"]) else (f"{lo}" if lo == hi else f"{lo}-{hi}") + f" of {planned}"
        lines.append(
            f"| {name} | {c['trials']} of {c['runs']} | {shots} | {good} | {_num(share, '.2f')} | {gain} | {verdict} | "
            f"{_num(c.get('badput_s'))} | {_num(c.get('replayed_steps'), '.0f')} | {ident_txt} |"
        )
    for s, why in missing.items():
        lines.append(f"| `{s}` | not run | - | - | - | - | - | - | - | - ({why.split(';')[0]}) |")
    lines += [
        "",
        f"goodput: useful tokens / wall second over the whole run (first step to last), every cost of the strategy "
        f"in it; median over trials with the {cmp.interval} interval ({descriptions.get(cmp.interval, cmp.interval)}). "
        f"gain: accelpact_heal's goodput / the row's, paired by trial; its intervals cover "
        f"{coverage_text(gains)} (asked: {cmp.level:.0%}). verdict: better when the whole interval lies above "
        f"{1 + cmp.min_effect:.2f}, worse when below {1 / (1 + cmp.min_effect):.3f}, the same between them, else "
        "within noise. bit-identical: the final model and optimizer state equal the fault-free reference's in "
        "every trial. faults fired: the fewest and the most of the trace's faults a run injected; a fault fires "
        "only when its rank runs its step, and a torchft replica group restarted after a loss rejoins at the live "
        "group's step, so the faults planned on it for the steps it skipped never fire.",
        "",
    ]
    return lines


def _part_table(cells: list[dict[str, Any]]) -> list[str]:
    from harness.report.badput_goodput import PART_NAMES

    parts = [p for p in PART_NAMES if any((c.get(f"{p}_s") or 0) > 0.05 for c in cells)]
    if not parts:
        return []
    lines = [
        "## Badput by part (median seconds over trials, mean over ranks)",
        "",
        "| strategy | " + " | ".join(parts) + " |",
        "|---|" + "---|" * len(parts),
    ]
    for c in cells:
        lines.append(f"| {_label(c['strategy'])} | " + " | ".join(_num(c.get(f"{p}_s")) for p in parts) + " |")
    return [*lines, ""]


def _class_table(by_class: dict[str, dict[str, float]], trace: Any) -> list[str]:
    if not by_class:
        return []
    counts: dict[str, int] = {}
    for e in trace.events:
        counts[e.cls] = counts.get(e.cls, 0) + 1
    classes = sorted({c for v in by_class.values() for c in v})
    lines = [
        "## Badput by fault class (median seconds over trials that the class's faults cost)",
        "",
        "| strategy | " + " | ".join(f"{c} ({counts.get(c, 0)} faults)" for c in classes) + " |",
        "|---|" + "---|" * len(classes),
    ]
    for s, v in by_class.items():
        lines.append(f"| `{s}` | " + " | ".join(_num(v.get(c)) for c in classes) + " |")
    lines += [
        "",
        "Each fault's badput is what the goodput report charges to it (detection, restart, restore, replay ..., "
        "not the checkpoint saves), summed over the faults of each class.",
        "",
    ]
    return lines


def _advice_table(rows: dict[str, Any], settings: dict[str, list[str]], missing: dict[str, str], cal: Any) -> list[str]:
    lines = [
        "## The advisor's settings",
        "",
        f"`harness.advise.advice.advise_for_trace` on this trace, with inputs measured here by a fault-free "
        f"calibration run: a productive step of {cal.step_s:.3f} s, a sync checkpoint save blocking "
        f"{cal.checkpoint_write_s:.3f} s, {cal.state_bytes / 1e6:.1f} MB of state per rank.",
        "",
        "| strategy | disk checkpoint every (steps) | heal cadence | predicted tax | steps between faults that roll "
        "it back to disk | overrides |",
        "|---|---|---|---|---|---|",
    ]
    for s, row in rows.items():
        if row is None:
            lines.append(f"| `{s}` | - | - | - | - | not modelled by the advisor |")
            continue
        cad = (
            f"every={row.cadence.every}, push_every={row.cadence.push_every}, confirm_push={row.cadence.confirm}"
            if row.cadence is not None and s == OURS
            else "-"
        )
        every = row.checkpoint_every_steps or "never"
        note = " (not run)" if s in missing else ""
        lines.append(
            f"| `{s}`{note} | {every} | {cad} | {row.tax:.1%} | {_num(row.mtbf_steps, '.0f')} | "
            f"`{' '.join(settings[s])}` |"
        )
    lines += [
        "",
        "torchft is modelled as the simulator's `torchft_peer_heal`. GEMINI's row models a relaunch that reloads "
        "its in-memory captures (only a recurring bug reads the disk), with its per-step capture from the cost model "
        "(`harness.advise.taxes`).",
        "",
    ]
    return lines
