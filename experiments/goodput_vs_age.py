"""Whole-run goodput against checkpoint age (paper: AccelPact 1.197x over cold restart and 1.194x over
NVRx checkpoint restoration at age 5, 1.698x over restart at age 18; Mistral-7B on 16 GPUs), measured
side by side at this machine's scale.

    python -m experiments.goodput_vs_age            # full run: ages 0-18, 5 trials (the committed run took 38 min)
    python -m experiments.goodput_vs_age --quick    # ~4 min check: ages 5 and 18, 1 trial, into a temp dir
    python -m experiments.goodput_vs_age --trials 3 # fewer trials (each trial: ~10 min on 2 quiet cores)
    python -m experiments.goodput_vs_age --rederive # tables and plots again from results/<name>/data.csv

Runs the harness's comparison (a Hydra multirun, ``python -m harness -m``, with
harness.app.comparison.ComparisonCallback): a fault-free reference (strategy none), then accelpact,
cold_restart and checkpoint_restore (NVRx in-process restart + DCP restore + replay) at each checkpoint
age, on mistral_tiny with 2 gloo ranks and one socket reset on rank 0 during the backward reduce-scatter.
The runs go to a scratch directory outside the repo; only the small derived files come here.

A gain depends on the setup as much as on the method: under the model
``gain(a) = 1 + (R + a*s) / T`` (R: the baseline's restart + restore cost, s: step time, T: AccelPact's
whole-run time, AccelPact's own recovery ~0) a gain is fixed by R/s and by the run's length T/s.
So besides the gains this writes our measured R/s, the R/s and T/s the paper's own figures imply under
that model, the same model fitted to our gains, and our R/s projected onto the paper's run length.

With ``--trials N`` the comparison runs N interleaved rounds (``compare.trials``), each with its own
reference; data.csv has one row per run and trial (``trial``), with the badput-based goodput
(``goodput_bp``, docs/goodput.md) and AccelPact's gain on it (``accelpact_gain_bp``) beside the measured
ones, and the analysis below works on the medians over trials. The comparison's own verdict table
(median, 95% interval and verdict per cell) is kept as verdict.md / verdict.csv and appended to table.md,
its plots with intervals as gain_intervals.png and badput_by_part.png.

Writes results/<name>/: table.md, data.csv, ratios.csv, fits.csv, claims.csv, goodput_vs_age.png,
recovery_breakdown.png, timeline.png (the cold restart at the largest age), verdict.md, verdict.csv,
runs.csv, gain_intervals.png, badput_by_part.png, provenance.json (+ .md).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import _driver
from experiments.goodput_model import REFERENCE_STRATEGY, STRATEGIES, UNDER_TEST, data_rows
from experiments.goodput_report import read_data, write_outputs
from experiments.provenance import load_provenance, write_provenance
from harness.report.goodput import fault_badput_parts

NAME = "goodput_vs_age"
_ROOT = Path(__file__).resolve().parent.parent  # where `python -m harness` finds conf/


@dataclass(frozen=True)
class Plan:
    """One experiment size. The fault at age ``a`` hits step ``interval + a`` (harness.faults.schedule), so
    ``interval`` > max age and ``steps`` > interval + max age."""

    ages: tuple[int, ...]
    steps: int
    interval: int
    seq_len: int
    batch_size: int
    trials: int = 1  # compare.trials: interleaved rounds, each with its own reference

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"--trials must be 1 or more; got {self.trials}")
        if not self.ages:
            raise ValueError("Plan.ages is empty: give at least one checkpoint age (--ages 5,18)")
        if max(self.ages) >= self.interval:
            raise ValueError(
                f"age {max(self.ages)} needs a checkpoint interval above it (--interval "
                f"{max(self.ages) + 1} or more); got {self.interval}"
            )
        if self.interval + max(self.ages) >= self.steps:
            raise ValueError(
                f"age {max(self.ages)} with interval {self.interval} faults step "
                f"{self.interval + max(self.ages)}: --steps must be at least "
                f"{self.interval + max(self.ages) + 1}"
            )


# mistral_tiny's layers and widths, with seq 64 x batch 2 per rank (mistral_tiny's own 128 x 4 is ~4x the
# step time). The committed run's plan: ages 0-18 at the default comparison's cadence, 5 trials.
FULL = Plan(ages=(0, 2, 5, 10, 18), steps=40, interval=20, seq_len=64, batch_size=2, trials=5)
QUICK = Plan(ages=(5, 18), steps=40, interval=20, seq_len=64, batch_size=2, trials=1)


# mistral_tiny with 2 of its 4 layers, as the default comparison (conf/experiment/compare.yaml): here a
# run pays ~7.5 s of rank start-up before its first step, and the trials must fit the budget.
NUM_LAYERS = 2


def overrides(plan: Plan, scratch: Path) -> list[str]:
    """Hydra overrides of the comparison (conf/experiment/compare.yaml) for ``plan``."""
    return [
        "experiment=compare",
        "model=mistral_tiny",
        f"model.num_layers={NUM_LAYERS}",
        "fault=socket_reset",
        "fault.ranks=[0]",
        "fault.phase=backward_reduce_scatter",
        "checkpoint=sync",
        f"train.steps={plan.steps}",
        f"checkpoint.interval={plan.interval}",
        f"model.seq_len={plan.seq_len}",
        f"model.batch_size={plan.batch_size}",
        f"compare.trials={plan.trials}",
        "progress=false",
        f"index_path={scratch / 'index.csv'}",
    ]


# ---- measuring (impure) ----------------------------------------------------------------------------
def sweep_overrides(plan: Plan, run_dir: Path) -> list[str]:
    """The comparison as a Hydra multirun: every strategy at every age of ``plan``, into ``run_dir``."""
    return [
        *overrides(plan, scratch=run_dir.parent),
        f"hydra.sweep.dir={run_dir}",
        f"fault.at_age={','.join(map(str, plan.ages))}",
        f"strategy={','.join(STRATEGIES)}",
    ]


def measure(plan: Plan, scratch: Path) -> tuple[list[dict[str, Any]], Path]:
    """Run the comparison into ``scratch``; returns data rows (one per run and trial) and the scratch run
    directory.

    The comparison is the harness's multirun (``python -m harness -m ...``, whose trials sweeper runs
    the fault-free reference of each trial); its table is rebuilt here per trial from each run's
    summary.json and goodput report, as the callback builds it.
    """
    from harness.app.capabilities import check_runnable
    from harness.app.config import compose, to_run_config

    for strategy in STRATEGIES:  # e.g. NVRx missing: refuse before anything starts
        check_runnable(
            to_run_config(
                compose([*overrides(plan, scratch), f"strategy={strategy}", f"fault.at_age={max(plan.ages)}"])
            )
        )
    run_dir = scratch / "comparison"
    done = subprocess.run([sys.executable, "-m", "harness", *sweep_overrides(plan, run_dir)], cwd=_ROOT)
    if done.returncode != 0:
        print(f"warning: the comparison exited with {done.returncode}; its failed runs show in data.csv")
    return collect(run_dir), run_dir


def collect(run_dir: Path) -> list[dict[str, Any]]:
    """Data rows of a finished comparison directory: per trial (``trial<k>/``, or the directory itself
    for one trial), every run's row with ``trial``, ``goodput_bp`` (at the references' median productive
    step) and ``accelpact_gain_bp``."""
    from harness.report import compare
    from harness.report.badput_goodput import reference_step_s
    from harness.report.goodput import load_report
    from harness.report.trials import trial_of

    trial_dirs = sorted((p for p in run_dir.glob("trial*") if p.is_dir()), key=lambda p: trial_of(p.name)) or [run_dir]
    # One reference pace for every trial (as the comparison's table): the references' median productive step.
    ref_step = reference_step_s(
        [
            load_report(str(t / compare.REFERENCE))
            for t in trial_dirs
            if (t / compare.REFERENCE / "summary.json").exists()
        ]
    )
    data: list[dict[str, Any]] = []
    for tdir in trial_dirs:
        rows = _collect_trial(tdir, ref_step)
        for r in rows:
            r["trial"] = trial_of(tdir.name)
        data += rows
    return data


def _collect_trial(run_dir: Path, ref_step: float) -> list[dict[str, Any]]:
    from harness.report import compare
    from harness.report.badput_goodput import badput_goodput
    from harness.report.goodput import load_report

    run_rows: dict[str, dict[str, Any]] = {}
    parts: dict[str, dict[str, float]] = {}
    summaries, summarized_rows = [], []
    for sub in sorted(p for p in run_dir.iterdir() if (p / "summary.json").exists()):
        row = run_rows[sub.name] = json.loads((sub / "summary.json").read_text()).get("row", {})
        try:
            summaries.append(compare.summarize(sub, row, run_dir / compare.REFERENCE))
            summarized_rows.append(row)
            parts[sub.name] = fault_badput_parts(str(sub))
        except Exception as exc:  # noqa: BLE001 - a run without events keeps its row, with no breakdown
            print(f"warning: {sub}: no fault breakdown ({exc})")
    table = compare.build_table(summaries, summarized_rows)
    data = data_rows(table, run_rows, parts)
    bp = {}
    for d in data:
        try:
            bp[d["run"]] = badput_goodput(load_report(str(run_dir / d["run"])), ref_step).goodput
        except Exception:  # noqa: BLE001 - no events: no badput-based goodput
            bp[d["run"]] = math.nan
    ours = {d["age"]: bp.get(d["run"], math.nan) for d in data if d["strategy"] == UNDER_TEST}
    for d in data:
        d["goodput_bp"] = bp.get(d["run"], math.nan)
        mine = d["goodput_bp"]
        d["accelpact_gain_bp"] = (
            ours.get(d["age"], math.nan) / mine
            if d["age"] is not None and d["strategy"] != REFERENCE_STRATEGY and mine > 0
            else math.nan
        )
    return data


VERDICT_FILES = {
    "table.md": "verdict.md",
    "table.csv": "verdict.csv",
    "runs.csv": "runs.csv",
    "goodput_vs_age.png": "gain_intervals.png",
    "badput_by_part.png": "badput_by_part.png",
}


def keep_verdict(run_dir: Path, out: Path) -> None:
    """The comparison's verdict table (median, 95% interval, verdict per cell), every run's row and the
    plots with intervals, copied into ``out`` under ``VERDICT_FILES``' names."""
    for src, dst in VERDICT_FILES.items():
        if (run_dir / src).exists():
            shutil.copyfile(run_dir / src, out / dst)


def main(argv: list[str] | None = None) -> int:
    ap = _driver.parser(__doc__, NAME, "ages 5 and 18 only, 40 steps, written to a temp dir")
    ap.add_argument(
        "--ages", default=None, help="comma list of checkpoint ages (default 0,1,2,5,10,18,30; --quick 5,18)"
    )
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--trials", type=int, default=None, help="interleaved rounds (default 5; --quick 1)")
    ap.add_argument("--interval", type=int, default=None, help="checkpoint interval (must exceed the largest age)")
    ap.add_argument("--scratch", default=None, help="where the runs go (default: a temp dir, deleted unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch run directories")
    ap.add_argument(
        "--rederive",
        action="store_true",
        help="rebuild table.md, CSVs and plots from OUT/data.csv without running (provenance kept)",
    )
    args = ap.parse_args(argv)
    if args.rederive:
        out = _driver.output_dir(args, NAME, rederive=True)
        prov = load_provenance(out)
        write_outputs(out, read_data(out / "data.csv"), float(prov.extra.get("runtime_s", math.nan)))
        return 0

    base = QUICK if args.quick else FULL
    try:
        plan = Plan(
            ages=tuple(int(a) for a in args.ages.split(",")) if args.ages else base.ages,
            steps=args.steps or base.steps,
            interval=args.interval or base.interval,
            seq_len=base.seq_len,
            batch_size=base.batch_size,
            trials=args.trials or base.trials,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = _driver.output_dir(args, NAME)
    scratch = _driver.scratch_dir(args, NAME)
    print(
        f"{NAME}: {(len(plan.ages) * len(STRATEGIES) + 1) * plan.trials} runs ({plan}); runs in {scratch}, "
        f"results in {out}",
        flush=True,
    )
    timing = _driver.Timing()
    # Provenance first: its load average is the one at the start of the measurement.
    write_provenance(
        out,
        _driver.command(argv, NAME),
        {
            "ages": ",".join(map(str, plan.ages)),
            "steps": plan.steps,
            "interval": plan.interval,
            "seq_len": plan.seq_len,
            "batch_size": plan.batch_size,
            "model": f"mistral_tiny ({NUM_LAYERS} layers)",
            "world_size": 2,
            "trials": plan.trials,
            "fault": "socket_reset rank 0 backward_reduce_scatter",
        },
    )
    try:
        data, run_dir = measure(plan, scratch)
        runtime = timing.elapsed_s
        _driver.record_runtime(out, runtime)
        _driver.add_end_load(out)
        keep_verdict(run_dir, out)
        write_outputs(out, data, runtime)
        timeline = run_dir / "timeline.png"
        if timeline.exists():
            shutil.copyfile(timeline, out / "timeline.png")
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    failed = [r["run"] for r in data if r.get("status") not in (None, "ok")]
    print(f"wrote {out}/ in {runtime / 60:.1f} min" + (f"; FAILED runs: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
