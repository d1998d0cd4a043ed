"""A torchrun-style FSDP2 script whose lost rank is healed in memory, under ``accelpact.run``.

    python -m accelpact.run --nproc-per-node 2 examples/train_heal.py --steps 10 --out /tmp/ref
    python -m accelpact.run --nproc-per-node 2 examples/train_heal.py --steps 10 --kill-at 4 --out /tmp/healed

The same script runs under plain ``torchrun`` (then nothing is healed: torchrun restarts every rank).
What it adds to an FSDP2 loop (lines marked ``accelpact``): per-step snapshots into shared memory (with
the LR scheduler's state in each snapshot's ``extra_state``), a heal policy, ``guard.finish()`` after the
last step, and the two ways a process starts:

- a rank started with the group calls ``accelpact.init_process_group``; after a group restart
  (``TORCHELASTIC_RESTART_COUNT`` > 0) it restores the newest snapshot every rank holds;
- a replacement (``accelpact.run.replacement()`` is not None: the launcher set ``ACCELPACT_REPLACEMENT``)
  calls ``accelpact.rejoin`` instead, builds the model as every rank did, and ``attach(rejoin=ticket)``
  loads the resume step from the dead process's snapshot; the survivors keep their live state. The
  replacement's ``guard.resumed`` and a survivor's ``RolledBack`` carry the loaded snapshot's
  ``extra_state``: both restore the LR scheduler from it (``resume``).

``--warmup-steps N``: a linear LR warm-up over N steps (default 10: the learning rate changes at every
step of a short run, so a scheduler left at its fresh state on a replacement would change the result).

``--hsdp R``: HSDP over an ``(R, world // R)`` mesh; a replacement builds that mesh from the survivors'
groups with ``ticket.device_mesh`` (``init_device_mesh`` there would create groups nobody else joins).

``--replicas``: each snapshot is also pushed to a buddy rank on the next node
(accelpact.snapshot.replica); ``--lose-host`` (with ``--kill-at``): before dying, the killed rank deletes
its node's shared memory of this job (its own slots and the replicas it held), so its replacement can
only heal from the buddy's replica. ``--pause-s S``: sleep after each step (a test's room to inject a network fault from outside).
``--kill-at STEP``: rank ``--kill-rank`` SIGKILLs itself in that step, between forward and backward
(first process of that rank only). ``--late-rank R --late-s S`` (with ``--kill-at``): rank R sleeps S s after
its forward in that step, a straggling survivor that learns of the death only after the replacement is up
(first process of that rank only). ``--reset-in-heal`` (with ``--kill-at``): every survivor resets its own data-plane
connections (not the store's) right before the heal's first collective, once: a link fault inside the heal,
which the survivors and the replacement retry in the next generation. ``--out DIR``: each rank writes its shards, optimizer state and the
losses it committed to ``DIR/rank<r>.pt``, for a tensor-by-tensor comparison with a fault-free run, and
prints one ``RESULT {json}`` line (pid, heals, where the state came from).
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

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # see train_fsdp.py: one line per error, not a backtrace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_fsdp import VOCAB, TinyLM, batch_for, local_state

import accelpact
import accelpact.run
from accelpact import snapshot
from accelpact.control import ControlChannel

EXIT_UNRECOVERABLE = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=10, help="linear LR warm-up over this many steps")
    ap.add_argument("--kill-at", type=int, default=None, help="rank --kill-rank SIGKILLs itself in this step")
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--replicas", action="store_true", help="push each snapshot to a buddy rank on the next node")
    ap.add_argument(
        "--lose-host",
        action="store_true",
        help="with --kill-at: the killed rank's node also loses "
        "this job's shared memory (its own snapshots and the replicas it held), as a lost host would",
    )
    ap.add_argument("--push-every", type=int, default=1, help="with --replicas: push only every k-th snapshot")
    ap.add_argument("--confirm-push", action="store_true", help="with --replicas: a push completes its snapshot")
    ap.add_argument(
        "--max-tax",
        type=float,
        default=None,
        help="a budget for the snapshots' cost (e.g. 0.03): after a warm-up the ranks agree on the densest "
        "cadence that fits (--push-every is then the warm-up's)",
    )
    ap.add_argument("--max-bound", type=int, default=16, help="with --max-tax: replay at most this many steps")
    ap.add_argument("--tax-warmup", type=int, default=8, help="with --max-tax: steps measured before choosing")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--hsdp",
        type=int,
        default=None,
        metavar="REPLICAS",
        help="HSDP: shard over a (REPLICAS, world // REPLICAS) mesh (replicate, shard) instead of 1-D",
    )
    ap.add_argument("--pause-s", type=float, default=0.0, help="sleep after each step (room for a test to act)")
    ap.add_argument(
        "--late-rank",
        type=int,
        default=None,
        help="with --kill-at: this rank sleeps --late-s after its "
        "forward in that step, a straggler that learns of the death after the replacement is up",
    )
    ap.add_argument("--late-s", type=float, default=0.0)
    ap.add_argument(
        "--reset-in-heal",
        action="store_true",
        help="with --kill-at: survivors reset their data-plane "
        "connections right before the heal's first collective, once",
    )
    return ap.parse_args(argv)


def reset_before_heal_collective(step: int, control: ControlChannel) -> Callable[[str, int], None]:
    """A guard phase hook: at the heal of ``step``, once, reset this rank's TCP connections except the
    store's (the data plane's links to its peers and to the replacement), as a flapping link would."""
    fired = [False]

    def hook(phase: str, at: int) -> None:
        if phase == "recovery" and at == step and not fired[0]:
            from accelpact.inject import reset_own_gloo_sockets

            fired[0] = True
            n = reset_own_gloo_sockets(exclude_ports=[int(control.config.port)])
            print(
                f"rank {control.rank}: reset {n} data-plane connection(s) before the heal's first collective",
                flush=True,
            )

    return hook


def main(args: argparse.Namespace) -> dict:
    device = torch.device("cpu")
    me = accelpact.run.replacement()  # accelpact: None unless the launcher started this process for a lost rank
    control = ControlChannel.from_env()  # accelpact: the launcher's store and job token
    ticket = None
    if me is None:
        accelpact.init_process_group("gloo")  # accelpact: a store prefix of its own per restart attempt
    else:
        ticket = accelpact.rejoin(control, t_launch=me.t_launch)  # accelpact: the survivors' groups
    rank, world = dist.get_rank(), dist.get_world_size()

    mesh = None
    if args.hsdp:  # HSDP: replicate across args.hsdp groups, shard within each
        if world % args.hsdp:
            raise SystemExit(f"--hsdp {args.hsdp} must divide the world size {world}")
        shape, names = (args.hsdp, world // args.hsdp), ("replicate", "shard")
        # accelpact: a replacement builds the mesh from the survivors' groups (init_device_mesh would make new ones)
        mesh = (
            init_device_mesh("cpu", shape, mesh_dim_names=names)
            if ticket is None
            else ticket.device_mesh("cpu", shape, mesh_dim_names=names)
        )
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = TinyLM().to(device)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = max(args.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))

    def resume(extra_state: dict) -> None:  # accelpact: after a snapshot of step S - 1 was loaded
        if extra_state:  # {}: resumed from the initial state (step -1), where a fresh scheduler is right
            scheduler.load_state_dict(extra_state["scheduler"])
            scheduler.step()  # the snapshot is taken inside guard.step, before the loop's scheduler.step()

    token, config = (
        snapshot.job_token_from_env(),
        snapshot.SnapshotConfig(
            push_every=args.push_every, max_tax=args.max_tax, max_bound=args.max_bound, tax_warmup=args.tax_warmup
        ),
    )  # accelpact
    restored = None
    if me is None and snapshot.restart_count() > 0:  # accelpact: a restarted group resumes from the snapshots
        restored = snapshot.restore_latest(model, optimizer, job_token=token, rank=rank, config=config)
    elif me is None:
        snapshot.remove_rank(config.root, token, rank)  # a new job: nothing of an earlier one is resumed
    replication = None
    if args.replicas:  # accelpact: each slot also goes to the buddy (same local rank on the next node)
        from accelpact.snapshot.replica import Replication

        replication = Replication.from_env(control, job_token=token, confirm=args.confirm_push)
    snap = snapshot.Snapshotter(
        model,
        optimizer,
        job_token=token,
        rank=rank,
        world_size=world,
        config=config,
        on_complete=replication.push if replication is not None else None,
        extra_state=lambda: {"scheduler": scheduler.state_dict()},
    )  # accelpact
    policy = accelpact.HealPolicy(
        fetch_replica=replication.fetch if replication is not None else None,
        buddy_of=(lambda r: replication.buddy) if replication is not None else None,
    )
    guard = accelpact.attach(
        model, optimizer, control, max_grad_norm=1.0, snapshots=snap, heal=policy, rejoin=ticket
    )  # accelpact
    if ticket is not None:
        step = guard.resumed.resume_step  # accelpact: the resume step the heal agreed on
        resume(guard.resumed.extra_state)  # accelpact: the LR schedule as the loaded snapshot saved it
    elif restored is not None:
        step = restored.step + 1
        resume(restored.extra_state)
        guard.resume_at(step)
    else:
        step = 0
    first_step = step

    killing = args.kill_at is not None and rank == args.kill_rank and me is None and snapshot.restart_count() == 0
    if args.reset_in_heal and args.kill_at is not None and rank != args.kill_rank and me is None:
        guard.phase_hooks.append(reset_before_heal_collective(args.kill_at, control))
    late = [args.kill_at is not None and rank == args.late_rank and me is None]  # once, in the first attempt

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        if killing and guard.next_step == args.kill_at:
            if args.lose_host:  # the node's shared memory goes with it: only the buddy's replica survives
                snap.flush()
                snapshot.remove_job(config.root, token)
            os.kill(os.getpid(), signal.SIGKILL)  # a lost process, mid-step
        if late[0] and guard.next_step == args.kill_at:
            late[0] = False
            time.sleep(args.late_s)
        loss.backward()
        return loss.detach()

    losses: dict[int, float] = {}
    while True:
        try:
            if step >= args.steps:
                guard.finish()  # accelpact: every rank agrees the run ended (a rank lost after the last vote heals here)
                break
            losses[step] = guard.step(step_fn, batch_for(step, rank, device), step=step).item()  # accelpact
            scheduler.step()
        except accelpact.RolledBack as back:  # accelpact: a heal moved this rank back: run from there
            step = back.resume_step
            resume(back.extra_state)
            continue
        except accelpact.UnrecoverableError as exc:  # accelpact: the launcher restarts the group from snapshots
            print(
                f"rank {rank}: in-memory recovery impossible at step {step}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            guard.close()
            sys.exit(EXIT_UNRECOVERABLE)
        print(f"rank {rank} step {step} loss {losses[step]:.6f}", flush=True)
        step += 1
        if args.pause_s:
            time.sleep(args.pause_s)
    guard.close()  # accelpact: after finish, a replacement arriving now is told the run ended
    if replication is not None:
        replication.close()
    snap.close(remove=False)  # the agent's next attempt (if any) may still need them; /dev/shm is per job token

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
        "restored": None if restored is None else {"step": restored.step, "source": restored.source},
        "recoveries": guard.events.total,
        "heals": [
            {
                "role": e.role,
                "resume_step": e.resume_step,
                "source": e.source,
                "own_source": e.own_source,
                "replayed": e.replayed_steps,
                "total_s": round(e.total_s, 3),
                "replacement_start_s": round(e.replacement_start_s, 3),
                "heal_transfer_s": round(e.heal_transfer_s, 3),
                "bytes_read_from_disk": e.bytes_read_from_disk,
                "data_plane": e.data_plane,
                "rounds": e.rounds,
                "generation": e.generation,
                "lost_ranks": e.lost_ranks,
            }
            for e in guard.heal_events
        ],
        "losses": losses,
        "cadence": None
        if snap.budget is None
        else {
            "decision": snap.budget.decision,
            "schedule": None if snap.budget.schedule is None else snap.budget.schedule.to_text(),
        },
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(parse_args())), flush=True)
    # An ordinary exit: guard.close() and accelpact.shutdown end accelpact's threads before the interpreter
    # finalizes (a thread inside a torch call then used to abort a finished rank: SIGABRT).
