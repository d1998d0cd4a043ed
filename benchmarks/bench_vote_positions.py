"""The commit vote with and without the ranks' positions, side by side (not a test).

Before: the guard's vote before positions, as that code ran: ``buf.fill_(1.0)`` on a one-element float
tensor, then the backend's vote of then (an async all-reduce and its wait). After: the guard's ``CommitVote`` (accelpact.guard.vote; accelpact.common.positions): the position folded into one int64
written through the backend's ``VoteBuffer``, the all-reduce, the sum read back and checked. Two gloo
ranks on loopback alternate the two vote by vote (A B B A ...), so both see the same load to the
microsecond, through the real backend's ``vote``. Also timed, as parts of the difference: the int64
vote written and read through the tensor (``fill_``/``item``), the old path's cost.

Prints per variant the median vote time and its ratio to before: the median over blocks of the
per-block ratio of medians, with the distribution-free order-statistic interval for that median
(harness.report.intervals; its exact coverage printed).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_vote_positions.py --blocks 40 --votes 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("before", "after", "after_via_tensor")


def _rank(rank: int, port: int, blocks: int, votes: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from accelpact.backends import backend_for
    from accelpact.common import positions
    from accelpact.guard.vote import CommitVote

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    pg = dist.group.WORLD
    backend = backend_for(pg)
    old_buf = torch.zeros(1)  # the vote before positions: a one-element float buffer
    tensor_buf = torch.zeros(1, dtype=torch.int64)
    codec = positions.VoteCodec(2, pg)
    vote = CommitVote(SimpleNamespace(backend=backend, vote_group=pg), None, rank)
    vote.loop_step = 0

    def old_backend_vote(buf, pg, wait=None) -> None:  # Backend.vote before positions, verbatim
        import torch.distributed as dist

        work = dist.all_reduce(buf, group=pg, async_op=True)
        if wait is None:
            work.wait()
        else:
            wait(work, "the commit vote", "vote")

    def before(i: int) -> None:
        old_buf.fill_(1.0)
        old_backend_vote(old_buf, pg, wait=None)

    def after(i: int) -> None:
        vote.loop_step = i
        vote(0, i, 0, -1)

    def after_via_tensor(i: int) -> None:  # the same vote, written with fill_ and read with item()
        tensor_buf.fill_(codec.encode(0, i, 0, i))
        dist.all_reduce(tensor_buf, group=pg, async_op=True).wait()
        if not codec.agreed(tensor_buf.item()):
            raise AssertionError("positions differ")

    fns = [(name, {"before": before, "after": after, "after_via_tensor": after_via_tensor}[name]) for name in VARIANTS]
    rows = []
    for block in range(blocks):
        dist.barrier()
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for i in range(votes):
            for name, fn in fns if i % 2 == 0 else fns[::-1]:
                t0 = time.perf_counter()
                fn(i)
                times[name].append(time.perf_counter() - t0)
        rows += [(block, name, statistics.median(ts)) for name, ts in times.items()]
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--votes", type=int, default=200)
    args = ap.parse_args()
    import socket

    import torch.multiprocessing as mp

    from harness.report.intervals import order_statistic

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
    per: dict[int, dict[str, float]] = {}
    for b, name, t in rows:
        per.setdefault(b, {})[name] = t
    print(
        f"vote, 2 gloo ranks on loopback, {args.blocks} blocks x {args.votes} votes, the variants alternated "
        f"vote by vote (load {load0:.1f} -> {os.getloadavg()[0]:.1f}):"
    )
    before = statistics.median(per[b]["before"] for b in per) * 1e6
    for name in VARIANTS:
        us = statistics.median(per[b][name] for b in per) * 1e6
        iv = order_statistic([per[b][name] / per[b]["before"] for b in per])
        print(
            f"  {name:17s} median {us:6.1f} us per vote, / before {iv.text()} "
            f"({iv.coverage:.1%} order-statistic interval over blocks; {us - before:+.1f} us)"
        )


if __name__ == "__main__":
    main()
