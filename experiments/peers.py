"""AccelPact against the tools a user would pick today (torchft, GEMINI through lm-resiliency, NVRx checkpoint
restoration, cold restart), on the same faults and the same sharding (HSDP 2x2 at world 4), with trials and
intervals.

    python -m experiments.peers              # experiment=peers: 2 faults x 2 ages x 5 strategies, 5 trials
    python -m experiments.peers --trials 3   # fewer trials
    python -m experiments.peers --quick      # age 5, socket_reset only, 12 steps, 2 trials, into a temp dir
    python -m experiments.peers --host-loss  # the host_loss column: every rank of a host lost (root), into results/peers_host_loss/

Runs the harness's ``experiment=peers`` (a Hydra multirun with the trials sweeper: each round runs the
fault-free reference and every (strategy, fault, age) once, in a rotated order; conf/experiment/peers.yaml)
into a scratch directory, then copies the comparison's verdict (per cell: the measured whole-run gain of
AccelPact with its heal, ``accelpact_heal``, with its interval over trials, the verdict, the badput-based
diagnostic, the load) into results/peers/, with its plots redrawn under a provenance footer. table.md also
lists, per strategy, what the runs could not make equal (``StrategySpec.unequal``).

GEMINI's rows need lm-resiliency, the ``gemini`` extra (``pip install -e '.[gemini]'``; docs/peers.md says
why ``make setup`` leaves it out). A strategy the harness refuses here (that one without its extra, for
example) is left out of the sweep, and table.md says why in the harness's own words; it never fails the
other rows.

Writes results/peers/: table.md, table.csv (one row per cell), runs.csv (one row per run and trial),
goodput_vs_age.png, badput_by_part.png, provenance.json (+ .md).

``--host-loss`` runs the matrix's third fault apart, into results/peers_host_loss/: ``cluster=local_hosts``
(two hosts, each in its own network namespace, so it needs root) and ``fault=host_loss``, which kills every
rank of one host and deletes its shared memory. It is a sweep of its own because the other two faults run on
``cluster=local_cpu``, which has no host to lose.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import _driver
from experiments.provenance import footer_text, load_provenance, write_provenance

NAME = "peers"
_ROOT = Path(__file__).resolve().parent.parent
QUICK: tuple[str, ...] = ("fault=socket_reset", "fault.at_age=5", "train.steps=12", "checkpoint.interval=6")
HOST_LOSS: tuple[str, ...] = ("cluster=local_hosts", "fault=host_loss")
COPIED: tuple[str, ...] = ("table.md", "table.csv", "runs.csv")


def swept_strategies() -> list[str]:
    """The strategies conf/experiment/peers.yaml sweeps (its row selection lives there, once)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(_ROOT / "conf" / "experiment" / "peers.yaml")
    return [s.strip() for s in str(conf.hydra.sweeper.params.strategy).split(",")]


def refused(strategies: Sequence[str], quick: bool, extra: Sequence[str] = ()) -> dict[str, str]:
    """The strategies the harness refuses in this environment (``check_runnable``), each with the first
    line of its reason: GEMINI without its extra, for example. They get a line in table.md, not a run.
    ``extra``: more overrides of the sweep's base config."""
    from harness.app.capabilities import check_runnable
    from harness.app.config import compose, to_run_config
    from harness.app.validate import ConfigError

    out = {}
    for strategy in strategies:
        try:
            check_runnable(
                to_run_config(
                    compose(
                        [
                            "experiment=peers",
                            f"strategy={strategy}",
                            "fault.at_age=5",
                            *(QUICK if quick else ()),
                            *extra,
                        ]
                    )
                )
            )
        except ConfigError as exc:
            out[strategy] = str(exc).splitlines()[0]
    return out


def sweep_overrides(
    strategies: Sequence[str], trials: int, sweep: Path, quick: bool, extra: Sequence[str] = ()
) -> list[str]:
    return [
        "experiment=peers",
        f"strategy={','.join(strategies)}",
        f"compare.trials={trials}",
        "progress=false",
        f"hydra.sweep.dir={sweep}",
        f"index_path={sweep.parent / 'index.csv'}",
        *(QUICK if quick else ()),
        *extra,
    ]


def unequal_lines(strategies: Sequence[str]) -> list[str]:
    """table.md's list, per swept strategy, of what the runs could not make equal (each strategy's registry
    entry says it: ``StrategySpec.unequal``). Equal for every strategy: the 2x2 mesh, model, data, steps,
    checkpoint cadence, fault, each strategy's own default heartbeat and timeouts, a fresh interpreter for
    every process that replaces a lost one, and a first launch forked from a preloaded template."""
    from harness import strategies as registry

    lines = [
        "**What differs that these runs could not equalise.** Equal for every strategy: HSDP 2x2 (2 replicas x "
        "2 FSDP shards; torchft's replica groups are the replicate dimension), model, data, steps, checkpoint "
        "cadence, the fault, each strategy's own default heartbeat and timeouts (torchft: 5000 ms, Manager 60 s), "
        "every replacement a fresh interpreter (`strategy.replacement_start=spawn`), and every run's first launch "
        "forked from a preloaded template (before its first step, so in no goodput).",
        "",
    ]
    for name in strategies:
        spec = registry.get(name)
        if spec.unequal:
            lines.append(f"- `{name}` ({spec.label}): " + "; ".join(spec.unequal) + ".")
    return [*lines, ""]


PACE_TOLERANCE = 0.10  # a strategy whose productive steps ran this much faster or slower than the reference's


def pace_caveat(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Lines for table.md when a strategy's own productive steps ran at another pace than the reference's
    (``step_drift`` off 1 by more than ``PACE_TOLERANCE``) and the two gains disagree: the badput-based gain
    charges every run at the reference's pace, so it neither credits a faster step nor charges a slower one;
    the measured whole-run gain does both. Empty when no cell is like that."""
    odd = [
        c
        for c in cells
        if c.get("age") is not None
        and isinstance(c.get("step_drift"), (int, float))
        and abs(c["step_drift"] - 1) > PACE_TOLERANCE
        and c.get("verdict") != c.get("verdict_bp")
    ]
    if not odd:
        return []
    rows = "; ".join(
        f"{c['strategy']} {c.get('fault')} age {int(c['age'])}: step_drift {c['step_drift']:.2f}, measured "
        f"{c.get('gain_ci')} ({c.get('verdict')}), badput-based {c.get('gain_bp_ci')} "
        f"({c.get('verdict_bp')})"
        for c in odd
    )
    return [
        "**Where the two gains disagree.** These cells' productive steps ran at another pace than the "
        "reference's. The verdict is the measured whole-run gain, which keeps a strategy's own faster or slower "
        "step; the badput-based diagnostic counts every run's useful steps at the reference's pace and so hides "
        f"it. {rows}.",
        "",
    ]


def pace_reasons(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Lines for table.md naming, per strategy, the cells whose productive steps ran off the reference's pace
    beyond ``PACE_TOLERANCE`` over their whole ``step_drift`` interval, and why (``StrategySpec.pace``; "not
    explained by these runs" where the registry does not know). Empty when no cell is like that."""
    from harness import strategies as registry

    off: dict[str, list[str]] = {}
    for c in cells:
        lo, hi = c.get("step_drift_lo"), c.get("step_drift_hi")
        if c.get("age") is None or not all(isinstance(v, (int, float)) and not math.isnan(v) for v in (lo, hi)):
            continue
        if lo > 1 + PACE_TOLERANCE or hi < 1 - PACE_TOLERANCE:
            off.setdefault(c["strategy"], []).append(f"{c.get('fault')} age {int(c['age'])}: {c.get('step_drift_ci')}")
    if not off:
        return []
    lines = [
        f"**Why the paces differ.** Cells whose productive steps ran outside {1 - PACE_TOLERANCE:.1f}-"
        f"{1 + PACE_TOLERANCE:.1f}x the reference's over their whole step_drift interval, and why:",
        "",
    ]
    for name, where in off.items():
        why = registry.get(name).pace if name in registry.names() else ""
        lines.append(f"- `{name}` ({'; '.join(where)}): {why or 'not explained by these runs'}.")
    return [*lines, ""]


def write_outputs(
    out: Path,
    sweep: Path,
    missing: dict[str, str],
    runtime_s: float,
    host_loss: bool = False,
    swept: Sequence[str] = (),
) -> None:
    """The comparison's tables and plots (redrawn with the provenance footer), and table.md; ``swept``: the
    strategies that ran (what differs is listed for each; empty: those peers.yaml sweeps)."""
    from harness.report import plots_trials
    from harness.report.compare import PAPER_GAIN
    from harness.report.verdict import read_cells

    for name in COPIED:
        if (sweep / name).exists():
            shutil.copyfile(sweep / name, out / name)
    prov = load_provenance(out)
    cells = read_cells(sweep / "table.csv") if (sweep / "table.csv").exists() else []
    if cells:
        try:
            plots_trials.plot_goodput_vs_age(out, cells, dict(PAPER_GAIN), footer=footer_text(prov))
            plots_trials.plot_badput_by_part(out, cells, footer=footer_text(prov))
        except Exception as exc:  # noqa: BLE001 - a plot must never cost the table
            print(f"warning: the plots failed: {type(exc).__name__}: {exc}")
    verdict = (
        (sweep / "table.md").read_text().split("\n", 1)[-1]
        if (sweep / "table.md").exists()
        else "The comparison wrote no table: see the run's output.\n"
    )
    what = (
        "4 gloo ranks as HSDP 2x2 on 2 hosts, each host its own network namespace (`cluster=local_hosts`), a "
        "sync DCP checkpoint every 20 steps, the host of rank 1 lost (every rank on it SIGKILLed, its shared "
        "memory deleted: `fault=host_loss`)"
        if host_loss
        else "4 local gloo ranks as HSDP 2x2 (`cluster.replicate=2`), a sync DCP checkpoint every 20 steps, a socket "
        "reset or a SIGKILL of rank 1 (backward reduce-scatter)"
    )
    lines = [
        "# AccelPact against the peers on HSDP 2x2: torchft, GEMINI, NVRx, cold restart"
        + (": a lost host" if host_loss else ""),
        "",
        f"mistral_tiny (2 layers, seq 64 x batch 1), {what}, when the newest checkpoint is 5 or 18 steps old; "
        "each trial runs the fault-free reference and every cell once, in a rotated order (`experiment=peers`).",
        "",
    ]
    if missing:
        lines += ["Not run here:", *[f"- `{s}`: {why}" for s, why in missing.items()], ""]
    lines += pace_caveat(cells)
    lines += pace_reasons(cells)
    lines += unequal_lines(swept or swept_strategies())
    lines += [verdict.strip(), "", *_driver.closing_lines(runtime_s, prov)]
    (out / "table.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = _driver.parser(__doc__, NAME, "age 5, socket_reset only, 12 steps, 2 trials, written to a temp dir")
    ap.add_argument("--trials", type=int, default=None, help="interleaved rounds (default 5; --quick 2)")
    ap.add_argument("--scratch", default=None, help="where the runs go (default: a temp dir, deleted unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch run directories")
    ap.add_argument(
        "--host-loss",
        action="store_true",
        help="the host_loss column (cluster=local_hosts, root), into results/peers_host_loss/",
    )
    args = ap.parse_args(argv)
    extra = HOST_LOSS if args.host_loss else ()
    trials = args.trials or (2 if args.quick else 5)
    if trials < 1:
        print(f"error: --trials must be 1 or more; got {trials}", file=sys.stderr)
        return 2
    wanted = swept_strategies()
    missing = refused(wanted, args.quick, extra)
    runnable = [s for s in wanted if s not in missing]
    for s, why in missing.items():
        print(f"note: no {s} rows: {why}", flush=True)
    out = _driver.output_dir(args, f"{NAME}_host_loss" if args.host_loss else NAME)
    scratch = _driver.scratch_dir(args, NAME)
    sweep = scratch / "sweep"
    write_provenance(
        out,
        _driver.command(argv, NAME),
        {
            "trials": trials,
            "strategies": ",".join(runnable),
            "not_run": ",".join(missing),
            "quick": args.quick,
            "faults": "host_loss" if args.host_loss else "socket_reset,kill",
        },
    )
    timing = _driver.Timing()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "harness", *sweep_overrides(runnable, trials, sweep, args.quick, extra)], cwd=_ROOT
        )
        runtime = timing.elapsed_s
        _driver.record_runtime(out, runtime)
        _driver.add_end_load(out)
        write_outputs(out, sweep, missing, runtime, host_loss=args.host_loss, swept=runnable)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out}/ in {runtime / 60:.1f} min (the comparison exited {done.returncode})")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
