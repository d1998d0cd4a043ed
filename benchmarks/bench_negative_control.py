"""Negative control: the comparison must see a real 2 s loss. AccelPact against itself plus 2 s of sleep
in every recovery (examples/negative_control.py, registered through HARNESS_PLUGINS).

Not a test. Runs ``python -m harness`` (the default comparison's setup) with strategies ``accelpact`` and
``accelpact_slow_recovery`` at one checkpoint age, ``--trials`` interleaved rounds each with its own
fault-free reference, and reads the verdict on the control's row: AccelPact's measured whole-run gain over
it, with its interval over trials (coverage stated). Passes (exit 0) when the verdict is "AccelPact better",
i.e. the interval lies wholly above 1 + the minimum effect: the control came out worse, and equality is
excluded.

    .venv/bin/python benchmarks/bench_negative_control.py             # default comparison's size, 5 trials
    .venv/bin/python benchmarks/bench_negative_control.py --quick     # 2-layer model, 10 steps, 5 trials

Writes ``--out`` (default results/negative_control/; --quick: nowhere): table.md (the verdict line, then
the comparison's own table: medians, intervals over trials with their coverage, the load), table.csv and
provenance.json (+ .md: the command, git sha and machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUICK = ["model.num_layers=2", "model.seq_len=32", "model.batch_size=2", "train.steps=10", "checkpoint.interval=4"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--age", type=int, default=None, help="checkpoint age of the fault (default 5; --quick 2)")
    ap.add_argument("--quick", action="store_true", help="2-layer model, 10 steps, age 2")
    ap.add_argument("--keep", default=None, help="keep the sweep in this directory")
    ap.add_argument("--out", default=None, help="default results/negative_control/ (--quick: not written)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else (None if args.quick else ROOT / "results" / "negative_control")
    if args.age is None:
        args.age = 2 if args.quick else 5
    sys.path.insert(0, str(ROOT / "examples"))
    import negative_control

    from harness import strategies

    ours = strategies.under_test().name

    from harness.report.intervals import BETTER

    sweep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="negative_control_"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")]),
        "HARNESS_PLUGINS": "negative_control",
    }
    cmd = [
        sys.executable,
        "-m",
        "harness",
        f"strategy={ours},{negative_control.NAME}",
        f"fault.at_age={args.age}",
        f"compare.trials={args.trials}",
        "progress=false",
        f"hydra.sweep.dir={sweep}",
        f"index_path={sweep / 'index.csv'}",
        *(QUICK if args.quick else []),
    ]
    print("$ HARNESS_PLUGINS=negative_control " + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=env)
    import pandas as pd

    table = sweep / "table.csv"
    if not table.exists():
        print(f"error: the comparison wrote no table (exit {done.returncode}); see {sweep}", file=sys.stderr)
        return 1
    cells = pd.read_csv(table)
    row = cells[cells["strategy"] == negative_control.NAME].iloc[0]
    summary = (
        f"AccelPact's measured whole-run gain over the control: {row['gain_ci']} -> {row['verdict']}; "
        f"badput-based (diagnostic): {row['gain_bp_ci']} -> {row['verdict_bp']}; "
        f"badput {row['badput_s']:.2f} s (control, median) vs "
        f"{cells[cells['strategy'] == ours].iloc[0]['badput_s']:.2f} s (AccelPact)"
    )
    if out is not None:
        _write(out, cmd, sweep, summary, args, negative_control.SLEEP_S, elapsed_s=time.time() - t0)
    print(
        f"\nnegative control ({negative_control.SLEEP_S:g} s of sleep per recovery), {(time.time() - t0) / 60:.1f} min:"
        f"\n  AccelPact's measured whole-run gain over it: {row['gain_ci']} -> {row['verdict']}"
        f"\n  badput-based (diagnostic): {row['gain_bp_ci']} -> {row['verdict_bp']}"
        f"\n  its badput {row['badput_s']:.2f} s (median) vs AccelPact's "
        f"{cells[cells['strategy'] == ours].iloc[0]['badput_s']:.2f} s"
    )
    if not args.keep:
        shutil.rmtree(sweep, ignore_errors=True)
    ok = row["verdict"] == BETTER
    print("PASS: the control is worse, equality excluded" if ok else "FAIL: the comparison did not see the loss")
    return 0 if ok and done.returncode == 0 else 1


def _write(
    out: Path, cmd: Sequence[str], sweep: Path, summary: str, args: argparse.Namespace, sleep_s: float, elapsed_s: float
) -> None:
    """The verdict line and the comparison's table, stamped with the command, git sha and machine."""
    from experiments.provenance import load_provenance, provenance_markdown, write_provenance

    command = "python benchmarks/bench_negative_control.py" + (f" --trials {args.trials}" if args.trials != 3 else "")
    write_provenance(
        out,
        command,
        {
            "trials": args.trials,
            "age": args.age,
            "harness_command": "HARNESS_PLUGINS=negative_control " + " ".join(cmd[1:]),
            "runtime_s": round(elapsed_s, 1),
        },
    )
    shutil.copyfile(sweep / "table.csv", out / "table.csv")
    table = (sweep / "table.md").read_text() if (sweep / "table.md").exists() else ""
    (out / "table.md").write_text(
        f"# Negative control: AccelPact against itself plus {sleep_s:g} s of sleep per recovery\n\n"
        f"{summary}\n\nThe comparison's table ({args.trials} interleaved trials, each with its own fault-free "
        f"reference):\n\n{table}\n{provenance_markdown(load_provenance(out))}"
    )


if __name__ == "__main__":
    sys.exit(main())
