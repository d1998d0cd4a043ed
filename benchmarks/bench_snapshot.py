"""Benchmark of per-step snapshots (not a test): step time with snapshots every step vs off, side by side.

For each model size, one pair of real gloo ranks trains the FSDP2 Mistral-style decoder under an
attached guard and alternates blocks of ``--steps`` steps with snapshots off and on, ``--rounds``
times (interleaved: load from other processes hits both alike; the first block of each size is a
warm-up and not counted). Printed per size: median and mean step time of each, the overhead ratio
(target <= 3 %), the time ``before_update`` blocked per step, the background copy and seal times, and
the shared-memory bytes per rank (2 own slots; the memory plan counts 4 with the buddy replicas), and
the CPU seconds per step of each rank process (every thread), off vs on: on a host whose cores are all
busy training, as this one, the snapshot thread's CPU is what it costs; wall time there is dominated
by other processes' load.

With ``--replicas`` each round has a third block, "push": snapshots every step AND each completed
slot pushed to the buddy rank (``accelpact.snapshot.Replication`` over loopback TCP; with 2 ranks
each is the other's buddy, so every process both sends its replica and receives its ward's). The
block's last push is flushed and charged to it, like its last snapshot. Its CPU and wall time are
compared with the same round's "off" block.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_snapshot.py --sizes mistral_tiny mistral_small \
        --steps 2 --rounds 4 --replicas --out results/snapshots

Snapshots go to a fresh directory under /dev/shm (removed at the end).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accelpact.snapshot.checksum import describe  # noqa: E402
from accelpact.testing.session import load_average, run_session  # noqa: E402

if TYPE_CHECKING:
    from accelpact.testing.rank import RankContext

RUNNER = "benchmarks.bench_snapshot:run_rank"
# conf/model/*.yaml, in experiments.workloads.fsdp_models' field names.
SIZES = {
    "mistral_tiny": {
        "vocab": 4096,
        "hidden": 256,
        "inter": 768,
        "layers": 4,
        "heads": 8,
        "kv_heads": 4,
        "seq": 128,
        "batch": 4,
    },
    "mistral_small": {
        "vocab": 32000,
        "hidden": 768,
        "inter": 2688,
        "layers": 12,
        "heads": 12,
        "kv_heads": 4,
        "seq": 256,
        "batch": 2,
    },
}


def run_rank(sc: dict, ctx: RankContext) -> dict:
    """Alternate blocks with snapshots off and on under one guard; time every step."""
    from datetime import timedelta

    import torch

    from accelpact.guard import attach
    from accelpact.snapshot import SnapshotConfig, Snapshotter
    from accelpact.snapshot.sizing import used_bytes
    from experiments.workloads.fsdp_models import batch_for, build, model_config, step_fn_for

    m = model_config(sc["model"])
    model, optimizer, _root, _mid = build("fsdp2", m)
    n_params = sum(p.numel() for p in model.parameters())  # global (DTensor) sizes
    token = f"bench-{sc['name']}"
    snap = Snapshotter(
        model,
        optimizer,
        job_token=token,
        rank=ctx.rank,
        world_size=ctx.world_size,
        config=SnapshotConfig(root=sc["root"], ranks_sharing_root=ctx.world_size),
    )
    rep = None
    if sc["replicas"]:
        from accelpact.snapshot.replica import Replication

        # One host root per rank, as on two hosts: the ward's replicas land beside the rank's own slots.
        rep = Replication(
            ctx.control,
            rank=ctx.rank,
            world_size=ctx.world_size,
            root=sc["root"],
            bind_host="127.0.0.1",
            job_token=token,
        )
    guard = attach(model, optimizer, ctx.control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=ctx.pg_timeout_s))
    step_fn = step_fn_for(model)
    cycle = ["off", "on", "push"] if rep is not None else ["off", "on"]
    blocks = [cycle[i % len(cycle)] for i in range(len(cycle) * sc["rounds"])]
    blocks = cycle[1:] + ["off"] + blocks  # warm-up: lazy init, the slot files' first touch, allocator
    warm = len(cycle)
    times: dict[str, list[float]] = {m_: [] for m_ in cycle}
    block_means: dict[str, list[float]] = {m_: [] for m_ in cycle}
    cpu_means: dict[str, list[float]] = {m_: [] for m_ in cycle}  # this process's CPU time, every thread
    waits: dict[str, list[float]] = {m_: [] for m_ in cycle}
    copies: list[float] = []
    seals: list[float] = []
    step = 0
    for i, mode in enumerate(blocks):
        guard.snapshots = snap if mode != "off" else None
        snap.on_complete = rep.push if mode == "push" and rep is not None else None
        ctx.barrier(f"{sc['name']}/block{i}")
        t_block, c_block = time.perf_counter(), time.process_time()
        for k in range(sc["steps"]):
            t0 = time.perf_counter()
            guard.step(step_fn, batch_for(step, ctx.rank, m))
            if mode != "off" and k == sc["steps"] - 1:
                snap.flush()  # the block's last snapshot is charged to it: the next block starts clean
                if mode == "push":
                    rep.flush(600)  # and its last push (this rank's; the ward's arrives meanwhile)
            dt = time.perf_counter() - t0
            if i >= warm:
                times[mode].append(dt)
                if mode != "off":
                    waits[mode].append(snap.last_wait_s)
                if mode == "on":
                    copies.append(snap.last_copy_s)
                    seals.append(snap.last_seal_s)
            step += 1
        if mode == "push":
            ctx.barrier(f"{sc['name']}/pushed{i}")  # the ward's last push has arrived too (its CPU is this block's)
        if i >= warm:
            block_means[mode].append((time.perf_counter() - t_block) / sc["steps"])
            cpu_means[mode].append((time.process_time() - c_block) / sc["steps"])
    shm = used_bytes(snap.dir)
    nbytes = snap.nbytes
    rep_stats = rep.stats() if rep is not None else None
    snap.close(remove=True)
    if rep is not None:
        rep.close(remove=True)
    guard.close()
    return {
        "times": times,
        "block_means": block_means,
        "cpu_means": cpu_means,
        "waits": waits,
        "copy_s": copies,
        "seal_s": seals,
        "shm_bytes": shm,
        "slot_bytes": nbytes,
        "params": n_params,
        "torch_threads": torch.get_num_threads(),
        "replication": rep_stats,
    }


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f}"


def summarize(name: str, res: list[dict], mode: str = "on") -> list[str]:
    """One row: ``mode`` ("on": own snapshots; "push": snapshots and buddy pushes) against "off"."""
    off = [t for r in res for t in r["times"]["off"]]
    on = [t for r in res for t in r["times"][mode]]
    waits = [w for r in res for w in r["waits"][mode]]
    med_ratio = statistics.median(on) / statistics.median(off) - 1
    mean_ratio = statistics.mean(on) / statistics.mean(off) - 1
    # Per round: an on-block's mean step over the same round's off-block (rank 0; both ranks step
    # together). The median of these pairs is the least load-sensitive wall figure.
    pairs = [b / a - 1 for a, b in zip(res[0]["block_means"]["off"], res[0]["block_means"][mode])]
    pair_ratio = statistics.median(pairs)
    # CPU seconds per step of the whole rank process (training thread + snapshot thread + replica
    # threads), both ranks: hardly inflated by other processes' load, unlike wall time. On a host whose
    # cores are all busy training (this one), extra CPU is extra wall time; with idle cores it overlaps.
    cpu_off = statistics.mean(c for r in res for c in r["cpu_means"]["off"])
    cpu_on = statistics.mean(c for r in res for c in r["cpu_means"][mode])
    cpu_ratio = cpu_on / cpu_off - 1
    verdict = "met" if med_ratio <= 0.03 else "MISSED"
    verdict = verdict if abs(pair_ratio - med_ratio) < 0.05 else verdict + " (noisy: the pairs disagree)"
    cpu_verdict = "met" if cpu_ratio <= 0.03 else "MISSED"
    what = "snapshots" if mode == "on" else "snapshots + buddy push"
    copy_seal = (
        (
            f"{statistics.median([c for r in res for c in r['copy_s']]) * 1e3:.0f} / "
            f"{statistics.median([c for r in res for c in r['seal_s']]) * 1e3:.0f}"
        )
        if mode == "on"
        else "(as above)"
    )
    return [
        f"| {name} | {what} | {res[0]['params'] / 1e6:.1f}M | {len(off)} / {len(on)} | {_ms(statistics.median(off))} / "
        f"{_ms(statistics.median(on))} | {_ms(statistics.mean(off))} / {_ms(statistics.mean(on))} | "
        f"{med_ratio * 100:+.1f} % / {mean_ratio * 100:+.1f} % | {pair_ratio * 100:+.1f} % "
        f"({', '.join(f'{x * 100:+.0f}' for x in pairs)}) | {verdict} | {cpu_off:.3f} / {cpu_on:.3f} s: "
        f"{cpu_ratio * 100:+.1f} % {cpu_verdict} | "
        f"{statistics.median(waits) * 1e3:.1f} / {max(waits) * 1e3:.1f} | {copy_seal} | "
        f"{max(r['shm_bytes'] for r in res) / 2**20:.1f} MiB ({max(r['slot_bytes'] for r in res) / 2**20:.1f} MiB "
        f"x 2) |"
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["mistral_tiny", "mistral_small"], choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=4, help="steps per block")
    ap.add_argument("--rounds", type=int, default=3, help="off/on block pairs per size (after a warm-up pair)")
    ap.add_argument(
        "--seq",
        nargs="*",
        default=[],
        metavar="SIZE=SEQ",
        help="override a size's sequence length, e.g. mistral_small=64 (fewer FLOPs per step, the same "
        "snapshot bytes: a stricter overhead test, and a step short enough for a loaded host)",
    )
    ap.add_argument(
        "--replicas",
        action="store_true",
        help="a third block per round: snapshots and each slot pushed to the buddy rank (Replication)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write bench_snapshot.md and provenance here")
    args = ap.parse_args(argv)
    command = "PYTHONPATH=. .venv/bin/python benchmarks/bench_snapshot.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    load_before, t0 = load_average(), time.time()
    root = tempfile.mkdtemp(prefix="accelpact-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rows, notes = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.sizes:
                seq = dict(item.split("=", 1) for item in args.seq).get(name)
                model = {**SIZES[name], **({"seq": int(seq)} if seq else {})}
                sc = {
                    "name": name,
                    "model": model,
                    "steps": args.steps,
                    "rounds": args.rounds,
                    "root": root,
                    "replicas": args.replicas,
                }
                blocks = 3 if args.replicas else 2
                total_steps = args.steps * blocks * (args.rounds + 1)
                s = run_session(
                    Path(tmp) / name,
                    RUNNER,
                    [{**sc, "steps_total": total_steps}],
                    world_size=2,
                    barrier=True,
                    pg_timeout_s=900,
                    control_deadline_s=900,
                    timeout_s=300 + 60 * total_steps * (6 if name == "mistral_small" else 1),
                )
                res = s.job(name)
                label = f"{name} (seq {model['seq']}, batch {model['batch']})"
                rows += summarize(label, res, "on")
                if args.replicas:
                    rows += summarize(label, res, "push")
                    st = [r["replication"] for r in res]
                    notes.append(
                        f"{name} pushes: "
                        + "; ".join(
                            f"rank {i}: pushed {x['pushed']}, held for its ward {x['held_for']}, retried {x['retried']}, "
                            f"dropped {x['dropped']}, skipped {x['skipped']}, "
                            f"{x['push_mb_s'] or 0:.0f} MB/s"
                            for i, x in enumerate(st)
                        )
                    )
                notes.append(f"{name}: {s.wall_s:.0f} s, load {load_average()}")
                print(f"  {notes[-1]}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = load_average()
    sha = os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
    header = [
        "| model | on = | params | steps off / on | median step ms off / on | mean ms off / on | overhead median / mean "
        "(target <= 3 %) | per-round pairs, median (each) | verdict (wall) | CPU s per step off / on: overhead | before_update blocked ms median / max | copy / seal ms median | "
        "/dev/shm per rank (own slots) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    text = "\n".join(
        [
            f"bench_snapshot at {sha}, {os.cpu_count()} cores, load average {load_before} before, {load_after} after, "
            f"{time.time() - t0:.0f} s",
            f"command: `{command}`",
            f"checksums: {describe()}",
            "",
            *header,
            *rows,
            "",
            *[f"- {n}" for n in notes],
        ]
    )
    print(text)
    if args.out is not None:
        from experiments.provenance import write_provenance

        args.out.mkdir(parents=True, exist_ok=True)
        write_provenance(args.out, command, {"load_before": str(load_before), "load_after": str(load_after)})
        (args.out / "bench_snapshot.md").write_text(
            "# Snapshot overhead: one run\n\n" + (args.out / "provenance.md").read_text() + "\n```\n" + text + "\n```\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
