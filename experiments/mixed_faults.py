"""Every strategy over the same long, seeded fault trace drawn from a published failure mix, with trials and
intervals: the whole-run goodput each strategy keeps when many faults of many kinds strike one run.

    python -m experiments.mixed_faults              # 300 steps, ~10 faults (Llama 3 mix, seed 0), 5 trials
    python -m experiments.mixed_faults --quick      # ~5 min: 24 steps, seed 3 (one host loss), 1 trial, temp dir
    python -m experiments.mixed_faults --steps 60 --faults 2 --trials 5 --out results/mixed_faults/steps60

``--quick`` checks that every strategy runs the trace end to end: one trial gives no interval.

Every run is ``python -m harness experiment=mixed_faults`` (conf/experiment/mixed_faults.yaml: mistral_tiny,
2 gloo ranks on 2 network-namespace hosts, root) with ``fault=mixed``: one fault per event of the trace
``harness.fleet.trace.draw_trace(mix, steps, faults, seed, world_size=2)``, each of its own kind, at its
own step, on its own rank. The trace is the same for every strategy and every trial.

Each strategy runs in its production configuration at the settings the advisor picks for this trace
(``harness.advise.advice.advise_for_trace``): its own disk checkpoint interval, and for ``accelpact_heal``
its snapshot cadence (``snapshot.every``, ``push_every``, ``confirm_push``). The advisor's inputs are
measured first, on this machine, by a short fault-free calibration run (its productive step and the time
a checkpoint save blocks it). A strategy the harness refuses here (GEMINI without lm-resiliency) gets a
row saying why and how to install it, and no run.

Each trial runs the fault-free reference (``strategy=none``, no checkpoints) and every strategy once, in an
order rotated by the trial (``harness.report.trials.round_order``), so a change in the host's load hits
every strategy alike. The runs then go to the comparison's report (``harness.report.compare.trial_rows``
and ``harness.report.trials.summarize_cells``: the measured whole-run goodput, the gain of accelpact_heal
over each strategy paired by trial with its interval and verdict); experiments.mixed_faults_report writes
table.md (with the trace's table, the advisor's settings, badput by part and by fault class, bit
identity), table.csv, runs.csv, timeline.png and the provenance.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import _driver
from experiments.provenance import write_provenance

NAME = "mixed_faults"
_ROOT = Path(__file__).resolve().parent.parent
STRATEGIES: tuple[str, ...] = ("accelpact_heal", "checkpoint_restore", "cold_restart", "torchft", "gemini")
OURS = "accelpact_heal"
REFERENCE = "reference"
# The advisor speaks the simulator's strategy names; where a harness strategy's differs, its model there.
ADVISOR_ROW: dict[str, str] = {"torchft": "torchft_peer_heal"}
RUN_TIMEOUT_S = 3600  # one run; a run past it is stopped and reported failed, the others go on


@dataclass(frozen=True)
class Size:
    steps: int
    faults: float  # faults the trace expects over the run
    trials: int


FULL = Size(300, 10.0, 5)
QUICK = Size(24, 1.0, 1)
# Seed 0 draws 5 faults in QUICK's 24 steps (the draws cluster); seed 3 draws one host loss, the mix's most
# common class, at step 21: the quick run stays near 5 minutes.
QUICK_SEED = 3


@dataclass(frozen=True)
class Calibration:
    """The advisor's inputs, measured here by a fault-free run."""

    step_s: float  # the productive step (median over ranks' useful time / steps)
    checkpoint_write_s: float  # what one sync save blocks a step for
    state_bytes: float  # parameters + AdamW moments of one rank (fp32)
    run_dir: str


def base_overrides(size: Size, seed: int) -> list[str]:
    return [
        "experiment=mixed_faults",
        f"train.steps={size.steps}",
        f"fault.trace_faults={size.faults:g}",
        f"fault.seed={seed}",
        "progress=false",
    ]


def reference_overrides() -> list[str]:
    """The fault-free reference: no strategy, no fault, no checkpoint (the ideal the others are held to)."""
    from harness import strategies

    return [f"strategy={strategies.reference().name}", "fault=none", "checkpoint.interval=0"]


def run_harness(overrides: list[str], run_dir: Path, index: Path) -> dict[str, Any]:
    """One ``python -m harness`` run into ``run_dir``; its results row (``status`` failed if it left none)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "harness", *overrides, f"hydra.run.dir={run_dir}", f"index_path={index}"]
    log = run_dir.parent / f"{run_dir.name}.log"
    t0 = time.time()
    with log.open("w") as f:
        try:
            code = subprocess.run(cmd, cwd=_ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = -1
    summary = run_dir / "summary.json"
    row = json.loads(summary.read_text()).get("row", {}) if summary.exists() else {}
    if not row:
        row = {"status": "failed", "reason": f"no summary.json (exit {code}); see {log}"}
    print(
        f"  {run_dir.parent.name}/{run_dir.name}: {row.get('status')} in {time.time() - t0:.0f} s"
        + (f", goodput {row['goodput']:.1f} tokens/s" if isinstance(row.get("goodput"), (int, float)) else "")
        + (f" ({row.get('reason')})" if row.get("status") != "ok" else ""),
        flush=True,
    )
    return row


def calibrate(scratch: Path, size: Size, seed: int) -> Calibration:
    """A 20-step fault-free run with a sync checkpoint every 5 steps: the step and the save it blocks for."""
    from harness.report.goodput import load_report

    every, steps = 5, 20
    run_dir = scratch / "calibration"
    saved = scratch / "calibration.json"
    if saved.exists():  # --scratch of an earlier run (--resume, --report-only): the same advice again
        return Calibration(**json.loads(saved.read_text()))
    row = run_harness(
        [*base_overrides(size, seed), *reference_overrides(), f"train.steps={steps}", f"checkpoint.interval={every}"],
        run_dir,
        scratch / "index.csv",
    )
    if row.get("status") != "ok":
        raise RuntimeError(f"the calibration run failed ({row.get('reason')}); see {run_dir}/logs")
    rep = load_report(str(run_dir))
    step_s = rep.useful_s / max(rep.steps, 1)
    saves = steps // every
    world = int(row.get("world_size") or 2)
    state = float(row.get("n_params") or 0) * 4 * 3 / world
    cal = Calibration(step_s, rep.badput.checkpoint_s / saves, state, str(run_dir))
    saved.write_text(json.dumps(dataclasses.asdict(cal)) + "\n")
    return cal


def advice(base: list[str], cal: Calibration) -> tuple[Any, dict[str, Any]]:
    """The runs' trace (the one ``fault=mixed`` injects under ``base``) and, per harness strategy, the
    advisor's row for it (``TraceAdviceRow``)."""
    from harness.advise.advice import advise_for_trace
    from harness.app.config import compose, to_run_config
    from harness.faults import planned

    run = to_run_config(compose(base))
    trace = planned.draw(run.fault, run.train.steps, run.cluster.world_size)
    rows = {r.strategy: r for r in advise_for_trace(trace, cal.step_s, cal.state_bytes, cal.checkpoint_write_s)}
    return trace, {s: rows.get(ADVISOR_ROW.get(s, s)) for s in STRATEGIES}


def strategy_overrides(name: str, row: Any) -> list[str]:
    """``strategy=<name>`` at the advisor's settings: its disk interval (0: no fault of the trace rolls it back
    to disk, so it never saves) and, for the heal, its snapshot cadence."""
    every = row.checkpoint_every_steps if row is not None else None
    out = [f"strategy={name}", f"checkpoint.interval={every or 0}"]
    if row is not None and row.cadence is not None and name == OURS:
        c = row.cadence
        out += [
            f"strategy.snapshot.every={c.every}",
            f"strategy.snapshot.push_every={c.push_every}",
            f"strategy.snapshot.confirm_push={str(bool(c.confirm)).lower()}",
            "strategy.snapshot.max_tax=null",  # the advisor's cadence, not the runtime's tax budget
        ]
    return out


def refused(base: list[str], settings: dict[str, list[str]]) -> dict[str, str]:
    """The strategies the harness refuses here (``check_runnable``), each with its reason's first line."""
    from harness.app.capabilities import check_runnable
    from harness.app.config import compose, to_run_config
    from harness.app.validate import ConfigError, check_values

    out = {}
    for name, overrides in settings.items():
        try:
            run = to_run_config(compose([*base, *overrides]))
            check_values(run)
            check_runnable(run)
        except ConfigError as exc:
            out[name] = str(exc).splitlines()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    from harness.report.trials import interleave

    ap = _driver.parser(
        __doc__, NAME, f"{QUICK.steps} steps, ~{QUICK.faults:g} faults, {QUICK.trials} trials, temp dir"
    )
    ap.add_argument("--trials", type=int, default=None, help=f"interleaved rounds (default {FULL.trials})")
    ap.add_argument("--steps", type=int, default=None, help="override the run length")
    ap.add_argument("--faults", type=float, default=None, help="override the faults the trace expects")
    ap.add_argument("--seed", type=int, default=None, help=f"the trace's seed (default 0; --quick: {QUICK_SEED})")
    ap.add_argument("--scratch", default=None, help="where the runs go (default: a temp dir, deleted unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch run directories")
    ap.add_argument("--resume", action="store_true", help="with --scratch: skip the runs that already finished")
    ap.add_argument("--report-only", action="store_true", help="with --scratch: no runs, the report of those there")
    args = ap.parse_args(argv)
    if (args.resume or args.report_only) and not args.scratch:
        print("error: --resume and --report-only need the --scratch of the earlier runs", file=sys.stderr)
        return 2
    size = QUICK if args.quick else FULL
    seed = args.seed if args.seed is not None else (QUICK_SEED if args.quick else 0)
    size = Size(args.steps or size.steps, args.faults or size.faults, args.trials or size.trials)
    if size.trials < 1:
        print(f"error: --trials must be 1 or more; got {size.trials}", file=sys.stderr)
        return 2
    out = _driver.output_dir(args, NAME)
    scratch = _driver.scratch_dir(args, NAME)
    sweep = scratch / "sweep"
    base = base_overrides(size, seed)
    timing = _driver.Timing()
    try:
        print(f"calibration: a fault-free run for the advisor's inputs in {scratch / 'calibration'}", flush=True)
        cal = calibrate(scratch, size, seed)
        trace, rows = advice(base, cal)
        settings = {s: strategy_overrides(s, rows[s]) for s in STRATEGIES}
        missing = refused(base, settings)
        runnable = [s for s in STRATEGIES if s not in missing]
        for s, why in missing.items():
            print(f"note: no {s} rows: {why}", flush=True)
        print(trace.table_md(cal.step_s).splitlines()[0], flush=True)
        if args.report_only:
            from experiments import mixed_faults_report
            from experiments.provenance import load_provenance

            runtime = float(load_provenance(out).extra.get("runtime_s", 0.0))
            mixed_faults_report.write(out, sweep, trace, cal, rows, settings, missing, runtime)
            return 0
        write_provenance(
            out,
            _driver.command(argv, NAME),
            {
                "trials": size.trials,
                "steps": size.steps,
                "faults_expected": size.faults,
                "faults_drawn": len(trace.events),
                "seed": seed,
                "strategies": ",".join(runnable),
                "not_run": ",".join(missing),
                "quick": args.quick,
            },
        )
        items = [REFERENCE, *runnable]
        plan = interleave(items, size.trials)
        print(f"{size.trials} trial(s) of {len(items)} runs each, interleaved ({len(plan)} runs)", flush=True)
        for n, (trial, item) in enumerate(plan):
            if n % len(items) == 0:
                print(f"trial {trial} starts ({timing.elapsed_s / 60:.1f} min so far)", flush=True)
            overrides = reference_overrides() if item == REFERENCE else settings[item]
            if args.resume and (sweep / f"trial{trial}" / item / "summary.json").exists():
                continue
            run_harness(
                [*base, *overrides, f"compare.trial={trial}"], sweep / f"trial{trial}" / item, scratch / "index.csv"
            )
        runtime = timing.elapsed_s
        _driver.record_runtime(out, runtime)
        _driver.add_end_load(out)
        from experiments import mixed_faults_report

        mixed_faults_report.write(out, sweep, trace, cal, rows, settings, missing, runtime)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out}/ in {timing.elapsed_s / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
