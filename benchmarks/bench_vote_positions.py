"""The commit vote with and without the ranks' positions, side by side (not a test).

Before: the guard's vote was ``buf.fill_(1.0)`` and a one-element float all-reduce. After: ``Guard._vote``
(accelpact.recovery.positions): the position folded into one int64, the all-reduce, the sum read back
and checked. Two gloo ranks on loopback run both, interleaved block by block (A B A B ...)
so that both see the same load, through the real backend's ``vote``. Prints each block's median vote
time and the ratio after / before: the median over blocks with a 95 % bootstrap interval.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_vote_positions.py --blocks 30 --votes 200
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rank(rank: int, port: int, blocks: int, votes: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from accelpact.backends import backend_for
    from accelpact.guard.core import Guard

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    pg = dist.group.WORLD
    backend = backend_for(pg)
    old_buf = torch.zeros(1)  # the vote before positions: a one-element float buffer
    guard = SimpleNamespace(_vote_buf=backend.vote_buffer(), rank=rank, _wait=None, _codec=None, _loop_step=0,
                            plane=SimpleNamespace(backend=backend, vote_group=pg))

    def before(i: int) -> None:
        old_buf.fill_(1.0)
        backend.vote(old_buf, pg, wait=None)

    def after(i: int) -> None:
        guard._loop_step = i
        Guard._vote(guard, 0, i, 0)

    rows = []
    for block in range(blocks):
        for name, fn in (("before", before), ("after", after)) if block % 2 == 0 else (("after", after), ("before", before)):
            dist.barrier()
            times = []
            for i in range(votes):
                t0 = time.perf_counter()
                fn(i)
                times.append(time.perf_counter() - t0)
            rows.append((block, name, statistics.median(times)))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--votes", type=int, default=200)
    args = ap.parse_args()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, args.blocks, args.votes, queue)) for r in range(2)]
    load0 = os.getloadavg()[0]
    for p in procs:
        p.start()
    rows = queue.get(timeout=1800)
    for p in procs:
        p.join()
    per = {b: {} for b, _, _ in rows}
    for b, name, t in rows:
        per[b][name] = t
    ratios = [per[b]["after"] / per[b]["before"] for b in sorted(per)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    before = statistics.median(per[b]["before"] for b in per) * 1e6
    after = statistics.median(per[b]["after"] for b in per) * 1e6
    print(f"vote, 2 gloo ranks on loopback, {args.blocks} interleaved blocks x {args.votes} votes "
          f"(load {load0:.1f} -> {os.getloadavg()[0]:.1f}):")
    print(f"  before (1 float, fill_):            median {before:.1f} us per vote")
    print(f"  after  (1 int64, positions checked): median {after:.1f} us per vote")
    print(f"  after / before: {statistics.median(ratios):.3f} (95% bootstrap interval "
          f"{boot[50]:.3f}-{boot[1949]:.3f}; difference {after - before:+.1f} us)")


if __name__ == "__main__":
    main()
