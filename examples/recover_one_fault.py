"""Recover one real network fault in memory: 2 gloo ranks, a tiny FSDP2 model, one socket reset.

    python examples/recover_one_fault.py

Needs only torch and accelpact (no GPU). This process hosts the control store (the out-of-band
channel the ranks agree over) and starts two rank processes, each a copy of this script. Each rank:

1. trains a fault-free reference for a few steps and keeps its final parameters and optimizer state;
2. builds the same model again, attaches an accelpact guard, and trains it while rank 1 resets its
   own gloo connections right before step 2's vote (a real fault: every rank's collective fails);
3. checks that a recovery happened and that the final state equals the reference bit for bit.

On torch >= 2.15 the recovery reconfigures the same process group in place ("data plane reconfigure");
on 2.13 it builds a new group and rebinds every cached reference ("data plane rebind").

Exit status 0 only if both ranks recovered and both match the fault-free run.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import accelpact
from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server

WORLD_SIZE, STEPS, FAULT_STEP = 2, 4, 2
TIMEOUT = datetime.timedelta(seconds=60)


def build():
    """A tiny MLP, each Linear its own FSDP2 unit; the same seed gives the same weights every time."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data: a retried step sees the same batch."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def full_state(model, optimizer) -> list[torch.Tensor]:
    """Every parameter and optimizer-state tensor, gathered whole (a collective: all ranks call it)."""
    out = []
    for p in model.parameters():
        out.append(p.full_tensor())
        out += [v.full_tensor() for k, v in sorted(optimizer.state[p].items()) if k != "step"]
    return out


def rank_main(rank: int, port: int, token: str) -> None:
    from accelpact.testing import FaultInjector

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, is_master=False, timeout=TIMEOUT)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"{token}/init", store), rank=rank, world_size=WORLD_SIZE, timeout=TIMEOUT
    )

    def forward_backward(model):
        def step_fn(b):
            loss = F.mse_loss(model(b[0]), b[1])
            loss.backward()
            return loss.detach()

        return step_fn

    # 1. The fault-free reference: the same math as guard.step (clip, optimizer step, zero grads).
    model, optimizer = build()
    for step in range(STEPS):
        forward_backward(model)(batch(step, rank))
        accelpact.clip_gradients(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    reference = full_state(model, optimizer)
    del model, optimizer

    # 2. The same training under a guard, with one real fault.
    model, optimizer = build()
    control = ControlChannel.connect(ControlConfig("127.0.0.1", port, rank, WORLD_SIZE, token))
    injector = FaultInjector(exclude_ports=[port])  # never reset the store's connections
    if rank == 1:
        injector.arm(FAULT_STEP, "vote", "reset")
    guard = accelpact.attach(
        model,
        optimizer,
        control,
        max_grad_norm=1.0,
        pg_timeout=TIMEOUT,
        injection_clock=injector.consume_injection_time,
    )
    guard.phase_hooks.append(injector.on_phase)
    for step in range(STEPS):
        guard.step(forward_backward(model), batch(step, rank))

    # 3. Compare with the reference.
    identical = all(torch.equal(a, b) for a, b in zip(full_state(model, optimizer), reference, strict=True))
    print(
        json.dumps(
            {
                "rank": rank,
                "committed_step": guard.committed_step,
                "identical": identical,
                "events": [e.to_dict() for e in guard.events],
            }
        ),
        flush=True,
    )


def main() -> int:
    server, port = start_control_server()  # lives as long as `server`, in this fault-free process
    token = new_job_token()
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), str(port), token], stdout=subprocess.PIPE, text=True
        )
        for r in range(WORLD_SIZE)
    ]
    results = []
    for p in ranks:
        out, _ = p.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        results.append(json.loads(lines[-1]) if p.returncode == 0 and lines else None)
    del server
    if any(r is None for r in results):
        print(f"FAILED: a rank exited with {[p.returncode for p in ranks]}")
        return 1
    for r in results:
        for e in r["events"]:
            message = e["fault"]["message"].splitlines()[0].split("] ", 1)[-1][:60]  # drop gloo's [file:line]
            path = e.get("data_plane", {}).get("path", "rebind")
            print(
                f"rank {r['rank']}: recovered step {e['step']} ({e['fault']['type']}: {message}) -> "
                f"{e['decision']['action']}, data plane {path} "
                f"({'same groups, no rebind' if path == 'reconfigure' else 'new groups, rebound'}), "
                f"generation {e['generation']}, detection {e['detection_s'] * 1e3:.1f} ms, "
                f"recovery {e['total_s'] * 1e3:.1f} ms"
            )
    recovered = all(len(r["events"]) >= 1 for r in results)
    identical = all(r["identical"] for r in results)
    agree = len({r["committed_step"] for r in results}) == 1
    print(
        f"recovered: {recovered}; bit-identical to the fault-free run: {identical}; "
        f"committed step {results[0]['committed_step']} on every rank: {agree}"
    )
    return 0 if recovered and identical and agree else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        # The result is printed: leave without C++ static destructors. A gloo or TCPStore thread still
        # joinable at interpreter shutdown aborts the process ("terminate called without an active
        # exception", seen here about once in a few runs), which would turn a good rank into a failed one.
        sys.stdout.flush()
        os._exit(0)
    else:
        sys.exit(main())
