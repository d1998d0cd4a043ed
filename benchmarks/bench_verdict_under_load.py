"""The default comparison's verdict with and without two CPU-bound busy loops beside it.

Not a test. Runs the default comparison (``python -m harness``: the fault-free reference, AccelPact, cold
restart and NVRx checkpoint restoration at checkpoint ages 5 and 18, ``compare.trials`` interleaved
rounds) twice, one after the other: once on the machine as it is ("quiet"), then with ``--busy`` (2)
Python busy loops (``while True: pass``) running beside it, which this script starts before that
comparison and stops after it, whatever happens. What it shows: whether the verdict (AccelPact's measured
whole-run gain, its interval over trials, the minimum effect) survives a busy host.

Acceptance: every (baseline, age) cell's verdict under the busy loops is the verdict of the quiet run.
The script says which cells agree and exits 1 if any does not (or if a comparison failed).

    .venv/bin/python benchmarks/bench_verdict_under_load.py                  # default comparison's size
    .venv/bin/python benchmarks/bench_verdict_under_load.py --quick          # smoke: tiny model, age 2, 2 trials
    .venv/bin/python benchmarks/bench_verdict_under_load.py --busy-only ...  # skip the quiet run

Writes ``--out`` (default results/verdict_under_load/): table.md (quiet and busy side by side, the load
each ran under), quiet/ and busy/ (each comparison's table.md, table.csv, runs.csv and plots, stamped
with the command, git sha and machine), provenance.json (+ .md). The runs themselves go to a scratch
directory (deleted unless --keep).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAME = "verdict_under_load"
# --quick: the same comparison on a 2-layer model, short sequences, 10 steps, one age (2: a checkpoint
# every 4 steps, the fault in step 6). Narrow it further with overrides, e.g. strategy=accelpact,cold_restart.
QUICK = [
    "model.num_layers=2",
    "model.seq_len=32",
    "model.batch_size=2",
    "train.steps=10",
    "checkpoint.interval=4",
    "fault.at_age=2",
]


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` CPU-bound Python processes (each keeps one core busy until killed)."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def stop(procs: Sequence[subprocess.Popen]) -> list[float]:
    """Kill the busy loops (by their own pids); returns the CPU seconds each used (from /proc, NaN if gone)."""
    used = []
    for p in procs:
        try:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            used.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, IndexError, ValueError):
            used.append(math.nan)
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()
    return used


def comparison(args: argparse.Namespace, sweep_dir: Path) -> tuple[int, float]:
    """Run the default comparison into ``sweep_dir``; (exit code, minutes)."""
    cmd = [
        sys.executable,
        "-m",
        "harness",
        f"hydra.sweep.dir={sweep_dir}",
        f"index_path={sweep_dir.parent / 'index.csv'}",
        "progress=false",
        f"compare.trials={args.trials}",
        *(QUICK if args.quick else []),
        *args.overrides,
    ]
    if args.steps:
        cmd.append(f"train.steps={args.steps}")
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode, (time.time() - t0) / 60


def _cells(table_csv: Path) -> list[dict[str, Any]]:
    from harness.report.verdict import read_cells

    return read_cells(table_csv)


def verdicts(cells: Sequence[dict[str, Any]]) -> dict[tuple[str, int], tuple[str, str]]:
    """Per baseline cell (strategy, age): (its verdict, the measured gain's interval text)."""
    from harness import strategies

    ref = strategies.reference().label
    return {
        (str(c["strategy"]), int(c["age"])): (str(c.get("verdict")), str(c.get("gain_ci")))
        for c in cells
        if c.get("age") is not None and c["strategy"] != ref and c.get("strategy") != c.get("ours")
    }


def agreement(
    quiet: dict[tuple[str, int], tuple[str, str]], busy: dict[tuple[str, int], tuple[str, str]]
) -> list[tuple[str, int, bool, str]]:
    """Per cell of the quiet run: (strategy, age, busy's verdict is quiet's, both verdicts as text)."""
    return [
        (
            s,
            a,
            busy.get((s, a), ("missing", ""))[0] == v,
            f"quiet {v} {g}; busy {busy.get((s, a), ('missing', '-'))[0]} {busy.get((s, a), ('', '-'))[1]}",
        )
        for (s, a), (v, g) in quiet.items()
    ]


def _copy_outputs(src: Path, dst: Path, footer: str) -> None:
    """The comparison's tables, and its plots drawn again with the provenance footer."""
    from harness.report import plots_trials

    dst.mkdir(parents=True, exist_ok=True)
    for name in ("table.md", "table.csv", "runs.csv"):
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)
    if (src / "table.csv").exists():
        plots_trials.plot_goodput_vs_age(dst, _cells(src / "table.csv"), _paper(), footer=footer)
        plots_trials.plot_badput_by_part(dst, _cells(src / "table.csv"), footer=footer)


def _paper() -> dict[tuple[str, int], float]:
    from harness.report.compare import PAPER_GAIN  # wherever the paper's figures live, compare imports them

    return dict(PAPER_GAIN)


def report(out: Path, results: dict[str, dict[str, Any]], prov_md: str) -> str:
    """table.md: per (strategy, age), the gain and verdict of each comparison side by side."""
    lines = [
        f"# The default comparison's verdict, quiet and beside {results.get('busy', {}).get('busy', 0)} busy loops",
        "",
        "| strategy | age | "
        + " | ".join(
            f"{k}: measured gain [interval] (n) | {k}: verdict | {k}: badput-based gain (diagnostic)" for k in results
        )
        + " |",
        "|---|---|" + "---|---|---|" * len(results),
    ]
    keys = []
    for res in results.values():
        for c in res["cells"]:
            if c.get("age") is not None and (c["strategy"], c["age"]) not in keys:
                keys.append((c["strategy"], c["age"]))
    for key in keys:
        row = [str(key[0]), str(int(key[1]))]
        for res in results.values():
            c = next((c for c in res["cells"] if (c["strategy"], c.get("age")) == key), {})
            row += [str(c.get("gain_ci", "-")), str(c.get("verdict", "-")), str(c.get("gain_bp_ci", "-"))]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for label, res in results.items():
        passed = [
            f"{s} age {a}: {'same verdict' if ok else 'DIFFERENT verdict'} ({text})"
            for s, a, ok, text in res.get("acceptance", [])
        ]
        lines += [
            f"- {label}: {res['minutes']:.1f} min, exit {res['rc']}, busy loops {res['busy']} "
            f"(CPU s each: {', '.join(f'{u:.0f}' for u in res['busy_cpu_s']) or '-'}), runs' load "
            f"(1-min average) median {res['load_median']:.1f}, max {res['load_max']:.1f}; "
            + (("verdicts against the quiet run's: " + "; ".join(passed)) if passed else "")
        ]
    lines += [
        "",
        "measured gain: AccelPact's measured whole-run goodput over the row's, paired by trial, with the "
        "interval and minimum effect each comparison's table.md states (method and true coverage); the "
        "badput-based gain is a diagnostic. Each comparison's own table, every run (runs.csv) and its plots "
        "are in quiet/ and busy/.",
        "",
        prov_md,
    ]
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def _load_stats(runs_csv: Path) -> tuple[float, float]:
    import pandas as pd

    if not runs_csv.exists():
        return math.nan, math.nan
    frame = pd.read_csv(runs_csv)
    if "load_mean" not in frame:
        return math.nan, math.nan
    return float(frame["load_mean"].median()), float(frame["load_max"].max())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=None, help="compare.trials (default: the experiment's; --quick: 2)")
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: the experiment's)")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound busy loops beside the busy comparison")
    ap.add_argument("--busy-only", action="store_true", help="skip the quiet comparison")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny model, age 2, into a temp dir")
    ap.add_argument("--out", default=None, help=f"default results/{NAME}/ (--quick: a temp dir)")
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the runs' directories")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for both comparisons")
    args = ap.parse_args(argv)
    if args.trials is None:
        args.trials = 2 if args.quick else _default_trials()
    from experiments.provenance import footer_text, load_provenance, provenance_markdown, write_provenance

    out = (
        Path(args.out)
        if args.out
        else (Path(tempfile.mkdtemp(prefix=f"{NAME}_")) if args.quick else ROOT / "results" / NAME)
    )
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix=f"{NAME}_runs_"))
    command = "python benchmarks/bench_verdict_under_load.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_provenance(
        out,
        command,
        {
            "trials": args.trials,
            "busy_loops": args.busy,
            "quick": args.quick,
            "steps": args.steps or "experiment default",
            "overrides": " ".join(args.overrides),
        },
    )
    prov = load_provenance(out)
    results: dict[str, dict[str, Any]] = {}
    try:
        for label, busy in ([] if args.busy_only else [("quiet", 0)]) + [("busy", args.busy)]:
            procs = busy_loops(busy)
            try:
                if busy:
                    time.sleep(5)  # let the loops show in the load average before the comparison starts
                rc, minutes = comparison(args, scratch / label)
            finally:
                used = stop(procs)
            src = scratch / label
            _copy_outputs(src, out / label, footer_text(prov))
            cells = _cells(src / "table.csv") if (src / "table.csv").exists() else []
            load_median, load_max = _load_stats(src / "runs.csv")
            results[label] = {
                "rc": rc,
                "minutes": minutes,
                "busy": busy,
                "busy_cpu_s": used,
                "cells": cells,
                "verdicts": verdicts(cells),
                "load_median": load_median,
                "load_max": load_max,
            }
        if "quiet" in results and "busy" in results:
            results["busy"]["acceptance"] = agreement(results["quiet"]["verdicts"], results["busy"]["verdicts"])
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(report(out, results, provenance_markdown(prov)))
    print(f"wrote {out}/")
    busy = results.get("busy", {})
    ok = (
        busy.get("rc") == 0
        and results.get("quiet", {}).get("rc", 0) == 0
        and busy.get("acceptance")
        and all(a[2] for a in busy["acceptance"])
    )
    return 0 if ok else 1


def _default_trials() -> int:
    from harness.app.config import compose

    return int(compose([]).compare.trials)


if __name__ == "__main__":
    sys.exit(main())
