"""Losing a process or a whole host: AccelPact's in-memory heal against cold restart and NVRx checkpoint
restoration, at checkpoint ages 5 and 18, measured side by side on this machine.

    python -m experiments.process_loss             # full run, 5 trials (~40 min on 2 cores; root)
    python -m experiments.process_loss --quick     # age 5 only, 24 steps, 1 trial, into a temp dir
    python -m experiments.process_loss --trials 1  # one trial per cell (~10 min)
    python -m experiments.process_loss --rederive  # table.md and plots again from results/<name>/data.csv

Two simulated hosts (``cluster=local_hosts``: a network namespace each, its own snapshot root, one rank
each on mistral_tiny). For each fault, the harness's comparison (``python -m harness -m``: the fault-free
reference first, then every strategy at every age):

- ``kill``: SIGKILL of rank 1 (its host and shared memory stay);
- ``host_loss``: SIGKILL of every rank of rank 1's host and deletion of that host's snapshot root.

accelpact heals in memory (the survivor keeps its live state; the replacement loads the dead rank's own
snapshot, or its buddy's replica after a host loss); cold_restart relaunches every rank and restores the
newest DCP checkpoint; checkpoint_restore is NVRx's in-process restart with DCP restore. Then the cost
side: fault-free accelpact runs with snapshots on and off, alternated, for the per-step overhead, and the
shared-memory bytes each rank's snapshots took (measured on the ranks, beside the memory plan's figure).

With ``--trials N`` each fault's comparison runs N interleaved rounds (``compare.trials``), each with its
own reference: data.csv has one row per run and trial (``trial``), the table and plot use the medians
over trials, and each fault's verdict table from the comparison (measured gain, interval with its coverage, verdict per cell)
is kept as verdict_<fault>.md.

Writes results/<name>/: table.md, data.csv, overhead.csv, goodput.png, verdict_<fault>.md,
provenance.json (+ .md).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from experiments import _driver
from experiments._load_sampler import LoadSampler, mean_load, read_samples
from experiments.process_loss_report import read_rows, write_outputs
from experiments.provenance import load_provenance, write_provenance
from harness import strategies
from harness.report.goodput import fault_badput_parts

NAME = "process_loss"
FAULTS: tuple[str, ...] = ("kill", "host_loss")
# Row selection: the strategy under test and the two baselines whose restarts it is compared with.
UNDER_TEST: str = strategies.healer().name  # AccelPact with its heal: what a lost process needs
STRATEGIES: tuple[str, ...] = (UNDER_TEST, "cold_restart", "checkpoint_restore")
_ROOT = Path(__file__).resolve().parent.parent
LOAD_FILE = "load.jsonl"  # in the scratch dir: the load average sampled every 5 s while the runs go


@dataclass(frozen=True)
class Plan:
    """One size: the fault at age ``a`` hits step ``interval + a``; the overhead pairs run ``overhead_steps``."""

    ages: tuple[int, ...]
    steps: int
    interval: int
    seq_len: int
    batch_size: int
    overhead_pairs: int
    overhead_steps: int
    trials: int = 1  # compare.trials: interleaved rounds per fault, each with its own reference

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"--trials must be 1 or more; got {self.trials}")
        if not self.ages or max(self.ages) >= self.interval or self.interval + max(self.ages) >= self.steps:
            raise ValueError(
                f"ages {self.ages} need interval > max age and steps > interval + max age "
                f"(got interval {self.interval}, steps {self.steps})"
            )


FULL = Plan(
    ages=(5, 18), steps=40, interval=20, seq_len=64, batch_size=2, overhead_pairs=5, overhead_steps=40, trials=5
)
QUICK = Plan(ages=(5,), steps=24, interval=12, seq_len=64, batch_size=2, overhead_pairs=1, overhead_steps=24)


# mistral_tiny with 2 of its 4 layers, as the default comparison (conf/experiment/compare.yaml), in the
# comparison and in the overhead pairs alike: here a run pays ~7.5 s of rank start-up before its first step.
NUM_LAYERS = 2


def common(plan: Plan, scratch: Path) -> list[str]:
    """Overrides every run shares: the model size, two hosts of one rank, the checkpoint schedule."""
    return [
        "model=mistral_tiny",
        f"model.num_layers={NUM_LAYERS}",
        f"model.seq_len={plan.seq_len}",
        f"model.batch_size={plan.batch_size}",
        # 60 s, local_hosts' default (explicit: the committed runs used it). It was 5 s, sized for link
        # outages; on this loaded host building a gloo group took over 5 s (a reference run timed out in it).
        "cluster=local_hosts",
        "cluster.world_size=2",
        "cluster.hosts=2",
        "cluster.pg_timeout_s=60",
        "checkpoint=sync",
        f"checkpoint.interval={plan.interval}",
        f"train.steps={plan.steps}",
        # Snapshot every step, always (a heal replays at most the step in flight), as the committed runs
        # did: the heal's default tax budget would pick a sparser cadence after its 8-step warm-up. Under
        # per_strategy: the sweep runs the baselines too, which have no snapshot settings.
        f"++per_strategy.{UNDER_TEST}.snapshot.max_tax=null",
        "progress=false",
        f"index_path={scratch / 'index.csv'}",
    ]


def sweep_overrides(plan: Plan, fault: str, run_dir: Path) -> list[str]:
    """The comparison for ``fault``: every strategy at every age, as a Hydra multirun into ``run_dir``."""
    return [
        "experiment=compare",
        *common(plan, run_dir.parent),
        f"fault={fault}",
        "fault.ranks=[1]",
        "fault.schedule=at_age",
        "fault.at_step=null",
        "fault.phase=backward_reduce_scatter",
        f"fault.at_age={','.join(map(str, plan.ages))}",
        f"strategy={','.join(STRATEGIES)}",
        f"compare.trials={plan.trials}",
        f"hydra.sweep.dir={run_dir}",
    ]


# ---- measuring (impure) ----------------------------------------------------------------------------
def _heal_columns(run_dir: Path) -> dict[str, Any]:
    """Where the lost rank's state came from, and the heal's own timings (replacement side)."""
    from harness.events import Heal, load_events, of_type

    heals = [h for h in of_type(load_events(run_dir), Heal) if h.role == "replacement"]
    if not heals:
        return {
            "heal_source": "",
            "heal_total_s": math.nan,
            "replacement_start_s": math.nan,
            "heal_transfer_s": math.nan,
            "disk_bytes_read": math.nan,
        }
    return {
        "heal_source": "+".join(sorted({str(h.source) for h in heals})),
        "heal_total_s": max(h.total_s for h in heals),
        "replacement_start_s": max(h.replacement_start_s for h in heals),
        "heal_transfer_s": max(h.heal_transfer_s for h in heals),
        "disk_bytes_read": sum(h.bytes_read_from_disk for h in heals),
    }


def unsupported(plan: Plan, fault: str, scratch: Path) -> dict[str, str]:
    """Strategies the harness refuses for ``fault`` here, with its one-line reason (``check_runnable``'s
    ConfigError): they get a row saying so, not a run."""
    from harness.app.capabilities import check_runnable
    from harness.app.config import compose, to_run_config
    from harness.app.validate import ConfigError

    out = {}
    for strategy in STRATEGIES:
        args = [
            a
            for a in sweep_overrides(plan, fault, scratch / fault)
            if not a.startswith(("strategy=", "fault.at_age=", "hydra."))
        ]
        try:
            check_runnable(to_run_config(compose([*args, f"strategy={strategy}", f"fault.at_age={max(plan.ages)}"])))
        except ConfigError as exc:
            out[strategy] = str(exc).splitlines()[0]
    return out


def measure_fault(plan: Plan, fault: str, scratch: Path) -> list[dict[str, Any]]:
    """Run one fault's comparison; one flat row per run (the reference included)."""
    run_dir = scratch / fault
    refused = unsupported(plan, fault, scratch)
    (scratch / f"{fault}.refused.json").write_text(json.dumps(refused))
    strategies = [s for s in STRATEGIES if s not in refused]
    args = [
        a if not a.startswith("strategy=") else f"strategy={','.join(strategies)}"
        for a in sweep_overrides(plan, fault, run_dir)
    ]
    done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=_ROOT)
    if done.returncode != 0:
        print(f"warning: the {fault} comparison exited with {done.returncode}; its failed runs show in data.csv")
    return collect_fault(fault, run_dir, plan)


def keep_verdict(fault: str, run_dir: Path, out: Path) -> None:
    """The comparison's own verdict table of ``fault`` (measured gain, interval with its coverage, verdict per cell)."""
    if (run_dir / "table.md").exists():
        shutil.copyfile(run_dir / "table.md", out / f"verdict_{fault}.md")


def _run_window(row: Mapping[str, Any]) -> tuple[float, float]:
    """Unix start and end of a run, from its row's ``started_at`` and ``wall_s`` (nan if unknown)."""
    try:
        start = datetime.strptime(str(row.get("started_at")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
        return start, start + float(row.get("wall_s") or 0.0)
    except (TypeError, ValueError):
        return math.nan, math.nan


def _load_columns(row: Mapping[str, Any], samples: list[tuple[float, float]]) -> dict[str, Any]:
    """The mean 1-min load average while this run ran (sampled beside it; blank for runs made without)."""
    start, end = _run_window(row)
    load, n = mean_load(samples, start, end) if not math.isnan(start) else (math.nan, 0)
    return {"load_avg_run": load, "load_samples": n}


def collect_fault(fault: str, run_dir: Path, plan: Plan) -> list[dict[str, Any]]:
    """The rows of one fault's finished comparison directory (per trial: ``trial<k>/``, or the directory
    itself for one trial), plus one per refused (strategy, age)."""
    from harness.report.trials import trial_of

    refused_path = run_dir.parent / f"{fault}.refused.json"
    refused = json.loads(refused_path.read_text()) if refused_path.exists() else {}
    samples = read_samples(run_dir.parent / LOAD_FILE)
    rows: list[dict[str, Any]] = [
        {"fault": fault, "run": f"{s}_age{a}", "strategy": s, "age": a, "status": "not supported", "reason": why}
        for s, why in refused.items()
        for a in plan.ages
    ]
    trial_dirs = sorted((p for p in run_dir.glob("trial*") if p.is_dir()), key=lambda p: trial_of(p.name))
    for tdir in trial_dirs or [run_dir]:
        for r in _collect_trial(fault, tdir, samples):
            r["trial"] = trial_of(tdir.name)
            rows.append(r)
    return rows


def _collect_trial(fault: str, run_dir: Path, samples: list[tuple[float, float]]) -> list[dict[str, Any]]:
    from harness.report import compare

    rows: list[dict[str, Any]] = []
    for sub in sorted(p for p in run_dir.iterdir() if (p / "summary.json").exists()):
        row = json.loads((sub / "summary.json").read_text()).get("row", {})
        d: dict[str, Any] = {
            "fault": fault,
            "run": sub.name,
            "strategy": row.get("strategy"),
            "age": row.get("age"),
            "status": row.get("status"),
            "goodput": row.get("goodput"),
            "wall_s": row.get("wall_s"),
            "step_median_s": row.get("step_time_median_s"),
            "startup_s": row.get("startup_s"),
            "replayed_steps": row.get("replayed_steps"),
            "relaunches": row.get("relaunches"),
            # Where a relaunch resumed from (a whole-job crash: accelpact_heal's snapshots).
            "restore_source": row.get("restore_source"),
            "restore_disk_bytes": row.get("restore_disk_bytes"),
            "reason": row.get("reason") or "",
            # What the drift correction in the report needs: the time spent in useful steps
            # and every measured badput second (checkpoints included), summing to goodput_wall_s.
            "useful_s": row.get("useful_s"),
            "useful_tokens": row.get("useful_tokens"),
            "badput_total_s": sum(float(v or 0) for k, v in row.items() if k.startswith("badput_")),
            **_load_columns(row, samples),
            "fallback": row.get("fallback_reason") or ("yes" if row.get("fallback") else "no"),
        }
        try:
            summary = compare.summarize(sub, row, run_dir / compare.REFERENCE)
            d["bit_identical"] = summary.bit_identical
            d["useful_steps"] = summary.report.steps  # the badput-based goodput's useful steps
            d.update({f"part_{k}_s": v for k, v in fault_badput_parts(str(sub)).items()})
        except Exception as exc:  # noqa: BLE001 - a run without events keeps its row, without a breakdown
            print(f"warning: {sub}: no comparison ({exc})")
            d["bit_identical"] = None
        if sub.name == compare.REFERENCE:
            d["strategy"], d["age"] = "reference", None
        d.update(_heal_columns(sub))
        rows.append(d)
    return rows


def overhead_args(plan: Plan, scratch: Path, every: int, run_dir: Path) -> list[str]:
    return [
        "experiment=smoke",
        *common(plan, scratch),
        f"train.steps={plan.overhead_steps}",
        "checkpoint=none",
        f"strategy={UNDER_TEST}",
        f"strategy.snapshot.every={every}",
        "fault=none",
        f"hydra.run.dir={run_dir}",
    ]


def measure_overhead(plan: Plan, scratch: Path, collect_only: bool = False) -> list[dict[str, Any]]:
    """Fault-free accelpact runs with snapshots off and on, alternated (off, on, off, on, ...)."""
    from harness.app.config import compose, load_catalogue, to_run_config
    from harness.events import Snapshots, load_events, of_type
    from harness.machine import probe
    from harness.parent.memory_plan import plan as memory_plan

    out = []
    samples = read_samples(scratch / LOAD_FILE)
    for pair in range(plan.overhead_pairs):
        for every in (0, 1):
            run_dir = scratch / "overhead" / f"every{every}_{pair}"
            args = overhead_args(plan, scratch, every, run_dir)
            if not collect_only:
                subprocess.run([sys.executable, "-m", "harness", *args], cwd=_ROOT, check=False)
            if not (run_dir / "summary.json").exists():
                continue
            row = json.loads((run_dir / "summary.json").read_text()).get("row", {})
            snaps = of_type(load_events(run_dir), Snapshots)
            run_cfg = to_run_config(compose(args[:-1]))
            planned = memory_plan(run_cfg, probe(with_gpus=False), load_catalogue().counts(run_cfg.model))
            out.append(
                {
                    "snapshots": "on" if every else "off",
                    "pair": pair,
                    "status": row.get("status"),
                    "step_median_s": row.get("step_time_median_s"),
                    "train_s": row.get("train_s"),
                    "tokens_per_s": row.get("tokens_per_s"),
                    **_load_columns(row, samples),
                    "wait_s_per_rank": (sum(s.wait_s for s in snaps) / len(snaps)) if snaps else 0.0,
                    "slot_bytes": max((s.slot_bytes for s in snaps), default=0),
                    "own_shm_bytes": max((s.own_shm_bytes for s in snaps), default=0),
                    "replica_shm_bytes": max((s.replica_shm_bytes for s in snaps), default=0),
                    "planned_shm_bytes": planned.snapshot_per_rank,
                    "push_mb_s": max((float(s.replication.get("push_mb_s") or 0) for s in snaps), default=0.0),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = _driver.parser(__doc__, NAME, "age 5 only, 24 steps, one overhead pair, written to a temp dir")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma list of faults (default kill,host_loss)")
    ap.add_argument("--trials", type=int, default=None, help="interleaved rounds per fault (default 3; --quick 1)")
    ap.add_argument("--scratch", default=None, help="where the runs go (default: a temp dir, deleted unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch run directories")
    ap.add_argument("--rederive", action="store_true", help="rebuild table.md and plots from OUT/data.csv")
    ap.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: rebuild data.csv, overhead.csv, table.md and plots from the runs in --scratch",
    )
    args = ap.parse_args(argv)
    if args.rederive:
        out = _driver.output_dir(args, NAME, rederive=True)
        prov = load_provenance(out)
        write_outputs(
            out,
            read_rows(out / "data.csv"),
            read_rows(out / "overhead.csv"),
            float(prov.extra.get("runtime_s", math.nan)),
        )
        return 0
    plan = QUICK if args.quick else FULL
    if args.trials is not None:
        import dataclasses

        plan = dataclasses.replace(plan, trials=args.trials)
    faults = tuple(f for f in args.faults.split(",") if f)
    if args.collect:
        if not args.scratch:
            print("error: --collect reads the runs of --scratch DIR", file=sys.stderr)
            return 2
        out, scratch = _driver.output_dir(args, NAME, rederive=True), Path(args.scratch)
        data = [row for f in faults if (scratch / f).is_dir() for row in collect_fault(f, scratch / f, plan)]
        prov = load_provenance(out)
        write_outputs(
            out, data, measure_overhead(plan, scratch, collect_only=True), float(prov.extra.get("runtime_s", math.nan))
        )
        return 0
    from harness.faults.netns import namespaces_available

    ok, why = namespaces_available()
    if not ok:
        print(f"error: process_loss runs two simulated hosts in network namespaces: {why}", file=sys.stderr)
        return 2
    out = _driver.output_dir(args, NAME)
    scratch = _driver.scratch_dir(args, NAME)
    print(f"{NAME}: faults {faults}, {plan}; runs in {scratch}, results in {out}", flush=True)
    timing = _driver.Timing()
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
            "hosts": 2,
            "faults": ",".join(faults),
            "fault_rank": 1,
            "phase": "backward_reduce_scatter",
            "trials": plan.trials,
        },
    )
    try:
        with LoadSampler(scratch / LOAD_FILE):
            data = [row for fault in faults for row in measure_fault(plan, fault, scratch)]
        with LoadSampler(scratch / LOAD_FILE):
            measure_overhead(plan, scratch)
        overhead = measure_overhead(plan, scratch, collect_only=True)  # now with the load while each ran
        runtime = timing.elapsed_s
        _driver.record_runtime(out, runtime)
        _driver.add_end_load(out)
        for fault in faults:
            keep_verdict(fault, scratch / fault, out)
        write_outputs(out, data, overhead, runtime)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    failed = [f"{r['fault']}/{r['run']}" for r in data if r.get("status") not in (None, "ok", "not supported")]
    print(f"wrote {out}/ in {runtime / 60:.1f} min" + (f"; FAILED runs: {failed}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
