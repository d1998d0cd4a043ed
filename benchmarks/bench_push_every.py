"""Benchmark of ``snapshot.push_every`` (not a test): the cost of buddy pushes, and the steps a host loss replays.

Two parts, each side by side in one run (this host's load from other jobs swings wall time by tens of
percent between neighbouring blocks, so every configuration is measured interleaved with the others):

1. **Step time.** One pair of real gloo ranks (each rank its own simulated host: its own snapshot root)
   trains the FSDP2 Mistral-style decoder under one attached guard and cycles blocks of ``--steps``
   steps: no snapshots ("off"), snapshots without pushes ("snap"), and snapshots with buddy pushes at
   each ``--k`` (``SnapshotConfig(push_every=k)``), ``--rounds`` times after a warm-up cycle. Each
   block's last snapshot and push are flushed and charged to it. ``--steps`` should be a multiple of
   every k, so that each block pushes the same share of its steps. Printed per configuration: median
   and mean step time, the overhead against "off" (median of the per-round pairs too), CPU seconds per
   step of the rank processes (every thread: on a host whose cores are all busy training, extra CPU is
   extra wall time), the pushes made.
2. **Replayed steps after a host loss.** ``python -m accelpact.run`` with two agents on this machine
   (``--nnodes 2``, one rank each, each node its own snapshot root) runs ``examples/train_heal.py
   --replicas --push-every k --lose-host --kill-at X``: rank 1 deletes its node's shared memory of the
   job and SIGKILLs itself in step X, so its replacement can only heal from its buddy's replica. For
   each k (interleaved over ``--heal-rounds``) the survivor's heal event gives the steps replayed; the
   final state is compared tensor by tensor with one fault-free run. The stated bound
   (docs/snapshots.md): at most k steps (with per-step snapshots), or a loud fallback when the lost
   rank's newest pushed snapshot had not reached its buddy (asynchronous pushes); ``--confirm-push``
   runs them with ``Replication(confirm=True)``.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_push_every.py --k 1 2 4 --steps 4 --rounds 3 \\
        --heal-steps 12 --kill-at 9

Snapshots go to fresh directories under /dev/shm (removed at the end).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accelpact.testing.session import load_average, run_session  # noqa: E402

if TYPE_CHECKING:
    from accelpact.testing.rank import RankContext

RUNNER = "benchmarks.bench_push_every:run_rank"
EXAMPLE = ROOT / "examples" / "train_heal.py"
# mistral_tiny at seq 64 x batch 2: the 0.18 s steps at which a push every step measured +11.4 %.
MODEL = {"vocab": 4096, "hidden": 256, "inter": 768, "layers": 4, "heads": 8, "kv_heads": 4, "seq": 64, "batch": 2}


# ---------------------------------------------------------------------------------------------- part 1


def run_rank(sc: dict, ctx: RankContext) -> dict:
    """Cycle blocks off / snap / k=... under one guard; time every step, and the process's CPU per block."""
    from datetime import timedelta

    from accelpact.guard import attach
    from accelpact.snapshot import SnapshotConfig, Snapshotter
    from accelpact.snapshot.replica import Replication
    from experiments.workloads.fsdp_models import batch_for, build, model_config, step_fn_for

    m = model_config(sc["model"])
    model, optimizer, _root, _mid = build("fsdp2", m)
    token = f"bench-{sc['name']}"
    root = Path(sc["root"]) / f"host{ctx.rank}"  # each rank a host: the ward's replicas land on another root
    base = SnapshotConfig(root=str(root), ranks_sharing_root=1)
    snap = Snapshotter(model, optimizer, job_token=token, rank=ctx.rank, world_size=ctx.world_size, config=base)
    rep = Replication(
        ctx.control,
        rank=ctx.rank,
        world_size=ctx.world_size,
        root=root,
        bind_host="127.0.0.1",
        job_token=token,
        confirm=sc["confirm"],
    )
    guard = attach(model, optimizer, ctx.control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=ctx.pg_timeout_s))
    step_fn = step_fn_for(model)
    # "e{e}k{k}": a whole cadence (snapshot.every = e, push_every = k), e.g. the advisor's choice.
    cycle = ["off", "snap", *[f"k{k}" for k in sc["ks"]], *[f"e{e}k{k}" for e, k in sc.get("cadences", [])]]
    budget = _budget(sc, ctx, base, rep)
    # "budget": the heal as a user gets it by default, every=1 push_every=1 thinned by the tax budget
    # (SnapshotConfig.max_tax). Its warm-up and agreement run first, in blocks of their own, unmeasured.
    lead = ["budget"] * -(-(2 * budget.warmup + 8) // sc["steps"]) if budget is not None else []
    cycle += ["budget"] if budget is not None else []
    blocks = lead + cycle + [cycle[i % len(cycle)] for i in range(len(cycle) * sc["rounds"])]
    warm = len(lead) + len(cycle)  # the first cycle: lazy init, the slot files' first touch, the allocator
    times: dict[str, list[float]] = {b: [] for b in cycle}
    block_means: dict[str, list[float]] = {b: [] for b in cycle}
    cpu_means: dict[str, list[float]] = {b: [] for b in cycle}
    waits: dict[str, list[float]] = {b: [] for b in cycle}
    pushes: dict[str, int] = {b: 0 for b in cycle}
    step = 0
    for i, mode in enumerate(blocks):
        guard.snapshots = None if mode == "off" else snap
        snap.on_complete = rep.push if mode.startswith(("k", "e", "budget")) else None
        snap.budget = budget if mode == "budget" else None
        if mode.startswith("k"):
            snap.config = dataclasses.replace(base, push_every=int(mode[1:]))
        elif mode.startswith("e"):
            e, k = mode[1:].split("k")
            snap.config = dataclasses.replace(base, every=int(e), push_every=int(k))
        else:
            snap.config = base
        ctx.barrier(f"{sc['name']}/block{i}")
        t_block, c_block, pushed0 = time.perf_counter(), time.process_time(), rep.pushed + rep.skipped + rep.dropped
        for j in range(sc["steps"]):
            t0 = time.perf_counter()
            guard.step(step_fn, batch_for(step, ctx.rank, m))
            if mode != "off" and j == sc["steps"] - 1:
                snap.flush()  # the block's last snapshot and push are charged to it
                rep.flush(600)
            if i >= warm:
                times[mode].append(time.perf_counter() - t0)
                if mode != "off":
                    waits[mode].append(snap.last_wait_s)
            step += 1
        ctx.barrier(f"{sc['name']}/flushed{i}")  # the ward's last push has arrived too (its CPU is this block's)
        if i >= warm:
            block_means[mode].append((time.perf_counter() - t_block) / sc["steps"])
            cpu_means[mode].append((time.process_time() - c_block) / sc["steps"])
            pushes[mode] += rep.pushed + rep.skipped + rep.dropped - pushed0
    stats = rep.stats()
    snap.close(remove=True)
    rep.close(remove=True)
    guard.close()
    return {
        "times": times,
        "block_means": block_means,
        "cpu_means": cpu_means,
        "waits": waits,
        "pushes": pushes,
        "replication": stats,
        "state_bytes": snap.nbytes,
        "budget": budget.decision if budget is not None else None,
    }


def _budget(sc: dict, ctx: RankContext, base: Any, rep: Any) -> Any:
    """The tax budget of ``sc["budget"]`` (a fraction of a step), or None: the snapshotter's own
    (accelpact.snapshot.tax_budget), swapped in for the "budget" blocks only, agreeing through the control store.
    ``base``: the bench's SnapshotConfig (its warm-up cadence and bounds); ``rep``: its Replication."""
    if not sc.get("budget"):
        return None
    from accelpact.snapshot.tax_budget import TaxBudget

    budget = TaxBudget(
        float(sc["budget"]),
        base.max_bound,
        base.tax_warmup,
        (base.every, base.push_every),
        ctx.rank,
        ctx.world_size,
        rep.push_cpu_s,
    )
    budget.control = ctx.control
    return budget


def overhead_rows(res: list[dict], ks: list[int]) -> list[str]:
    off = [t for r in res for t in r["times"]["off"]]
    cpu_off = statistics.mean(c for r in res for c in r["cpu_means"]["off"])
    rows = []
    for mode in ["snap", *[f"k{k}" for k in ks]]:
        on = [t for r in res for t in r["times"][mode]]
        pairs = [b / a - 1 for a, b in zip(res[0]["block_means"]["off"], res[0]["block_means"][mode])]
        cpu_on = statistics.mean(c for r in res for c in r["cpu_means"][mode])
        waits = [w for r in res for w in r["waits"][mode]]
        what = "snapshots, no push" if mode == "snap" else f"snapshots + push_every={mode[1:]}"
        rows.append(
            f"| {what} | {len(off)} / {len(on)} | {statistics.median(off) * 1e3:.0f} / {statistics.median(on) * 1e3:.0f} | "
            f"{(statistics.median(on) / statistics.median(off) - 1) * 100:+.1f} % / "
            f"{(statistics.mean(on) / statistics.mean(off) - 1) * 100:+.1f} % | "
            f"{statistics.median(pairs) * 100:+.1f} % ({', '.join(f'{x * 100:+.0f}' for x in pairs)}) | "
            f"{cpu_off:.3f} / {cpu_on:.3f} s: {(cpu_on / cpu_off - 1) * 100:+.1f} % | "
            f"{max(waits) * 1e3:.1f} | {res[0]['pushes'][mode]} |"
        )
    return rows


# ---------------------------------------------------------------------------------------------- part 2


def launch_pair(run: Path, port: int, script_args: list[str], timeout_s: float) -> None:
    """Two agents (node 0 hosts the store), one rank each, each node its own snapshot root."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1"
    )
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    run.mkdir(parents=True)
    shm = Path(tempfile.mkdtemp(prefix="accelpact-bench-pe-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    procs = []
    try:
        for node in (0, 1):
            cmd = [
                sys.executable,
                "-m",
                "accelpact.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--rdzv-id",
                f"pe{os.getpid()}{run.name}",
                "--log-dir",
                str(run / "logs"),
                "--snapshot-root",
                str(shm / "node%n"),
                str(EXAMPLE),
                "--out",
                str(run / "out"),
                *script_args,
            ]
            procs.append(
                subprocess.Popen(
                    cmd, stdout=(run / f"agent{node}.log").open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT
                )
            )
        for node, p in enumerate(procs):
            rc = p.wait(timeout=timeout_s)
            if rc != 0:
                raise RuntimeError(
                    f"{run.name}: agent {node} exited {rc}:\n{(run / f'agent{node}.log').read_text()[-3000:]}"
                )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        shutil.rmtree(shm, ignore_errors=True)


def results(run: Path, rank: int) -> list[dict]:
    import json

    lines = (run / "logs" / f"rank{rank}.log").read_text().splitlines()
    return [json.loads(line.split("RESULT ", 1)[1]) for line in lines if line.startswith("RESULT ")]


def bit_identical(ref: Path, run: Path) -> bool:
    import torch

    for rank in (0, 1):
        a = torch.load(ref / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        b = torch.load(run / "out" / f"rank{rank}.pt", weights_only=True)["state"]
        if sorted(a) != sorted(b) or not all(torch.equal(a[key], b[key]) for key in a):
            return False
    return True


def heal_row(ref: Path, run: Path, k: int, kill_at: int) -> dict:
    [survivor] = results(run, 0)
    heals = [h for h in survivor["heals"] if h["role"] == "survivor"]
    repl = results(run, 1)[-1]
    return {
        "k": k,
        "kill_at": kill_at,
        "replayed": [h["replayed"] for h in heals],
        "resume_step": [h["resume_step"] for h in heals],
        "source": [h["source"] for h in repl["heals"]],
        "restart": repl["restart"],
        "identical": bit_identical(ref, run),
    }


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4], help="push_every values")
    ap.add_argument("--steps", type=int, default=4, help="steps per block (a multiple of every k)")
    ap.add_argument("--rounds", type=int, default=3, help="cycles of blocks after the warm-up cycle")
    ap.add_argument("--confirm-push", action="store_true", help="Replication(confirm=True) in both parts")
    ap.add_argument("--heal-steps", type=int, default=12, help="steps of each host-loss run (0: skip part 2)")
    ap.add_argument(
        "--kill-at",
        type=int,
        nargs="+",
        default=[8, 9],
        help="rank 1's host is lost in this step (one run per value and k; the survivor committed the step before)",
    )
    ap.add_argument("--heal-rounds", type=int, default=1, help="host-loss runs per k (interleaved)")
    args = ap.parse_args(argv)
    if any(args.steps % k for k in args.k):
        ap.error(
            f"--steps {args.steps} is not a multiple of every --k {args.k}: blocks would push unequal shares; "
            f"try --steps {math.lcm(*args.k)}"
        )
    command = "PYTHONPATH=. .venv/bin/python benchmarks/bench_push_every.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    load_before, t0 = load_average(), time.time()
    sha = os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
    lines = [
        f"bench_push_every at {sha}, {os.cpu_count()} cores, load average {load_before} before",
        f"command: `{command}`",
    ]
    root = tempfile.mkdtemp(prefix="accelpact-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            name = "push_every"
            sc = {
                "name": name,
                "model": MODEL,
                "steps": args.steps,
                "rounds": args.rounds,
                "root": root,
                "ks": args.k,
                "confirm": args.confirm_push,
            }
            total = args.steps * (2 + len(args.k)) * (args.rounds + 1)
            s = run_session(
                Path(tmp) / name,
                RUNNER,
                [{**sc, "steps_total": total}],
                world_size=2,
                barrier=True,
                pg_timeout_s=900,
                control_deadline_s=900,
                timeout_s=300 + 10 * total,
            )
            res = s.job(name)
            lines += [
                "",
                f"Part 1: step time, mistral_tiny seq {MODEL['seq']} x batch {MODEL['batch']}, 2 gloo ranks "
                f"(each its own snapshot root), blocks of {args.steps} steps, {args.rounds} rounds, "
                f"confirm={args.confirm_push}; {s.wall_s:.0f} s, load {load_average()} after",
                "",
                "| blocks | steps off / on | median step ms off / on | overhead median / mean | per-round pairs, "
                "median (each) | CPU s per step off / on | before_update blocked max ms | pushes (rank 0) |",
                "|---|---|---|---|---|---|---|---|",
                *overhead_rows(res, args.k),
            ]
            print("\n".join(lines[-len(args.k) - 1 :]), flush=True)  # progress; the whole table is printed at the end
            if args.heal_steps:
                heal = Path(tmp) / "heal"
                port = random.randint(20000, 29000)
                timeout = 300 + 30 * args.heal_steps
                launch_pair(heal / "ref", port, ["--steps", str(args.heal_steps)], timeout)
                rows = []
                for rnd in range(args.heal_rounds):
                    for kill_at, k in [(x, k) for x in args.kill_at for k in args.k]:
                        port += 1
                        run = heal / f"k{k}x{kill_at}r{rnd}"
                        extra = ["--confirm-push"] if args.confirm_push else []
                        launch_pair(
                            run,
                            port,
                            [
                                "--steps",
                                str(args.heal_steps),
                                "--replicas",
                                "--push-every",
                                str(k),
                                "--lose-host",
                                "--kill-at",
                                str(kill_at),
                                "--kill-rank",
                                "1",
                                *extra,
                            ],
                            timeout,
                        )
                        rows.append(heal_row(heal / "ref", run, k, kill_at))
                        print(f"  {rows[-1]}", flush=True)
                lines += [
                    "",
                    f"Part 2: host loss of rank 1 in step X of {args.heal_steps} (examples/train_heal.py, "
                    f"2 agents x 1 rank, --lose-host), confirm={args.confirm_push}; load {load_average()} after",
                    "",
                    "| push_every | X (survivor committed c = X - 1) | newest pushed step s <= c | replayed if the push "
                    "of s had landed: c - s | bound (steps) | survivor's replayed steps | resume step | replacement "
                    "healed from | group restart | bit-identical to the fault-free run |",
                    "|---|---|---|---|---|---|---|---|---|---|",
                ]
                for r in rows:
                    c = r["kill_at"] - 1
                    s_ = c - c % r["k"]
                    lines.append(
                        f"| {r['k']} | {r['kill_at']} | {s_} | {c - s_} | {r['k']} | {r['replayed']} | "
                        f"{r['resume_step']} | {r['source']} | {r['restart']} | {r['identical']} |"
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines += ["", f"total {time.time() - t0:.0f} s, load average {load_average()} after"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
