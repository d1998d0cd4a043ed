"""What torchrun does to the survivors when one worker dies: measured, not a test.

    .venv/bin/python benchmarks/torchrun_rank_death.py [--runs 3] [--nproc 2]

Each run starts ``torchrun --nproc-per-node N`` on a tiny worker (this file with ``--worker``): every
rank joins a gloo group, rank 1 records the time and dies with ``os._exit(1)``, and every other rank
records when torchrun's agent signals it (SIGTERM handler) and exits. Printed per run: the delay from
the death to each survivor's SIGTERM, and torchrun's exit code. This is why an in-memory recovery of a
rank death cannot happen inside one torchrun attempt (see README, "Under torchrun").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def on_term(signum, frame):  # noqa: ARG001 - signal handler signature
        (out / f"term{rank}").write_text(repr(time.time()))
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)  # every survivor has its handler installed and sits in its loop
        (out / "death").write_text(repr(time.time()))
        os._exit(1)
    while True:  # a survivor keeps "training" until the agent stops it
        time.sleep(0.01)


def one_run(nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.time()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(nproc),
                __file__,
                "--worker",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        death = float((out / "death").read_text())
        delays = {r: float((out / f"term{r}").read_text()) - death for r in range(nproc) if (out / f"term{r}").exists()}
        return {
            "torchrun_exit": proc.returncode,
            "sigterm_after_death_s": {str(k): round(v, 3) for k, v in delays.items()},
            "survivors_signalled": len(delays),
            "survivors": nproc - 1,
            "wall_s": round(time.time() - t0, 1),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent
    ).stdout.strip()
    print(f"# torchrun rank death: git {sha}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    delays = []
    for i in range(args.runs):
        res = one_run(args.nproc)
        delays += list(res["sigterm_after_death_s"].values())
        print(json.dumps({"run": i, **res}), flush=True)
    if delays:
        delays.sort()
        print(
            f"survivor SIGTERM after a rank death: median {delays[len(delays) // 2]:.2f} s, "
            f"min {delays[0]:.2f} s, max {delays[-1]:.2f} s over {len(delays)} survivors"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
