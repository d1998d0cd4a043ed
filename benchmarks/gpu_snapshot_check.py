"""GPU check of the snapshot path (side stream into pinned memory): one GPU, one rank, FSDP2.

NOT RUN ON A GPU YET: written on a CPU-only machine, where ``--device cpu`` runs the same check
(the CPU path, which the test suite covers too). On a GPU it checks what CPU runs cannot:

1. training with a snapshot after every step is bit-identical to training without: the side stream's
   device-to-host copy of step N must finish before step N+1's optimizer kernels change the shard
   (``before_update`` makes the compute stream wait for the copy's event);
2. a fresh model and optimizer on the GPU restored from the snapshot of step ``--restore-step``
   continue bit-identically (parameters, AdamW state, the CUDA RNG state);
3. step time with snapshots every step vs off, interleaved blocks, and the time ``before_update``
   blocked the host (expected ~0 on a GPU: the wait is on the device).

    python benchmarks/gpu_snapshot_check.py                 # cuda:0
    python benchmarks/gpu_snapshot_check.py --device cpu    # the same check on the CPU path

One GPU is enough (world size 1: nothing is sharded, but every tensor is a DTensor as with more
ranks). Exit 0 only if both comparisons match. About a minute with the defaults.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--restore-step", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--bench-blocks", type=int, default=6, help="off/on blocks of 5 steps for the timing")
    return p.parse_args(argv)


def build(args, device):
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1234)
    blocks = [
        nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.GELU(), nn.Dropout(0.1)) for _ in range(args.layers)
    ]
    model = nn.Sequential(*blocks, nn.Linear(args.hidden, 16)).to(device)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, optimizer, args, i, device, snap=None) -> object:
    import torch

    x = torch.randn(32, args.hidden, generator=torch.Generator().manual_seed(i)).to(device)
    loss = model(x).float().pow(2).mean()  # dropout draws from the device RNG: it is in the snapshot
    loss.backward()
    if snap is not None:
        snap.before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if snap is not None:
        snap.after_commit(i)
    return loss.detach()


def shards(model, optimizer) -> dict:
    out = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = p.to_local().detach().cpu().clone()
        for k, v in optimizer.state[p].items():
            out[f"optim/{name}/{k}"] = (v.to_local() if hasattr(v, "to_local") else v).detach().cpu().clone()
    return out


def same(a: dict, b: dict) -> list[str]:
    import torch

    return [k for k in a if k not in b or not torch.equal(a[k], b[k])] + [k for k in b if k not in a]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    from accelpact.snapshot import SnapshotConfig, Snapshotter

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_snapshot_check: CUDA is not available on this machine; run it on a GPU, or --device cpu")
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.HashStore()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    root = tempfile.mkdtemp(prefix="accelpact-gpucheck-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    cfg = SnapshotConfig(root=root)
    ok = True
    try:
        # 1. Reference, then the same with a snapshot after every step.
        torch.manual_seed(7)
        model, opt = build(args, device)
        torch.manual_seed(7)
        ref_losses = [step(model, opt, args, i, device) for i in range(args.steps)]
        ref = shards(model, opt)
        model, opt = build(args, device)
        torch.manual_seed(7)
        snap = Snapshotter(model, opt, job_token="gpucheck", rank=0, world_size=1, config=cfg)
        losses = [step(model, opt, args, i, device, snap) for i in range(args.steps)]
        snap.flush()
        diff = same(ref, shards(model, opt))
        lost = [i for i, (a, b) in enumerate(zip(ref_losses, losses)) if not torch.equal(a, b)]
        print(
            f"1. snapshots every step vs none: {'bit-identical' if not diff and not lost else 'DIFFERENT'} "
            f"({len(ref)} tensors; differing: {diff[:3]}, losses {lost}); held {snap.held_steps(verify=True)}"
        )
        ok &= not diff and not lost
        # 2. The slot of restore_step kept? Only the newest two are: redo up to it, then restore fresh.
        model, opt = build(args, device)
        torch.manual_seed(7)
        snap.close(remove=True)
        snap = Snapshotter(model, opt, job_token="gpucheck", rank=0, world_size=1, config=cfg)
        for i in range(args.restore_step + 1):
            step(model, opt, args, i, device, snap)
        snap.flush()
        fresh, fopt = build(args, device)
        fsnap = Snapshotter(fresh, fopt, job_token="gpucheck", rank=0, world_size=1, config=cfg)
        fsnap.restore(args.restore_step)
        tail = [step(fresh, fopt, args, i, device) for i in range(args.restore_step + 1, args.steps)]
        diff = same(ref, shards(fresh, fopt))
        lost = [i for i, (a, b) in enumerate(zip(ref_losses[args.restore_step + 1 :], tail)) if not torch.equal(a, b)]
        print(
            f"2. fresh model restored from step {args.restore_step}, then trained on: "
            f"{'bit-identical' if not diff and not lost else 'DIFFERENT'} (differing: {diff[:3]}, losses {lost})"
        )
        ok &= not diff and not lost
        # 3. Timing, interleaved.
        times = {"off": [], "on": []}
        i = 0
        for b in range(2 * args.bench_blocks + 2):
            mode = "on" if b % 2 else "off"
            for _ in range(5):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(model, opt, args, 1000 + i, device, snap if mode == "on" else None)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if b >= 2:
                    times[mode].append(time.perf_counter() - t0)
                i += 1
            snap.flush()
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(
            f"3. step median off {off * 1e3:.1f} ms, on {on * 1e3:.1f} ms: overhead {(on / off - 1) * 100:+.1f} % "
            f"(target <= 3 %); host blocked in before_update {snap.wait_s * 1e3:.1f} ms in total; "
            f"slot {snap.nbytes / 2**20:.0f} MiB, last copy {snap.last_copy_s * 1e3:.1f} ms"
        )
        snap.close(remove=True)
        fsnap.close(remove=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()
    print("gpu_snapshot_check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
