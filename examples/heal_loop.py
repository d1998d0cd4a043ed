"""The whole loop of docs/process_loss.md and docs/launcher.md as one script, run under ``accelpact-run``.

    accelpact-run --nproc-per-node 2 examples/heal_loop.py --steps 8 --out /tmp/ref
    accelpact-run --nproc-per-node 2 examples/heal_loop.py --steps 8 --kill-in save --out /tmp/healed

What a user writes: an FSDP2 model, a LambdaLR warm-up restored through the snapshots' ``extra_state``,
an evaluation and a checkpoint save every ``--every`` steps under ``guard.run``, ``guard.finish()`` and the
final save under ``guard.run``; a replacement (started by the agent for a killed rank) rejoins the
survivors, a restarted group restores the newest snapshot every rank holds. The script ends as any
script does: ``guard.close()``, then it returns (exit 0). An ``UnrecoverableError`` ends it non-zero, so
that the agent restarts the group (``--max-restarts``).

``--kill-in step|eval|save|finish|final_save``: rank ``--kill-rank`` SIGKILLs itself there, in its first
process only (the step, evaluation and save of step ``--kill-at``; the last two at the end of the run).
``--lose-snapshots`` (with ``--kill-in``): the killed rank deletes the job's snapshots first.
``--ignore-rolled-back``: a loop with a bug (it keeps its own step after a heal), stopped by
``StateDivergedError`` at its next vote. ``--abort-at-exit RANK``: that rank aborts at interpreter exit, after it ended the run (the agent reports it
and counts the rank as done). ``--out DIR``: each rank writes its shards and optimizer state to ``DIR/rank<r>.pt`` and prints one
``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d: one line per store error, not a C++ backtrace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from train_fsdp import VOCAB, TinyLM, batch_for, local_state

import accelpact
import accelpact.run
from accelpact import snapshot
from accelpact.control import ControlChannel

PLACES = ("step", "eval", "save", "finish", "final_save")


def build_model(name: str) -> tuple[torch.nn.Module, list[torch.nn.Module], Callable[[torch.Tensor], torch.Tensor]]:
    """The model, its blocks (each sharded on its own), and tokens -> logits."""
    if name == "tiny":
        model = TinyLM()
        return model, list(model.layers), model
    import transformers  # transformers loads GPT-2's modeling module only here, at the class's first use

    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=128,
        n_layer=4,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(config)
    return model, list(model.transformer.h), lambda tokens: model(tokens).logits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every", type=int, default=4, help="evaluate and save a checkpoint every this many steps")
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--kill-in", choices=PLACES, default=None)
    ap.add_argument("--kill-at", type=int, default=3, help="the step whose step, evaluation or save is killed")
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument(
        "--lose-snapshots",
        action="store_true",
        help="with --kill-in: the killed rank first deletes "
        "the job's snapshots on its node (a restarted group must say it has nothing to resume from)",
    )
    ap.add_argument(
        "--ignore-rolled-back",
        action="store_true",
        help="a bug under test: the survivor's loop "
        "keeps its own step after a heal instead of back.resume_step (the guard names it at the next vote)",
    )
    ap.add_argument(
        "--abort-at-exit",
        type=int,
        default=None,
        metavar="RANK",
        help="this rank aborts (SIGABRT) at interpreter exit, after it ended the run: what a C++ thread "
        "alive at exit did before accelpact.shutdown; the agent must not replace it",
    )
    ap.add_argument(
        "--model",
        choices=("tiny", "gpt2"),
        default="tiny",
        help="tiny: train_fsdp.py's TinyLM; gpt2: a "
        "small transformers GPT-2 built from its config (its modeling module loads at first use)",
    )
    ap.add_argument(
        "--pause-s",
        type=float,
        default=0.0,
        help="sleep after each step (a longer step: room for the "
        "template to preload what the ranks loaded before a kill)",
    )
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def main(args: argparse.Namespace) -> dict:
    me = accelpact.run.replacement()  # None unless the agent started this process for a lost rank
    control = ControlChannel.from_env()  # the agent's store and this attempt's job token
    ticket = None
    if me is None:
        accelpact.init_process_group("gloo")
    else:
        ticket = accelpact.rejoin(control, t_launch=me.t_launch)  # INSTEAD of init_process_group
    rank, world = dist.get_rank(), dist.get_world_size()
    first_process = me is None and snapshot.restart_count() == 0

    def maybe_die(place: str, step: int) -> None:
        if (
            first_process
            and rank == args.kill_rank
            and args.kill_in == place
            and (step == args.kill_at or place in ("finish", "final_save"))
        ):
            if args.lose_snapshots:
                snap.flush()
                snapshot.remove_job(config.root, token)
            print(f"KILLED_AT {time.time()!r}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model, blocks, logits_of = build_model(args.model)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = max(args.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))

    # The snapshots' token survives a group restart (the control channel's token does not).
    token, config = snapshot.job_token_from_env(), snapshot.SnapshotConfig()
    restored = None
    if me is None and snapshot.restart_count() > 0:  # a group restart: the newest step every rank holds
        # None only when the job failed before its first snapshot (said on stderr); a token that found nothing
        # raises NoSnapshotToResumeError instead of training again from step 0
        restored = snapshot.restore_latest(model, optimizer, job_token=token, rank=rank, config=config)
    elif me is None:
        snapshot.remove_rank(config.root, token, rank)  # a new job: nothing of an earlier one is resumed
    snap = snapshot.Snapshotter(
        model,
        optimizer,
        job_token=token,
        rank=rank,
        world_size=world,
        config=config,
        extra_state=lambda: {"scheduler": scheduler.state_dict()},
    )
    guard = accelpact.attach(model, optimizer, control, snapshots=snap, heal=accelpact.HealPolicy(), rejoin=ticket)

    def resume(back: accelpact.RolledBack) -> int:  # a survivor's RolledBack, a replacement's guard.resumed
        if back.extra_state:  # {}: resumed from the initial state (step -1)
            scheduler.load_state_dict(back.extra_state["scheduler"])
            scheduler.step()  # the snapshot was taken before this step's scheduler.step()
        return back.resume_step

    if ticket is not None:
        step = resume(guard.resumed)
    elif restored is not None:
        step = resume(accelpact.RolledBack("restored", resume_step=restored.step + 1, extra_state=restored.extra_state))
        guard.resume_at(step)
    else:
        step = 0
    first_step = step

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits_of(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        maybe_die("step", guard.next_step)
        loss.backward()
        return loss.detach()

    def evaluate(at: int) -> float:  # an all-reduce of every rank's loss: a collective like any other
        with torch.no_grad():
            tokens = batch_for(10_000 + at, rank, torch.device("cpu"))
            loss = F.cross_entropy(logits_of(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        model.reshard()  # FSDP2 keeps the root's parameters unsharded after a forward with no backward
        maybe_die("eval", at)
        dist.all_reduce(loss)
        return loss.item() / world

    def save(at: int, place: str) -> None:  # a gather of every shard to rank 0, then a write: safe to run twice
        state = local_state(model, optimizer)
        maybe_die(place, at)
        norms = torch.stack([v.float().norm() for v in state.values()])
        gathered = [torch.zeros_like(norms) for _ in range(world)] if rank == 0 else None
        dist.gather(norms, gathered, dst=0)
        if rank == 0 and args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            torch.save(torch.stack(gathered), args.out / f"checkpoint_{place}.pt")

    losses: dict[int, float] = {}
    evals: dict[int, float] = {}
    while True:
        try:
            if step >= args.steps:
                maybe_die("finish", step)
                guard.finish()  # every rank agrees the run ended
                guard.run(save, step, "final_save")  # the final save, under the guard too
                break
            # step=: the vote carries the loop's step, so a loop out of step with its peers is named at once
            losses[step] = guard.step(step_fn, batch_for(step, rank, torch.device("cpu")), step=step).item()
            scheduler.step()
            if args.pause_s:
                time.sleep(args.pause_s)
            if (step + 1) % args.every == 0:
                guard.run(save, step, "save")
                evals[step] = guard.run(evaluate, step)
        except accelpact.RolledBack as back:  # a heal moved this rank back: run from there
            if args.ignore_rolled_back:  # the bug: carry on as if nothing had moved
                step += 1
                continue
            step = resume(back)
            continue
        except accelpact.UnrecoverableError as exc:  # no heal possible: exit non-zero, the agent restarts the group
            print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            guard.close()
            sys.exit(3)
        step += 1
    guard.close()  # after finish: the agent and a late replacement read that this rank ended the run
    if args.abort_at_exit == rank:
        import atexit

        atexit.register(os.abort)

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save({"state": local_state(model, optimizer)}, args.out / f"rank{rank}.pt")
    return {
        "rank": rank,
        "pid": os.getpid(),
        "replacement": None if me is None else me.number,
        "restart": snapshot.restart_count(),
        "first_step": first_step,
        "committed_step": guard.committed_step,
        "restored": None if restored is None else restored.step,
        "held": None if restored is None else {str(r): s for r, s in (restored.held or {}).items()},
        "heals": [
            {
                "role": e.role,
                "resume_step": e.resume_step,
                "source": e.source,
                "t": e.t,
                "total_s": e.total_s,
                "replacement_start_s": e.replacement_start_s,
            }
            for e in guard.heal_events
        ],
        "losses": losses,
        "evals": evals,
        "lr": scheduler.get_last_lr()[0],
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(parse_args())), flush=True)
