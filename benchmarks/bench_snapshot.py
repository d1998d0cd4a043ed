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

    PYTHONPATH=. .venv/bin/python benchmarks/bench_snapshot.py --sizes mistral_tiny mistral_small \
        --steps 2 --rounds 6 --seq mistral_small=64 --out results/snapshots

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

from accelpact.testing.session import load_average, run_session  # noqa: E402

if TYPE_CHECKING:
    from accelpact.testing.rank import RankContext

RUNNER = "benchmarks.bench_snapshot:run_rank"
# conf/model/*.yaml, in experiments._fsdp_models' field names.
SIZES = {
    "mistral_tiny": {"vocab": 4096, "hidden": 256, "inter": 768, "layers": 4, "heads": 8, "kv_heads": 4,
                     "seq": 128, "batch": 4},
    "mistral_small": {"vocab": 32000, "hidden": 768, "inter": 2688, "layers": 12, "heads": 12, "kv_heads": 4,
                      "seq": 256, "batch": 2},
}


def run_rank(sc: dict, ctx: "RankContext") -> dict:
    """Alternate blocks with snapshots off and on under one guard; time every step."""
    from datetime import timedelta

    import torch

    from accelpact.guard import attach
    from accelpact.snapshot import SnapshotConfig, Snapshotter
    from accelpact.snapshot.sizing import used_bytes
    from experiments._fsdp_models import batch_for, build, model_config, step_fn_for

    m = model_config(sc["model"])
    model, optimizer, _root, _mid = build("fsdp2", m)
    n_params = sum(p.numel() for p in model.parameters())  # global (DTensor) sizes
    snap = Snapshotter(model, optimizer, job_token=f"bench-{sc['name']}", rank=ctx.rank, world_size=ctx.world_size,
                       config=SnapshotConfig(root=sc["root"], ranks_sharing_root=ctx.world_size))
    guard = attach(model, optimizer, ctx.control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=ctx.pg_timeout_s))
    step_fn = step_fn_for(model)
    blocks = [("off" if i % 2 == 0 else "on") for i in range(2 * sc["rounds"])]
    blocks = ["on", "off"] + blocks  # warm-up: lazy init, the slot files' first touch, allocator
    times: dict[str, list[float]] = {"off": [], "on": []}
    block_means: dict[str, list[float]] = {"off": [], "on": []}
    cpu_means: dict[str, list[float]] = {"off": [], "on": []}  # this process's CPU time, every thread
    waits: list[float] = []
    copies: list[float] = []
    seals: list[float] = []
    step = 0
    for i, mode in enumerate(blocks):
        guard.snapshots = snap if mode == "on" else None
        ctx.barrier(f"{sc['name']}/block{i}")
        t_block, c_block = time.perf_counter(), time.process_time()
        for k in range(sc["steps"]):
            t0 = time.perf_counter()
            guard.step(step_fn, batch_for(step, ctx.rank, m))
            if mode == "on" and k == sc["steps"] - 1:
                snap.flush()  # the block's last snapshot is charged to it: the next block starts clean
            dt = time.perf_counter() - t0
            if i >= 2:
                times[mode].append(dt)
                if mode == "on":
                    waits.append(snap.last_wait_s)
                    copies.append(snap.last_copy_s)
                    seals.append(snap.last_seal_s)
            step += 1
        if i >= 2:
            block_means[mode].append((time.perf_counter() - t_block) / sc["steps"])
            cpu_means[mode].append((time.process_time() - c_block) / sc["steps"])
    shm = used_bytes(snap.dir)
    nbytes = snap.nbytes
    snap.close(remove=True)
    guard.close()
    return {"times": times, "block_means": block_means, "cpu_means": cpu_means, "waits": waits, "copy_s": copies, "seal_s": seals, "shm_bytes": shm,
            "slot_bytes": nbytes, "params": n_params, "torch_threads": torch.get_num_threads()}


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f}"


def summarize(name: str, res: list[dict]) -> list[str]:
    off = [t for r in res for t in r["times"]["off"]]
    on = [t for r in res for t in r["times"]["on"]]
    waits = [w for r in res for w in r["waits"]]
    med_ratio = statistics.median(on) / statistics.median(off) - 1
    mean_ratio = statistics.mean(on) / statistics.mean(off) - 1
    # Per round: an on-block's mean step over the off-block right before it (rank 0; both ranks step
    # together). The median of these pairs is the least load-sensitive figure.
    pairs = [b / a - 1 for a, b in zip(res[0]["block_means"]["off"], res[0]["block_means"]["on"])]
    pair_ratio = statistics.median(pairs)
    # CPU seconds per step of the whole rank process (training thread + snapshot thread), both ranks:
    # hardly inflated by other processes' load, unlike wall time. On a host whose cores are all busy
    # training (this one), extra CPU is extra wall time; with idle cores the copy overlaps for free.
    cpu_off = statistics.mean(c for r in res for c in r["cpu_means"]["off"])
    cpu_on = statistics.mean(c for r in res for c in r["cpu_means"]["on"])
    cpu_ratio = cpu_on / cpu_off - 1
    verdict = "met" if med_ratio <= 0.03 else "MISSED"
    verdict = verdict if abs(pair_ratio - med_ratio) < 0.05 else verdict + " (noisy: the pairs disagree)"
    cpu_verdict = "met" if cpu_ratio <= 0.03 else "MISSED"
    return [f"| {name} | {res[0]['params'] / 1e6:.1f}M | {len(off)} / {len(on)} | {_ms(statistics.median(off))} / "
            f"{_ms(statistics.median(on))} | {_ms(statistics.mean(off))} / {_ms(statistics.mean(on))} | "
            f"{med_ratio * 100:+.1f} % / {mean_ratio * 100:+.1f} % | {pair_ratio * 100:+.1f} % "
            f"({', '.join(f'{x * 100:+.0f}' for x in pairs)}) | {verdict} | {cpu_off:.2f} / {cpu_on:.2f} s: "
            f"{cpu_ratio * 100:+.1f} % {cpu_verdict} | "
            f"{statistics.median(waits) * 1e3:.1f} / {max(waits) * 1e3:.1f} | "
            f"{statistics.median([c for r in res for c in r['copy_s']]) * 1e3:.0f} / "
            f"{statistics.median([c for r in res for c in r['seal_s']]) * 1e3:.0f} | "
            f"{max(r['shm_bytes'] for r in res) / 2**20:.1f} MiB ({max(r['slot_bytes'] for r in res) / 2**20:.1f} MiB "
            f"x 2) |"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["mistral_tiny", "mistral_small"], choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=4, help="steps per block")
    ap.add_argument("--rounds", type=int, default=3, help="off/on block pairs per size (after a warm-up pair)")
    ap.add_argument("--seq", nargs="*", default=[], metavar="SIZE=SEQ",
                    help="override a size's sequence length, e.g. mistral_small=64 (fewer FLOPs per step, the same "
                    "snapshot bytes: a stricter overhead test, and a step short enough for a loaded host)")
    ap.add_argument("--out", type=Path, default=None, help="write bench_snapshot.md and provenance here")
    args = ap.parse_args(argv)
    command = "PYTHONPATH=. .venv/bin/python benchmarks/bench_snapshot.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    load_before, t0 = load_average(), time.time()
    root = tempfile.mkdtemp(prefix="accelpact-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rows, notes = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.sizes:
                seq = dict(item.split("=", 1) for item in args.seq).get(name)
                model = {**SIZES[name], **({"seq": int(seq)} if seq else {})}
                sc = {"name": name, "model": model, "steps": args.steps, "rounds": args.rounds, "root": root}
                total_steps = args.steps * (2 * args.rounds + 2)
                s = run_session(Path(tmp) / name, RUNNER, [{**sc, "steps_total": total_steps}], world_size=2,
                                barrier=True, pg_timeout_s=900, control_deadline_s=900,
                                timeout_s=300 + 60 * total_steps * (6 if name == "mistral_small" else 1))
                res = s.job(name)
                rows += summarize(f"{name} (seq {model['seq']}, batch {model['batch']})", res)
                notes.append(f"{name}: {s.wall_s:.0f} s, load {load_average()}")
                print(f"  {notes[-1]}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = load_average()
    sha = os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
    header = ["| model | params | steps off / on | median step ms off / on | mean ms off / on | overhead median / mean "
              "(target <= 3 %) | per-round pairs, median (each) | verdict (wall) | CPU s per step off / on: overhead | before_update blocked ms median / max | copy / seal ms median | "
              "/dev/shm per rank (own slots) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    text = "\n".join([
        f"bench_snapshot at {sha}, {os.cpu_count()} cores, load average {load_before} before, {load_after} after, "
        f"{time.time() - t0:.0f} s", f"command: `{command}`", "", *header, *rows, "", *[f"- {n}" for n in notes]])
    print(text)
    if args.out is not None:
        from experiments.provenance import write_provenance

        args.out.mkdir(parents=True, exist_ok=True)
        write_provenance(args.out, command, {"load_before": str(load_before), "load_after": str(load_after)})
        (args.out / "bench_snapshot.md").write_text(
            "# Snapshot overhead: one run\n\n" + (args.out / "provenance.md").read_text() + "\n```\n" + text + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
