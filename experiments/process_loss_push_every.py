"""``snapshot.push_every=k`` with trials: what a buddy push every k-th step costs, and what a host loss replays.

Two parts, both interleaved over the same trials (this host is shared and its load moves, so every k is
measured beside the others, never in a block of its own):

1. **Cost.** One pair of real gloo FSDP2 ranks (mistral_tiny, each rank its own simulated host) cycles
   blocks of steps under one guard: snapshots off, snapshots without pushes, and snapshots with a buddy
   push every k-th step for each k. A trial is one such cycle; per trial and k the overhead is the block's
   mean step over the neighbouring "off" block's, minus 1 (the pair measured minutes apart would drift
   by more than the effect). The ranks run ``benchmarks/bench_push_every.py``'s rank function.
2. **Host loss.** Per trial and k, ``python -m accelpact.run`` runs ``examples/train_heal.py --replicas
   --push-every k --lose-host --confirm-push`` with two agents (one rank each, each node its own snapshot
   root): rank 1 deletes its node's shared memory of the job and SIGKILLs itself in step ``--kill-at``, so
   its replacement can only heal from the replica its buddy holds. Reported: the survivor's replayed
   steps against the bound of docs/snapshots.md (with confirmed pushes, ``c - s`` for a survivor that
   committed c past the newest pushed step s, at most k), its death-to-resumed time, the bytes read from
   disk and bit-identity with a fault-free run of the same script.

Each cell is the median over trials with its distribution-free order-statistic interval for the median
(harness.report.intervals; the table says the coverage it has at the trials run).

    python -m experiments.process_loss_push_every --trials 3

Writes ``results/process_loss/push_every.md`` and ``push_every.json`` with the command, git sha and machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["bound", "main"]

ROOT = Path(__file__).resolve().parents[1]
RUNNER = "benchmarks.bench_push_every:run_rank"


def bound(kill_at: int, k: int) -> tuple[int, set[int]]:
    """(newest pushed step s <= c, the replays the bound allows) for a host lost in step ``kill_at``.

    The survivor committed c = kill_at - 1. With confirmed pushes (accelpact.snapshot.push_rule) the
    replica of s had landed when c > s, so the heal resumes after s and replays exactly c - s steps; when
    c == s the replica of s may still be on its way: 0 steps if it had landed, k (back to the previous
    pushed step) if not. Never more than ``replay_bound(1, k)``."""
    from accelpact.snapshot.push_rule import pushed_steps, replay_bound

    c = kill_at - 1
    s = max(pushed_steps(range(c + 1), push_every=k))
    allowed = {c - s} if c > s else {0, k}
    assert max(allowed) <= replay_bound(push_every=k)
    return s, allowed


def cost_trials(
    scratch: Path,
    ks: list[int],
    steps: int,
    trials: int,
    model: dict | None = None,
    cadences: Sequence[tuple[int, int]] = (),
    budget: float | None = None,
) -> dict[str, Any]:
    """Part 1: the per-trial overheads of every configuration against its neighbouring "off" block.
    ``model``: the bench's model fields (default ``benchmarks.bench_push_every.MODEL``: mistral_tiny, seq 64 x 2).
    ``cadences``: (every, push_every) pairs measured as whole cadences too (configs ``e{e}k{k}``).
    ``budget``: a tax budget (``SnapshotConfig.max_tax``) measured too (config ``budget``, the heal's default)."""
    from accelpact.testing.session import run_session
    from benchmarks.bench_push_every import MODEL

    model = MODEL if model is None else model
    root = Path(tempfile.mkdtemp(prefix="accelpact-pe-cost-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        sc = {
            "name": "push_every",
            "model": model,
            "steps": steps,
            "rounds": trials,
            "root": str(root),
            "ks": ks,
            "confirm": True,
            "cadences": [list(c) for c in cadences],
            "budget": budget,
        }
        total = steps * (2 + len(ks) + len(cadences) + (1 if budget else 0)) * (trials + 1) + (64 if budget else 0)
        s = run_session(
            scratch / "cost",
            RUNNER,
            [{**sc, "steps_total": total}],
            world_size=2,
            barrier=True,
            pg_timeout_s=900,
            control_deadline_s=900,
            timeout_s=300 + 10 * total,
            pythonpath=[ROOT],
        )
        res = s.job("push_every")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rank0 = res[0]
    out: dict[str, Any] = {
        "wall_s": s.wall_s,
        "off_step_s": rank0["block_means"]["off"],
        "configs": {},
        "state_bytes": rank0.get("state_bytes"),
        "off_cpu_s": rank0["cpu_means"]["off"],
    }
    out["budget"] = rank0.get("budget")
    for mode in ["snap", *[f"k{k}" for k in ks], *[f"e{e}k{k}" for e, k in cadences], *(["budget"] if budget else [])]:
        out["configs"][mode] = {
            "step_s": rank0["block_means"][mode],
            "overhead": [b / a - 1 for a, b in zip(rank0["block_means"]["off"], rank0["block_means"][mode])],
            "cpu_overhead": [b / a - 1 for a, b in zip(rank0["cpu_means"]["off"], rank0["cpu_means"][mode])],
            "blocked_max_s": max(rank0["waits"][mode], default=0.0),
            "pushes": rank0["pushes"][mode],
        }
    return out


def heal_trial(scratch: Path, ref: Path, name: str, port: int, k: int, steps: int, kill_at: int) -> dict[str, Any]:
    """Part 2, one run: a host loss at ``kill_at`` with pushes every ``k`` steps, and its heal's figures."""
    from benchmarks.bench_push_every import bit_identical, launch_pair, results

    run = scratch / name
    launch_pair(
        run,
        port,
        [
            "--steps",
            str(steps),
            "--replicas",
            "--push-every",
            str(k),
            "--lose-host",
            "--confirm-push",
            "--kill-at",
            str(kill_at),
            "--kill-rank",
            "1",
        ],
        300 + 30 * steps,
    )
    [survivor] = results(run, 0)
    heals = [h for h in survivor["heals"] if h["role"] == "survivor"]
    replacement = results(run, 1)[-1]
    if len(heals) != 1 or replacement["replacement"] is None:
        raise RuntimeError(
            f"{name}: expected one heal by a replacement, got survivor heals {heals}, rank 1's result {replacement}"
        )
    [heal] = heals
    return {
        "replayed": heal["replayed"],
        "resume_step": heal["resume_step"],
        "total_s": heal["total_s"],
        "source": replacement["heals"][0]["source"],
        "restart": replacement["restart"],
        "bytes_read_from_disk": heal["bytes_read_from_disk"] + replacement["heals"][0]["bytes_read_from_disk"],
        "bit_identical": bit_identical(ref, run),
    }


def table(cost: dict[str, Any], heals: dict[int, list[dict[str, Any]]], ks: list[int], kill_at: int) -> list[str]:
    from harness.report.intervals import order_statistic

    lines = [
        "| configuration | step time, mean per block (s) | overhead vs snapshots off (%) | CPU per step vs off (%) | "
        "before_update blocked, max (ms) | pushes (rank 0) | host loss: replayed steps (each trial) | "
        "bound (steps) | survivor: death to resumed (s) | bytes read from disk | bit-identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(xs: Sequence[float], spec: str) -> str:
        return order_statistic(xs).text(spec)

    off = cost["off_step_s"]
    lines.append(f"| snapshots off | {cell(off, '.3f')} | - | - | - | - | - | - | - | - | - |")
    for mode, c in cost["configs"].items():
        what = "snapshots, no push" if mode == "snap" else f"snapshots + push_every={mode[1:]}"
        heal = "| - | - | - | - | - |"
        if mode.startswith("k"):
            k = int(mode[1:])
            runs = heals.get(k, [])
            _, allowed = bound(kill_at, k)
            heal = (
                f"| {', '.join(str(r['replayed']) for r in runs)} | {' or '.join(map(str, sorted(allowed)))} "
                f"(at most {k}) | "
                f"{cell([r['total_s'] for r in runs], '.2f')} | {max((r['bytes_read_from_disk'] for r in runs), default='-')} | "
                f"{sum(r['bit_identical'] for r in runs)}/{len(runs)} |"
            )
        lines.append(
            f"| {what} | {cell(c['step_s'], '.3f')} | {cell([x * 100 for x in c['overhead']], '+.1f')} | "
            f"{cell([x * 100 for x in c['cpu_overhead']], '+.1f')} | {c['blocked_max_s'] * 1e3:.1f} | "
            f"{c['pushes']} {heal}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.provenance import REPO_ROOT, collect, current_command, provenance_markdown

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4], help="push_every values")
    ap.add_argument("--steps", type=int, default=8, help="steps per cost block (a multiple of every k)")
    ap.add_argument("--heal-steps", type=int, default=12, help="steps of each host-loss run")
    ap.add_argument("--kill-at", type=int, default=8, help="rank 1's host is lost in this step")
    ap.add_argument("--results", type=Path, default=REPO_ROOT / "results" / "process_loss")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, states)")
    args = ap.parse_args(argv)
    if args.trials < 1 or any(k < 1 for k in args.k):
        ap.error(f"--trials {args.trials} and every --k {args.k} must be at least 1")
    if any(args.steps % k for k in args.k):
        ap.error(
            f"--steps {args.steps} is not a multiple of every --k {args.k}: blocks would push unequal shares; "
            f"try --steps {math.lcm(*args.k)}"
        )
    if not 0 < args.kill_at < args.heal_steps:
        ap.error(f"--kill-at {args.kill_at} must lie inside the run's --heal-steps {args.heal_steps}")
    prov = collect(
        current_command(argv, "experiments.process_loss_push_every"),
        {
            "trials": args.trials,
            "k": args.k,
            "steps_per_block": args.steps,
            "heal_steps": args.heal_steps,
            "kill_at": args.kill_at,
            "confirm_push": True,
        },
    )
    scratch = Path(tempfile.mkdtemp(prefix="accelpact-pe-"))
    loads: list[float] = []
    t0 = time.monotonic()
    try:
        cost = cost_trials(scratch, args.k, args.steps, args.trials)
        loads.append(os.getloadavg()[0])
        print(
            f"cost: {cost['wall_s']:.0f} s; overheads { ({m: [round(x * 100, 1) for x in c['overhead']] for m, c in cost['configs'].items()}) }",
            flush=True,
        )
        from benchmarks.bench_push_every import launch_pair

        port = random.randint(20000, 29000)
        launch_pair(scratch / "ref", port, ["--steps", str(args.heal_steps)], 300 + 30 * args.heal_steps)
        heals: dict[int, list[dict[str, Any]]] = {k: [] for k in args.k}
        for t in range(args.trials):
            for k in args.k:
                port += 1
                heals[k].append(
                    heal_trial(scratch, scratch / "ref", f"k{k}_t{t}", port, k, args.heal_steps, args.kill_at)
                )
                loads.append(os.getloadavg()[0])
                print(f"trial {t} k={k}: {heals[k][-1]}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    runtime = time.monotonic() - t0
    c = args.kill_at - 1
    lines = [
        "# `snapshot.push_every=k`: the cost of buddy pushes, and the steps a host loss replays",
        "",
        f"mistral_tiny (seq 64 x batch 2) on 2 gloo FSDP2 ranks, each its own simulated host, pushes confirmed by "
        f"the buddy (`Replication(confirm=True)`). {args.trials} trials, every configuration interleaved with the "
        "others in each; each cell is the median over trials with its order-statistic interval for the median (coverage "
        f"{100 * (1 - 2 * 0.5 ** len(cost['off_step_s'])):.1f}% at n={len(cost['off_step_s'])}).",
        "",
        f"- **Cost:** blocks of {args.steps} steps cycled off / snapshots / push_every=k under one guard; a "
        "trial's overhead is its block's mean step over the same cycle's \"off\" block's, minus 1. CPU per "
        "step counts every thread of rank 0's process (the copy, its CRC-32, the push and the ward's incoming "
        "replica).",
        f"- **Host loss:** `examples/train_heal.py --replicas --push-every k --lose-host --confirm-push` under "
        f"`python -m accelpact.run` (2 agents x 1 rank, {args.heal_steps} steps): rank 1 loses its node's shared "
        f"memory and is SIGKILLed in step {args.kill_at}; the survivor had committed step {c}. The bound "
        "(docs/snapshots.md): c - s steps, s the newest pushed step <= c, never more than k.",
        "",
        *table(cost, heals, args.k, args.kill_at),
        "",
        f"1-min load average after each part and run: min {min(loads):.1f}, max {max(loads):.1f} (a 2-core host "
        f"shared with other jobs). Run time: {runtime / 60:.1f} min.",
        "",
        provenance_markdown(prov),
    ]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "push_every.md").write_text("\n".join(lines) + "\n")
    (args.results / "push_every.json").write_text(
        json.dumps({"provenance": prov.to_dict(), "cost": cost, "heals": heals, "loads": loads}, indent=1, default=str)
    )
    print("\n".join(lines))
    ok = all(
        r["bit_identical"] and r["replayed"] in bound(args.kill_at, k)[1] and r["bytes_read_from_disk"] == 0
        for k, runs in heals.items()
        for r in runs
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
