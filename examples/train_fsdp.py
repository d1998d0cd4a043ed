"""A plain FSDP2 training script with accelpact attached, launched by torchrun.

    torchrun --nproc-per-node 2 examples/train_fsdp.py --steps 8
    torchrun --nproc-per-node 2 examples/train_fsdp.py --steps 8 --fault 3:vote:reset --out /tmp/faulted
    torchrun --nproc-per-node 2 --max-restarts 1 examples/train_fsdp.py --steps 8 --snapshots --kill-at 5

Everything but the lines marked ``accelpact`` is what the script did before: init the process group
from torchrun's environment, build a small decoder-only language model, shard it with
``fully_shard``, build the optimizer after sharding, train. accelpact adds a control channel (torchrun's
own store, see ``ControlChannel.from_torchrun``), ``attach`` and ``guard.step``.

``--fault STEP:PHASE:ACTION`` makes rank ``--fault-rank`` inject one real fault (``reset``: shut down
its own gloo connections) at that step and phase, through ``accelpact.testing.FaultInjector``
(docs/fault_injection.md). ``--out DIR`` writes each rank's local shards, optimizer state and losses to
``DIR/rank{r}.pt`` so that two runs can be compared tensor by tensor. Runs on CPU (gloo); with CUDA
it picks nccl, one GPU per local rank (that path has not been run on this CPU-only project machine).

``--snapshots`` (accelpact.snapshot): after every committed step each rank copies its shard into
shared memory (``$ACCELPACT_SNAPSHOT_ROOT``, default ``/dev/shm/accelpact``). A worker group that
torchrun restarted (``--max-restarts``) first calls ``restore_latest``: every rank loads the newest
step all ranks hold and the loop continues after it; no checkpoint file exists or is read. At a clean
exit the snapshots are removed. ``--kill-at STEP`` makes rank ``--fault-rank`` SIGKILL itself in the
middle of that step (between forward and backward), in the first attempt only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

# accelpact: c10d's TCPStore client logs every failed store request as a C++ warning with the whole C++
# backtrace ("Exception raised from ... frame #0 ..."), 2-3 per rank when torchrun's agent (the control
# store) dies, on top of accelpact's one line per rank. The error text reaches Python anyway, in the
# exception accelpact reports. Read by libtorch when it loads, so before `import torch`;
# TORCH_CPP_LOG_LEVEL=WARNING in the environment shows them again.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import accelpact  # accelpact
from accelpact.control import ControlChannel  # accelpact

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 512, 64, 4, 4, 32, 4
EXIT_UNRECOVERABLE = 3  # a rank stopped on an accelpact.UnrecoverableError


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token and position embeddings, LAYERS blocks, a final norm and an LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def batch_for(step: int, rank: int, device: torch.device) -> torch.Tensor:
    """Deterministic tokens, a function of (step, rank) only: a retried step sees the same batch."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g).to(device)


def local_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This rank's shards of every parameter and optimizer tensor (no collective needed)."""
    out = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = p.to_local().detach().cpu().clone()
        for key, value in sorted(optimizer.state[p].items()):
            value = value.to_local() if hasattr(value, "to_local") else value
            out[f"optim/{name}/{key}"] = value.detach().cpu().clone()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--fault", default=None, help="STEP:PHASE:ACTION, e.g. 3:vote:reset (one injected fault)")
    ap.add_argument("--fault-rank", type=int, default=1, help="the rank that injects --fault")
    ap.add_argument("--out", type=Path, default=None, help="write rank{r}.pt (state and losses) here")
    ap.add_argument(
        "--snapshots", action="store_true", help="per-step shared-memory snapshots; restore after a restart"
    )
    ap.add_argument(
        "--kill-at", type=int, default=None, help="rank --fault-rank SIGKILLs itself in this step (first attempt)"
    )
    ap.add_argument("--pause-s", type=float, default=0.0, help="sleep after each step (room for a test to act)")
    return ap.parse_args(argv)


def main(args: argparse.Namespace) -> dict:
    from torch.distributed.fsdp import fully_shard

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # accelpact: env:// from torchrun's variables, on a store prefix of its own per restart attempt (plain
    # dist.init_process_group fails after a --max-restarts restart: accelpact/dataplane/process_group.py)
    accelpact.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = TinyLM().to(device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # after fully_shard
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(args.steps, 1))

    losses: list[torch.Tensor] = []
    current: dict[str, torch.Tensor] = {}  # the loss of the step being committed (the snapshot keeps it)
    start, snap, restored = 0, None, None
    if args.snapshots:  # accelpact.snapshot
        from accelpact import snapshot

        token = snapshot.job_token_from_env()  # the run id: the same after a restart
        config = snapshot.SnapshotConfig()
        if snapshot.restart_count() > 0:
            # Every rank loads the newest step all ranks hold (they agree over the process group).
            restored = snapshot.restore_latest(model, optimizer, job_token=token, rank=rank, config=config)
        else:
            # A new job: whatever this rank's directory holds is from an earlier job with this run id.
            snapshot.remove_rank(config.root, token, rank)
        snap = snapshot.Snapshotter(
            model,
            optimizer,
            job_token=token,
            rank=rank,
            world_size=dist.get_world_size(),
            config=config,
            extra_state=lambda: {"scheduler": scheduler.state_dict(), "losses": [*losses, current["loss"]]},
        )
        if restored is not None:
            scheduler.load_state_dict(restored.extra_state["scheduler"])
            losses = list(restored.extra_state["losses"])
            scheduler.step()  # what the loop did after guard.step of the restored step (the snapshot precedes it)
            start = restored.step + 1

    control = ControlChannel.from_env()  # accelpact: torchrun's store and run id unless ACCELPACT_* are set
    guard = accelpact.attach(model, optimizer, control, max_grad_norm=1.0, snapshots=snap)  # accelpact
    if start:
        guard.resume_at(start)  # accelpact: step numbers continue after the restored step
    if args.fault:  # accelpact.testing: inject one real fault into this run
        from accelpact.backends import generations as comm
        from accelpact.testing import FaultInjector

        step, phase, action = args.fault.split(":")
        # Spare every store connection (torchrun's store carries the control channel and the
        # rendezvous); only the data-plane (gloo) connections are reset.
        injector = FaultInjector(exclude_ports=comm.store_ports([control.config.port]))
        if rank == args.fault_rank:
            injector.arm(int(step), phase, action)
        guard.injection_clock = injector.consume_injection_time
        guard.phase_hooks.append(injector.on_phase)  # step_start, clip_allreduce, vote, post_vote, recovery
        injector.install(model, model.layers[LAYERS // 2])  # the forward / backward phases

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        """Forward and backward; the guard runs the optimizer step once all ranks agree."""
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        if killing and guard.next_step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a lost process, mid-step
        loss.backward()
        current["loss"] = loss.detach()
        return loss.detach()

    killing = (
        args.kill_at is not None
        and rank == args.fault_rank
        and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    )
    for step in range(start, args.steps):
        try:
            losses.append(
                guard.step(step_fn, batch_for(step, rank, device))
            )  # accelpact: was step_fn + optimizer.step()
        except accelpact.UnrecoverableError as exc:  # accelpact: a rank or the control store is gone
            # Not recoverable in memory (the message names what was lost and the last committed step):
            # a real job restores its newest checkpoint (or, with --snapshots under torchrun
            # --max-restarts, its snapshot after the restart); this example stops.
            print(
                f"rank {rank}: in-memory recovery impossible at step {step}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(EXIT_UNRECOVERABLE)
        scheduler.step()  # after guard.step: the step has been committed on every rank
        if rank == 0:
            print(f"step {step} loss {losses[-1].item():.4f}", flush=True)
        if args.pause_s:
            time.sleep(args.pause_s)
    if snap is not None:
        snap.close(remove=True)  # a clean exit leaves nothing in shared memory

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"losses": [x.cpu() for x in losses], "state": local_state(model, optimizer)}, args.out / f"rank{rank}.pt"
        )
    return {
        "rank": rank,
        "committed_step": guard.committed_step,
        "token": control.job_token,
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "restored": None
        if restored is None
        else {
            "step": restored.step,
            "source": restored.source,
            "nbytes": restored.nbytes,
            "load_s": round(restored.load_s, 4),
            "held": restored.held,
        },
        "snapshot_wait_s": None if snap is None else round(snap.wait_s, 4),
        "control": f"{control.config.host}:{control.config.port}",
        "events": [
            {"step": e.step, "action": e.decision["action"], "total_ms": round(e.total_s * 1e3, 1)}
            for e in guard.events
        ],
    }


if __name__ == "__main__":
    result = main(parse_args())
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without C++ static destructors: a gloo or TCPStore thread still joinable at interpreter
    # shutdown can abort the process with SIGABRT (seen in CI), turning a finished rank into a failed one.
    os._exit(0)
