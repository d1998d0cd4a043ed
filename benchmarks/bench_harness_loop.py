"""Steps/s of the harness training loop vs a minimal hand-written FSDP2 loop, side by side.

Not a test. Starts WORLD ranks (gloo, 127.0.0.1); each rank builds the SAME sharded model twice
(harness.models.build_model, seed 0) and alternates single steps: the harness loop
(``harness.rank.train.run_loop`` with the ``none`` strategy: batch generation, the Strategy call, a JSONL
event per step) and a minimal loop written by hand (forward, backward, clip, step, zero_grad).
Interleaving step by step makes both see the same machine load; the figure is
(median minimal step time) / (median harness step time) = harness steps/s over minimal steps/s.
Target: >= 0.97.

    .venv/bin/python benchmarks/bench_harness_loop.py [--steps 30] [--world 2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from harness.events import EventLog
    from harness.models import build_model
    from harness.rank.data import make_batch
    from harness.rank.strategies.base import TrainContext
    from harness.rank.strategies.none import PlainStep
    from harness.rank.train import run_loop, set_cpu_threads
    from harness.schema import RunConfig

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    set_cpu_threads(world)
    store = dist.TCPStore(
        "127.0.0.1", int(os.environ["BENCH_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=300)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    cfg = RunConfig()
    cfg.train.steps = 10**9
    m = cfg.model
    mesh = init_device_mesh("cpu", (world,))
    cpu = torch.device("cpu")

    def new_pair():
        model = build_model(m, 0, mesh, cpu)
        return model, torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)

    h_model, h_opt = new_pair()
    b_model, b_opt = new_pair()
    run_dir = os.environ["BENCH_DIR"]
    events = EventLog(run_dir, rank)
    ctx = TrainContext(
        cfg=cfg, rank=rank, world_size=world, device=cpu, model=h_model, optimizer=h_opt, events=events, run_dir=run_dir
    )
    strategy = PlainStep(ctx)

    def minimal(start: int, n: int) -> None:
        for step in range(start, start + n):
            tokens = make_batch(0, step, rank, m.batch_size, m.seq_len, m.vocab_size)
            loss = b_model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(b_model.parameters(), cfg.train.max_grad_norm)
            b_opt.step()
            b_opt.zero_grad(set_to_none=True)
            float(loss.detach())  # both loops read the loss once per step

    def timed(fn) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t

    # Warm-up both (lazy FSDP init, allocator).
    run_loop(ctx, strategy, steps=2, start=0)
    minimal(0, 2)
    h_times, m_times = [], []
    step = 2
    for i in range(args.steps):
        h = lambda: run_loop(ctx, strategy, steps=step + 1, start=step)  # noqa: E731, B023 - timed at once
        b = lambda: minimal(step, 1)  # noqa: E731, B023 - timed at once
        if i % 2:  # alternate who goes first
            m_times.append(timed(b))
            h_times.append(timed(h))
        else:
            h_times.append(timed(h))
            m_times.append(timed(b))
        step += 1
    ratio = statistics.median(m_times) / statistics.median(h_times)  # (h steps/s) / (m steps/s)
    ratio_mean = sum(m_times) / sum(h_times)
    if rank == 0:
        print(
            f"harness: median {statistics.median(h_times) * 1e3:.1f} ms/step, minimal: median "
            f"{statistics.median(m_times) * 1e3:.1f} ms/step ({args.steps} steps each, interleaved)"
        )
        print(
            f"RATIO harness/minimal steps/s: {ratio:.4f} (medians), {ratio_mean:.4f} (totals); "
            f"{world} gloo ranks, mistral_tiny, seq {m.seq_len} x batch {m.batch_size} per rank",
            flush=True,
        )
    events.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30, help="steps of each loop, interleaved one by one")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_process:
        rank_main(args)
        return
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=300), wait_for_workers=False)
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(args.world):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(args.world),
                BENCH_PORT=str(store.port),
                BENCH_DIR=tmp,
                HF_HUB_OFFLINE="1",
            )
            procs.append(
                subprocess.Popen([sys.executable, __file__, "--rank-process", "--steps", str(args.steps)], env=env)
            )
        codes = [p.wait() for p in procs]
    sys.exit(max(abs(c) for c in codes))


if __name__ == "__main__":
    main()
