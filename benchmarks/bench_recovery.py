"""Benchmark of accelpact's recovery engine (not a test): prints each figure beside its target.

For a 32-layer model of mistral_tiny width (hidden 256, 8 heads, FSDP2 per block + root), in one run:
1. rebinding time, median of >= 1000 rebinds, at world sizes 2, 4 and 8 on this host
   (target <= 20 us and flat; the paper reports 493-518 us);
2. end-to-end recovery time after detection at world size 4, broken down (target <= 50 ms);
3. steady-state cost of an attached guard vs a plain FSDP2 loop, interleaved in the same run
   (target: at most 1% lower throughput).

Usage: .venv/bin/python benchmarks/bench_recovery.py [--rebinds 1000] [--faults 5] [--steps 20]
Each world size runs as real processes (gloo over 127.0.0.1) with an out-of-band control store here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYERS, VOCAB, HIDDEN, INTER, HEADS, KV_HEADS, SEQ, BATCH = 32, 4096, 256, 768, 8, 4, 64, 2


# ----------------------------------------------------------------------------- rank side


def _build():
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ * 2)
    model = MistralForCausalLM(cfg)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)


def _worker(cfg: dict) -> None:
    import torch
    import torch.distributed as dist

    from accelpact import testing as ft
    from accelpact.bindings import BindingTable
    from accelpact.control import ControlChannel, ControlConfig
    from accelpact.guard import attach, clip_gradients

    torch.set_num_threads(1)
    rank, world = cfg["rank"], cfg["world"]
    store = dist.PrefixStore(f"{cfg['token']}/init", dist.TCPStore(
        "127.0.0.1", cfg["port"], world, is_master=False, timeout=timedelta(seconds=120)))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    model, opt = _build()
    out: dict = {}

    def step_fn(tokens):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        return loss.detach()

    def tokens(step):
        g = torch.Generator().manual_seed(step * 101 + rank)
        return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)

    step_fn(tokens(0))  # lazy init: FSDP builds its param groups' state on the first forward
    opt.zero_grad(set_to_none=True)

    # 1. rebinding: swap every slot between two real groups, back and forth.
    t0 = time.perf_counter()
    table = BindingTable.build(model, opt)
    out["table_build_s"] = time.perf_counter() - t0
    out["slots"] = len(table.slots)
    a = table.groups[0]
    b = dist.new_group(list(range(world)), backend="gloo")
    times = []
    for i in range(cfg["rebinds"]):
        mapping = {a: b} if i % 2 == 0 else {b: a}
        t = time.perf_counter()
        table.rebind(mapping)
        times.append(time.perf_counter() - t)
    if cfg["rebinds"] % 2:
        table.rebind({b: a})
    out["rebind_s"] = times
    dist.destroy_process_group(b)
    del table

    if cfg.get("recovery") or cfg.get("overhead"):
        control = ControlChannel.connect(ControlConfig("127.0.0.1", cfg["port"], rank, world, cfg["token"],
                                                       deadline_s=60.0))
        guard = attach(model, opt, control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=120))
        step = 1
        if cfg.get("overhead"):
            # Interleaved blocks so both loops see the same machine load.
            plain, guarded = [], []
            for block in range(cfg["blocks"]):
                for _ in range(cfg["block_steps"]):
                    t = time.perf_counter()
                    step_fn(tokens(step))
                    clip_gradients(model, 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    plain.append(time.perf_counter() - t)
                    step += 1
                guard._next_step = step  # keep the guard's step count in line with the plain loop
                for _ in range(cfg["block_steps"]):
                    t = time.perf_counter()
                    guard.step(step_fn, tokens(step))
                    guarded.append(time.perf_counter() - t)
                    step += 1
            out["plain_s"], out["guarded_s"] = plain, guarded
        if cfg.get("recovery"):
            inj = ft.FaultInjector(exclude_ports=[cfg["port"]])
            guard.phase_hooks.append(inj.on_phase)
            inj.install(model, model.model.layers[LAYERS // 2])
            start = guard._next_step = step
            phases = ["forward_allgather_middle", "backward_reduce_scatter", "vote", "clip_allreduce"]
            for k in range(cfg["faults"]):
                if rank == k % world:
                    inj.arm(start + 2 * k + 1, phases[k % len(phases)])
            for s in range(start, start + 2 * cfg["faults"] + 2):
                guard.step(step_fn, tokens(s))
            out["events"] = [e.to_dict() for e in guard.events]
    Path(cfg["out"]).write_text(json.dumps(out))
    os._exit(0)


# ----------------------------------------------------------------------------- driver


def _run(world: int, args, **extra) -> list[dict]:
    from accelpact.control import new_job_token, start_control_server

    server, port = start_control_server()
    token = new_job_token()
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_w{world}_"))
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for rank in range(world):
        cfg = {"rank": rank, "world": world, "port": port, "token": token, "rebinds": args.rebinds,
               "out": str(tmp / f"r{rank}.json"), **extra}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(cfg)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=open(tmp / f"r{rank}.log", "w")))
    for p in procs:
        p.wait(timeout=1800)
    del server
    outs = []
    for rank in range(world):
        path = tmp / f"r{rank}.json"
        if not path.exists():
            raise SystemExit(f"rank {rank} of world {world} failed; see {tmp / f'r{rank}.log'}")
        outs.append(json.loads(path.read_text()))
    return outs


def _us(x: float) -> str:
    return f"{x * 1e6:8.1f} us"


def _ms(x: float) -> str:
    return f"{x * 1e3:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rebinds", type=int, default=1000)
    ap.add_argument("--faults", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--block-steps", type=int, default=5)
    args = ap.parse_args()
    if args.worker:
        _worker(json.loads(args.worker))
        return
    if args.rebinds < 1000:
        print(f"note: {args.rebinds} rebinds (< 1000 asked for by the issue)")
    print(f"accelpact recovery benchmark: {LAYERS}-layer Mistral, hidden {HIDDEN}, FSDP2 per block + root, "
          f"gloo on 127.0.0.1, {os.cpu_count()} CPU cores")

    print("\n1. rebinding time (median of %d, rank 0; max over ranks in brackets); target <= 20 us flat, "
          "paper 493-518 us" % args.rebinds)
    w4 = None
    for world in (2, 4, 8):
        extra = {}
        if world == 4:
            extra = {"recovery": True, "faults": args.faults}
        outs = _run(world, args, **extra)
        meds = [statistics.median(o["rebind_s"]) for o in outs]
        print(f"   world {world}: {_us(meds[0])}  [max {_us(max(meds))}]  slots {outs[0]['slots']}, "
              f"table build {_ms(outs[0]['table_build_s'])}")
        if world == 4:
            w4 = outs

    print(f"\n2. end-to-end recovery after detection, world 4, {args.faults} socket resets "
          "(median over faults of the slowest rank); target <= 50 ms")
    keys = ["agreement_s", "rebuild_s", "rebind_s", "first_collective_s", "total_s", "detection_s", "retire_s"]
    n = min(len(o["events"]) for o in w4)
    per_fault = [{k: max(o["events"][i][k] for o in w4) for k in keys} for i in range(n)]
    for k in keys:
        vals = [f[k] for f in per_fault]
        label = k[:-2]
        print(f"   {label:17s} {_ms(statistics.median(vals))}   (min {_ms(min(vals))}, max {_ms(max(vals))})")
    print("   (total = detection caught -> first good collective done; retire = old group destructor, after)")

    print("\n3. steady-state cost of an attached guard, world 2, interleaved blocks "
          f"({args.blocks} x {args.block_steps} steps each); target <= 1% lower throughput")
    outs = _run(2, args, overhead=True, blocks=args.blocks, block_steps=args.block_steps)
    plain = statistics.median(outs[0]["plain_s"])
    guarded = statistics.median(outs[0]["guarded_s"])
    print(f"   plain FSDP2 step  {_ms(plain)}   guarded step {_ms(guarded)}   "
          f"throughput ratio guarded/plain = {plain / guarded:.4f} ({(guarded / plain - 1) * 100:+.2f}% step time)")


if __name__ == "__main__":
    main()
