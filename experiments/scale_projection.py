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

from experiments.provenance import current_command, load_provenance, write_provenance
from experiments.scale_projection_calibration import cell_order, heal_cell_order
from experiments.scale_projection_plots import plots
from experiments.scale_projection_table import TABLE_SIZES, charges_md, table_md
from harness.fleet.config import CLASSES, Cluster
from harness.fleet.sources import llama3_mix
from harness.scale import calibrate as cal
from harness.scale import heal_measured as heal
from harness.scale.entry import strategy_names
from harness.scale.project import mttf_h, project

NAME = "scale_projection"
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / NAME
MEASURED = ROOT / "results" / "goodput_vs_age"
HEAL_MEASURED = ROOT / "results" / "process_loss"
CURVE_SIZES = (1024, 2048, 4096, 9600, 16384, 32768, 65536, 100_000)


def per_step_charges(cluster: Cluster, mix: dict, names: Sequence[str]) -> tuple[dict, dict[str, float], dict]:
    """What each design pays on every step, charged in the projection: the heal's snapshot and push tax at
    the cadence the advisor picks for this cluster (harness.advise's cost model on ``gpu_node``'s stated
    assumptions, calibrated on results/heal_tax), with its outcomes at that cadence, and torchft's
    measured per-step quorum. Returns (outcome rows, tax per strategy, the heal's cadence choices)."""
    from harness.advise.advice import protection_plan
    from harness.advise.cost import GPU_NODE

    choices, rows, taxes = protection_plan(cluster, mix, GPU_NODE, names)
    return rows, taxes, choices


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


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
            for c in cell_order(calib_cells)
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
            for c in heal_cell_order(heal_cells)
        ],
    )
    plots(out, by_size, prov)
    prov_md = (out / "provenance.md").read_text()
    text = table_md(
        calib_cells,
        heal_cells,
        by_size,
        mix,
        prov_md,
        trials,
        args.seed,
        runtime,
        replay_cells,
        heal_replay,
        measured=MEASURED,
    )
    at = text.index("\n### Provenance") if "\n### Provenance" in text else len(text)
    (out / "table.md").write_text(text[:at] + "\n" + charges_md(charges) + text[at:])
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
