"""Goodput at cluster scale: every strategy projected to 1k-100k GPUs by the failure-mix simulator.

    python -m experiments.scale_projection            # results/scale_projection/ (about a minute here)
    python -m experiments.scale_projection --quick    # fewer trials and sizes, into a temp dir

Writes table.md (the calibration against results/goodput_vs_age and the heal's against results/process_loss
first, then each strategy's ETTR at its
best checkpoint interval for 1k, 9.6k, 16k and 100k GPUs beside the published anchors, the badput by
class, and the cross-checks), data.csv (ETTR per size, strategy and interval), best.csv, badput.csv,
calibration.csv, heal_calibration.csv (every measured run, per trial), calibration_cells.csv,
heal_calibration_cells.csv (per cell: medians over trials, the error's 95% interval), three plots, and the
provenance. Pure simulation: no torch in the loop, no ranks.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.provenance import current_command, load_provenance, stamp_figure, write_provenance
from harness import strategies
from harness.scale import calibrate as cal
from harness.scale import heal_measured as heal
from harness.scale import scaling as sc
from harness.scale.config import CLASSES, Cluster, strategy_names
from harness.scale.outcomes import outcome_table
from harness.scale.project import mttf_h, project
from harness.scale.render import anchor_table_md, badput_table_md, strategy_legend_md
from harness.scale.sources import ANCHORS, FTHSDP_STALL_S, FTHSDP_SYNC_STALL_S, RSC_MTTF_H, RSC_SOURCE, llama3_mix
from harness.scale.torchft_measured import measured_torchft

NAME = "scale_projection"
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / NAME
MEASURED = ROOT / "results" / "goodput_vs_age"
HEAL_MEASURED = ROOT / "results" / "process_loss"
TABLE_SIZES = (1024, 9600, 16384, 100_000)
CURVE_SIZES = (1024, 2048, 4096, 9600, 16384, 32768, 65536, 100_000)
# Row selection: the synchronous restart whose stall per failure is set beside FT-HSDP's published one.
STALL_BASELINE = "cold_restart"


def per_step_charges(cluster: Cluster, mix: dict, names: Sequence[str]) -> tuple[dict, dict[str, float], dict]:
    """What each design pays on every step, charged in the projection: the heal's snapshot and push tax at
    the cadence the advisor picks for this cluster (harness.advise's cost model on ``gpu_node``'s stated
    assumptions, calibrated on results/heal_tax), with its outcomes at that cadence, and torchft's
    measured per-step quorum. Returns (outcome rows, tax per strategy, the heal's cadence choices)."""
    from harness.advise.advice import protection_plan
    from harness.advise.cost import GPU_NODE

    choices, rows, taxes = protection_plan(cluster, mix, GPU_NODE, names)
    return rows, taxes, choices


def charges_md(charges: dict[int, tuple[dict[str, float], dict]]) -> str:
    """The per-step costs charged at each table size."""
    lines = [
        "## Per-step costs charged",
        "",
        "Every row pays its per-step protection on every step (its ETTR is the engine's / (1 + tax)): "
        "torchft its quorum, measured here at a median of 8 ms a step (results/scale_projection/torchft_runs.csv), "
        "grown by no rule (a quorum round trip does not grow with the job); AccelPact's heal its snapshot copy, "
        "checksum and buddy push at the cadence the protection advisor picks for the cluster, from the cost model "
        "calibrated on results/heal_tax and its GPU-node assumptions (docs/advisor.md). AccelPact's per-step vote "
        "is not charged: its measured step drift against the fault-free reference is the default comparison's "
        "`step_drift_ci` (results/verdict_under_load).",
        "",
        "| GPUs | strategy | per-step tax (% of a step) | heal cadence |",
        "|---|---|---|---|",
    ]
    for g, (taxes, choices) in charges.items():
        for s, t in taxes.items():
            cad = choices.get(s)
            lines.append(f"| {g:,} | {s} | {100 * t:.2f} | {cad.cadence if cad is not None else '-'} |")
    return "\n".join(lines) + "\n"


def heal_strategies() -> list[str]:
    """The simulated rows whose heal of a lost process or host is calibrated on results/process_loss."""
    return [n for n, sim in strategies.simulated().items() if sim.build in heal.HEAL_BUILDS]


def _plotted(strategy: str) -> bool:
    """Whether a strategy gets a curve: the fault-free reference (ETTR 1 by construction) does not."""
    return not strategies.simulated()[strategy].fault_free


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _cell_order(cells: list[cal.CalibrationError]) -> list[cal.CalibrationError]:
    """The reference first, then by age, the strategies at one age in the order they come."""
    names = list(dict.fromkeys(c.strategy for c in cells))
    return sorted(cells, key=lambda c: (c.age is not None, -1 if c.age is None else c.age, names.index(c.strategy)))


def calibration_md(cells: list[cal.CalibrationError]) -> str:
    """One row per (strategy, age) cell: its trials, the medians over them, and the error's median [95%
    interval] (n)."""
    lines = [
        "| strategy | age | trials | measured goodput tok/s (median) | simulated (median) | "
        "error: median [95% interval] (n) | error with the median step (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in _cell_order(cells):
        lines.append(
            f"| {c.strategy} | {'-' if c.age is None else c.age} | {c.trials} | {c.measured:.0f} | "
            f"{c.simulated:.0f} | {c.text()} | {c.error_median_step:+.1%} |"
        )
    return "\n".join(lines)


def _worst(cells: list[Any]) -> Any:
    return max(cells, key=lambda c: abs(c.error_median))


def _age(cell: Any) -> Any:
    return "-" if cell.age is None else cell.age


_LIMIT_SENTENCE = f" The limit is {cal.LIMIT:.0%} on each cell's median error."


def _replay_sentence(fed: str, check: str, cell: str, text: str) -> str:
    """The replay check's largest miss (every run fed its own measured costs), which the 5% limit applies to."""
    return (
        f" Fed each run's own measured {fed} instead (the engine's replay check{check}), the largest miss is "
        f"{cell}, {text}; the limit, {cal.LIMIT:.0%} on each cell's median error, applies to that check "
        "(tests/scale)."
    )


def largest_miss_md(cells: list[cal.CalibrationError], replay: list[cal.CalibrationError] | None = None) -> str:
    """The sentence naming the cell with the largest |median error| over trials, with its interval; with
    ``replay`` (every run fed its own measured costs, ``calibrate(own=True)``), the same for that check,
    which is the one the 5% limit applies to."""
    w = _worst(cells)
    text = f"Largest miss (median error over trials): {w.strategy} age {_age(w)}, {w.text()}."
    if not replay:
        return text + _LIMIT_SENTENCE
    r = _worst(replay)
    over = [c for c in cells if abs(c.error_median) > cal.LIMIT]
    return (
        text
        + (
            f" {len(over)} cell(s) miss by more than {cal.LIMIT:.0%}: the recovery costs themselves moved "
            "from run to run (a strategy's median cost does not fit every run of a loaded host), "
            "which the intervals show."
            if over
            else ""
        )
        + _replay_sentence(
            "stop and destroyed work",
            ": only the schedule, rollback, replay and checkpoint accounting are the engine's",
            f"{r.strategy} age {_age(r)}",
            r.text(),
        )
    )


def heal_largest_miss_md(
    cells: list[heal.HealCalibrationCell], replay: list[heal.HealCalibrationCell] | None = None
) -> str:
    """The same for the heal's cells: the largest of a heal, then of any cell; with ``replay`` (every run fed
    its own measured costs), that check's largest miss, which the 5% limit applies to."""
    healed = _worst([c for c in cells if c.heals])
    w = _worst(cells)
    text = (
        f"Largest miss of a heal (median error over trials): {healed.fault} age {healed.age}, {healed.text()}; "
        f"of any cell: {w.strategy} {w.fault} age {_age(w)}, {w.text()}."
    )
    if not replay:
        return text + _LIMIT_SENTENCE
    r = _worst(replay)
    return text + _replay_sentence(
        "stop and thrown-away attempt", "", f"{r.strategy} {r.fault} age {_age(r)}", r.text()
    )


def _trials_said(n: set[int]) -> str:
    """How many measured trials the cells have, in words ("3 trials", "2-3 trials"; one trial says that
    there is no interval)."""
    lo, hi = min(n), max(n)
    if hi == 1:
        return "1 trial, so no interval: each cell is one run"
    return f"{lo} trials" if lo == hi else f"{lo}-{hi} trials"


def winner_md(projections: list, gpus: int) -> str:  # noqa: ANN001 - Projection rows of one size
    """The winner among the measured strategies at ``gpus``, by how much, and where AccelPact and the designs
    stand (a difference within the two 95% intervals is called a tie)."""
    from harness.scale.outcomes import DESIGN_BUILDS

    sims = strategies.simulated()
    ok = [p for p in projections if p.feasible and not sims[p.strategy].fault_free]
    measured = sorted((p for p in ok if sims[p.strategy].build not in DESIGN_BUILDS), key=lambda p: -p.best_ettr)
    designs = sorted((p for p in ok if sims[p.strategy].build in DESIGN_BUILDS), key=lambda p: -p.best_ettr)
    ours = {strategies.under_test().name, *heal_strategies()}
    mine = max((p for p in measured if p.strategy in ours), key=lambda p: p.best_ettr)
    win, second = measured[0], measured[1]

    def gap(a, b) -> str:  # noqa: ANN001
        d = 100 * (a.best_ettr - b.best_ettr)
        tie = abs(d) <= 100 * (a.best_ci + b.best_ci)
        return f"{d:+.1f} points{' (within the 95% intervals: a tie)' if tie else ''}"

    lines = [
        f"**Winner at {gpus:,} GPUs, among the strategies whose costs are measured: `{win.strategy}`, "
        f"ETTR {100 * win.best_ettr:.1f}% ± {100 * win.best_ci:.1f}**, {gap(win, second)} over the next, "
        f"`{second.strategy}` ({100 * second.best_ettr:.1f}%)."
    ]
    if mine is not win:
        diff = [
            (d, k)
            for d, k in sorted(
                ((mine.badput.get(k, 0.0) - win.badput.get(k, 0.0), k) for k in mine.badput), reverse=True
            )[:2]
            if d > 0
        ]
        table = outcome_table(Cluster(gpus=gpus), (mine.strategy,))[mine.strategy]
        cells = []
        for i, (_, k) in enumerate(diff):
            cell = f"{k} {100 * mine.badput[k]:.1f}% of the wall vs {100 * win.badput.get(k, 0.0):.1f}%"
            if i == 0 and k in table:  # what one failure of the largest gap costs
                top = sorted(table[k].parts.items(), key=lambda kv: -kv[1])[:3]
                cell += " (per failure: " + ", ".join(f"{p} {v:.0f} s" for p, v in top) + ", the whole job stopped)"
            cells.append(cell)
        why = "; ".join(cells)
        lines.append(
            f"AccelPact's best row, `{mine.strategy}`, reaches {100 * mine.best_ettr:.1f}% ± "
            f"{100 * mine.best_ci:.1f}: {gap(mine, win)} against the winner. Where the gap is: {why}."
        )
    for d in designs:
        lines.append(
            f"Design, not built: `{d.strategy}` ({sims[d.strategy].label.split(': ', 1)[-1]}) would reach "
            f"{100 * d.best_ettr:.1f}% ± {100 * d.best_ci:.1f}, {gap(d, win)} against `{win.strategy}` "
            "(docs/scale.md says what it assumes)."
        )
    return "\n\n".join(lines)


def _heal_cell_order(cells: list[heal.HealCalibrationCell]) -> list[heal.HealCalibrationCell]:
    """Per fault (as they come), the reference first, then each strategy (as they come) by age."""
    faults = list(dict.fromkeys(c.fault for c in cells))
    names = list(dict.fromkeys(c.strategy for c in cells))
    return sorted(
        cells,
        key=lambda c: (
            faults.index(c.fault),
            c.age is not None,
            names.index(c.strategy),
            not c.heals,
            -1 if c.age is None else c.age,
        ),
    )


def heal_calibration_md(cells: list[heal.HealCalibrationCell]) -> str:
    lines = [
        "| fault (class) | strategy as run | recovery | age | trials | measured goodput tok/s (median) | "
        "simulated (median) | error: median [95% interval] (n) | median stop fed (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in _heal_cell_order(cells):
        how = "heal in memory" if c.heals else ("-" if c.age is None else "restart + restore from disk")
        lines.append(
            f"| {c.fault} ({heal.FAULT_CLASS[c.fault]}) | {c.strategy} | {how} | "
            f"{'-' if c.age is None else c.age} | {c.trials} | {c.measured:.0f} | {c.simulated:.0f} | "
            f"{c.text()} | {c.stop_s:.2f} |"
        )
    return "\n".join(lines)


def heal_costs_md() -> str:
    lines = [
        "| harness fault | simulator class | "
        + " | ".join(heal.HEAL_PARTS)
        + " | attempt thrown away | runs | source |",
        "|---|---|" + "---|" * len(heal.HEAL_PARTS) + "---|---|---|",
    ]
    for fault, h in heal.measured_heal().items():
        lines.append(
            f"| {fault} | {heal.FAULT_CLASS[fault]} | "
            + " | ".join(f"{h.parts[p]:.3f} s" for p in heal.HEAL_PARTS)
            + f" | {h.destroyed_s:.3f} s | {h.runs} | {h.source} |"
        )
    return "\n".join(lines)


def cross_checks_md(mix: dict) -> str:
    lines = ["| figure | published | this simulator | note |", "|---|---|---|---|"]
    for gpus, h in RSC_MTTF_H.items():
        lines.append(
            f"| MTTF at {gpus:,} GPUs | {h} h (RSC clusters, A100) | {mttf_h(mix, gpus):.1f} h "
            f"(Llama 3 rates, linear in GPUs) | {RSC_SOURCE}; use `rate_scale` to try their rate |"
        )
    c = Cluster(gpus=100_000)
    cold = outcome_table(c, (STALL_BASELINE,))[STALL_BASELINE]["gpu_host_loss"]
    lines.append(
        f"| synchronous recovery stall per failure, O(100K) GPUs | {FTHSDP_SYNC_STALL_S / 60:.0f} min "
        f"(FT-HSDP: {FTHSDP_STALL_S / 60:.0f} min with FT-HSDP) | {cold.downtime_s / 60:.1f} min "
        f"(cold restart after a host loss: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in cold.parts.items())
        + ") plus replay | arXiv:2602.00277 |"
    )
    lines.append(
        f"| NCCL communicator init | 2.5 min 'at large scale' (NVIDIA/nccl#1156) | "
        f"{sc.comm_init_s(1024):.1f} s at 1k, {sc.comm_init_s(16384):.0f} s at 16k, "
        f"{sc.comm_init_s(100_000):.0f} s at 100k | the GPU count of the 2.5 min is not given: "
        f"placing it at 100k is an assumption |"
    )
    ft = measured_torchft()
    lines.append(
        f"| torchft survivors' stop per failure | {sc.TORCHFT_QUORUM_S:.0f} s (heartbeat timeout, "
        f"pytorch/torchft#35) | {ft.survivor_stop_s:.2f} s measured here, charged ({ft.source}; "
        f"load {min(ft.load_mean):.1f}-{max(ft.load_mean):.1f} on 2 cores) | torchft's per-step quorum, "
        f"median {1000 * ft.quorum_per_step_s:.0f} ms here, is not charged |"
    )
    return "\n".join(lines)


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


def table_md(
    calib: list[cal.CalibrationError],
    heal_calib: list[heal.HealCalibrationCell],
    by_size,
    mix,  # noqa: ANN001
    prov_md: str,
    trials: int,
    seed: int,
    runtime: float,
    replay_calib: list[cal.CalibrationError] | None = None,
    heal_replay: list[heal.HealCalibrationCell] | None = None,
) -> str:
    runs, _, _ = cal.load_runs(MEASURED)
    steps = [r.step_s / r.median_step_s - 1 for r in runs]
    heal_names = ", ".join(f"`{n}`" for n in heal_strategies())
    worst_med = max(calib, key=lambda c: abs(c.error_median_step))
    table_sizes = {g: v for g, v in by_size.items() if g in TABLE_SIZES}
    return "\n".join(
        [
            "# Goodput at cluster scale: a failure-mix simulator calibrated on the measured runs",
            "",
            "Strategies (the harness's, then the rows only the simulator has; each label says where its costs come "
            "from):",
            "",
            strategy_legend_md(),
            "",
            "## Calibration against results/goodput_vs_age (2 gloo ranks, one socket reset at every age of the sweep)",
            "",
            "Fed with each run's measured step (useful seconds / steps) and checkpoint write, so that each trial's "
            "runs are replayed at that trial's pace, each strategy's median recovery costs over the sweep (every age "
            "and trial), and the exact fault schedule, the engine gives the whole-run goodput below. Per (strategy, "
            "age) cell over its measured trials "
            f"({_trials_said({c.trials for c in calib})}): the median measured and simulated goodput, and the error "
            "(simulated / measured - 1) as the median over trials with its order-statistic interval ([min, max] of n trials covers 1 - 2^(1-n)). "
            f"{largest_miss_md(calib, replay_calib)} "
            f"With each run's median step instead of its mean step the largest miss is "
            f"{worst_med.error_median_step:+.1%} ({worst_med.strategy} age {worst_med.age}, median over its trials). "
            f"A run's mean step is {100 * min(steps):+.0f}% to {100 * max(steps):+.0f}% off its median step here (slow "
            "steps; data.csv does not say which), and a whole run pays the mean, so the simulator takes the mean step.",
            "",
            calibration_md(calib),
            "",
            "## Calibration of the heal against results/process_loss (2 gloo ranks on two simulated hosts; a "
            "SIGKILLed rank, or its host lost with its shared memory; checkpoint age 5 and 18)",
            "",
            f"The heal of a lost process or host ({heal_names}) takes its per-fault costs from "
            "results/process_loss/data.csv: the medians over its heal runs of the columns below (the harness's "
            "badput parts), fed to the engine with each run's measured step (`useful_s` / steps), its non-fault "
            "badput (`badput_total_s` minus the fault's `part_*_s`: the checkpoint write inside the window) and "
            "the exact fault schedule; the baselines' restarts in the same sweep go through the same replay. "
            "The medians are over every trial's runs; per (fault, strategy, age) cell over its measured trials "
            f"({_trials_said({c.trials for c in heal_calib})}) the table gives the median goodputs and the error as "
            "the median over trials with its order-statistic interval ([min, max] of n trials covers 1 - 2^(1-n)). "
            f"{heal_largest_miss_md(heal_calib, heal_replay)} "
            "At scale these parts are the heal's size-independent cost; the vote and the communicator grow from "
            "their 2-rank cost by harness/scale/scaling.py's rules, the shard copy is the cluster's shard over "
            "host-memory or NIC bandwidth, a lost host adds the spare and is found by the heartbeat rule (2.1 s, "
            "measured) since no launcher sees it die.",
            "",
            heal_costs_md(),
            "",
            heal_calibration_md(heal_calib),
            "",
            f"## ETTR at each strategy's best checkpoint interval ({trials} Monte Carlo trials per interval, "
            f"seed {seed}, 30 days, 95% CI)",
            "",
            "Cluster: 8 GPUs per host, 5 s step, 4 GB of checkpoint per GPU written and read at 2 TB/s aggregate "
            "(Llama 3's Tectonic figure), 10-minute hang timeout, warm spare hosts (60 s swap). Failure mix: "
            "Llama 3's Table 5 as per-GPU-hour rates (see harness/scale/sources.py for every figure's source). "
            "The anchors are whole-job figures from other clusters, software and failure mixes: they bound the "
            "projection's order of magnitude, they are not its target.",
            "",
            winner_md(list(by_size[max(by_size)]), max(by_size)),
            "",
            anchor_table_md(table_sizes),
            "",
            "## Badput by failure class at the best interval (stop + replayed work, share of wall time)",
            "",
            badput_table_md(table_sizes),
            "",
            "## Cross-checks with published figures not used as inputs",
            "",
            cross_checks_md(mix),
            "",
            "Plots: `ettr_vs_gpus.png` (ETTR at the best interval vs cluster size, anchors starred), "
            "`ettr_vs_interval.png` (ETTR vs checkpoint interval at 16k and 100k GPUs, Daly dotted), "
            "`badput_by_class.png`. Data: `data.csv` (every size, strategy and interval), `best.csv`, "
            "`badput.csv`, `calibration.csv` and `heal_calibration.csv` (every run, with its trial), "
            "`calibration_cells.csv` and `heal_calibration_cells.csv` (per cell over trials, as the tables above).",
            f"Whole experiment: {runtime:.0f} s.",
            "",
            prov_md,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 trials, the table sizes only, into a temp dir")
    ap.add_argument("--trials", type=int, default=None, help="Monte Carlo trials per interval (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    trials = args.trials or (4 if args.quick else 32)
    sizes = TABLE_SIZES if args.quick else tuple(sorted(set(CURVE_SIZES) | set(TABLE_SIZES)))
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix=f"{NAME}_quick_")) if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    command = current_command(argv, module=f"experiments.{NAME}")
    t0 = time.time()
    mix = llama3_mix()
    calib = cal.calibrate(MEASURED)
    heal_calib = heal.calibrate_heal(HEAL_MEASURED)
    calib_cells = cal.error_intervals(calib)
    replay_cells = cal.error_intervals(cal.calibrate(MEASURED, own=True))
    heal_replay = heal.heal_error_intervals(heal.calibrate_heal(HEAL_MEASURED, own=True))
    heal_cells = heal.heal_error_intervals(heal_calib)
    by_size, charges = {}, {}
    for g in sizes:
        rows, taxes, choices = per_step_charges(Cluster(gpus=g), mix, strategy_names())
        by_size[g] = project(
            Cluster(gpus=g), mix, strategy_names(), trials=trials, seed=args.seed, outcomes=rows, tax=taxes
        )
        if g in TABLE_SIZES:
            charges[g] = (taxes, choices)
        print(f"{NAME}: {g:,} GPUs done ({time.time() - t0:.0f} s)", flush=True)
    runtime = time.time() - t0
    write_provenance(
        out,
        command,
        {
            "trials": trials,
            "seed": args.seed,
            "sizes": ",".join(map(str, sizes)),
            "days": Cluster().days,
            "calibrated_on": "results/goodput_vs_age, results/process_loss",
            "runtime_s": round(runtime, 1),
        },
    )
    prov = load_provenance(out)
    _write_csv(
        out / "data.csv",
        [
            {"gpus": g, "strategy": p.strategy, "interval_s": t, "ettr": e, "ci95": ci}
            for g, ps in by_size.items()
            for p in ps
            if p.feasible
            for t, e, ci in zip(p.intervals_s, p.ettr, p.ettr_ci)
        ],
    )
    _write_csv(
        out / "best.csv",
        [
            {
                "gpus": g,
                "strategy": p.strategy,
                "feasible": p.feasible,
                "best_interval_s": p.best_interval_s,
                "ettr": p.best_ettr,
                "ci95": p.best_ci,
                "young_s": p.young_s,
                "daly_s": p.daly_s,
                "mttf_h": mttf_h(mix, g),
                "driver": p.driver or p.reason,
            }
            for g, ps in by_size.items()
            for p in ps
        ],
    )
    _write_csv(
        out / "badput.csv",
        [
            {"gpus": g, "strategy": p.strategy, **{c: p.badput.get(c, 0.0) for c in list(CLASSES) + ["checkpoint"]}}
            for g, ps in by_size.items()
            for p in ps
            if p.feasible
        ],
    )
    _write_csv(
        out / "calibration.csv",
        [
            {
                "strategy": r.strategy,
                "age": r.age,
                "trial": r.trial,
                "measured": r.measured,
                "simulated": r.simulated,
                "error": r.error,
                "simulated_median_step": r.simulated_median_step,
                "error_median_step": r.error_median_step,
            }
            for r in calib
        ],
    )
    _write_csv(
        out / "heal_calibration.csv",
        [
            {
                "fault": r.fault,
                "strategy": r.strategy,
                "heals": r.heals,
                "age": r.age,
                "trial": r.trial,
                "measured": r.measured,
                "simulated": r.simulated,
                "error": r.error,
                "stop_s": r.stop_s,
            }
            for r in heal_calib
        ],
    )
    _write_csv(
        out / "calibration_cells.csv",
        [
            {
                "strategy": c.strategy,
                "age": c.age,
                "trials": c.trials,
                "measured_median": c.measured,
                "simulated_median": c.simulated,
                "error_median": c.error_median,
                "error_lo95": c.error_lo,
                "error_hi95": c.error_hi,
                "error_median_step_median": c.error_median_step,
            }
            for c in _cell_order(calib_cells)
        ],
    )
    _write_csv(
        out / "heal_calibration_cells.csv",
        [
            {
                "fault": c.fault,
                "strategy": c.strategy,
                "heals": c.heals,
                "age": c.age,
                "trials": c.trials,
                "measured_median": c.measured,
                "simulated_median": c.simulated,
                "error_median": c.error_median,
                "error_lo95": c.error_lo,
                "error_hi95": c.error_hi,
                "stop_s": c.stop_s,
            }
            for c in _heal_cell_order(heal_cells)
        ],
    )
    plots(out, by_size, prov)
    prov_md = (out / "provenance.md").read_text()
    text = table_md(
        calib_cells, heal_cells, by_size, mix, prov_md, trials, args.seed, runtime, replay_cells, heal_replay
    )
    at = text.index("\n### Provenance") if "\n### Provenance" in text else len(text)
    (out / "table.md").write_text(text[:at] + "\n" + charges_md(charges) + text[at:])
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
