"""The scale projection's table.md: the strategy legend, both calibrations, the winner at the largest size,
ETTR beside the published anchors, the badput by class, the cross-checks, and the per-step costs charged.
"""

from __future__ import annotations

from pathlib import Path

from experiments.scale_projection_calibration import (
    calibration_md,
    heal_calibration_md,
    heal_costs_md,
    heal_largest_miss_md,
    largest_miss_md,
    trials_said,
)
from harness import strategies
from harness.fleet.config import Cluster
from harness.fleet.sources import FTHSDP_STALL_S, FTHSDP_SYNC_STALL_S, RSC_MTTF_H, RSC_SOURCE
from harness.scale import calibrate as cal
from harness.scale import heal_measured as heal
from harness.scale import scaling as sc
from harness.scale.outcomes import outcome_table
from harness.scale.project import mttf_h
from harness.scale.render import anchor_table_md, badput_table_md, strategy_legend_md
from harness.scale.torchft_measured import measured_torchft

TABLE_SIZES = (1024, 9600, 16384, 100_000)
# Row selection: the synchronous restart whose stall per failure is set beside FT-HSDP's published one.
STALL_BASELINE = "cold_restart"


def heal_strategies() -> list[str]:
    """The simulated rows whose heal of a lost process or host is calibrated on results/process_loss."""
    return [n for n, sim in strategies.simulated().items() if sim.build in heal.HEAL_BUILDS]


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
    *,
    measured: Path,
) -> str:
    """The whole table.md but the per-step costs (``charges_md``, put in before the provenance);
    ``measured``: the goodput_vs_age results the calibration was fed (each run's mean against median step)."""
    runs, _, _ = cal.load_runs(measured)
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
            f"({trials_said({c.trials for c in calib})}): the median measured and simulated goodput, and the error "
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
            f"({trials_said({c.trials for c in heal_calib})}) the table gives the median goodputs and the error as "
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
            "Llama 3's Table 5 as per-GPU-hour rates (see harness/fleet/sources.py for every figure's source). "
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
