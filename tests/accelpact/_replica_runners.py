"""Scenario runner for tests/accelpact/test_replica_restore.py: 2 FSDP2 gloo ranks, each on its own
simulated host (its own snapshot root), snapshot every step and push each slot to the other.

- ``ref``: the plain loop for ``total`` steps (the fault-free reference).
- ``buddy``: ``steps`` steps with snapshots + buddy pushes; rank 0's own snapshot directory is deleted;
  both ranks build a FRESH model and optimizer and call ``restore_latest(..., fetch=replication)``:
  rank 0 loads its buddy's replica, rank 1 its own slot; both train on to ``total``.
  ``push_every`` (default 1): only every k-th snapshot is pushed; each rank reports its own slots' steps
  (``own_steps``) and the steps of the replicas it holds for its ward (``replica_steps``) before the loss.
- ``both_lost``: the same, and rank 1 also drops the replica it holds for rank 0: ``restore_latest``
  raises BuddyLostError on both ranks, naming rank 0 and its buddy rank 1.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from accelpact.snapshot import SnapshotConfig, SnapshotError, Snapshotter, restore_latest
from accelpact.snapshot import layout as paths
from accelpact.snapshot._replica_server import read_marker
from accelpact.snapshot.replica import BuddyLostError, Replication
from experiments.workloads.fsdp_models import batch_for, build, model_config, state_of, step_fn_for
from tests.accelpact._snapshot_runners import _plain_step  # the same plain step with snapshot hooks


def run(sc: dict, ctx) -> dict:
    m = model_config()
    model, optimizer, _root, _middle = build("fsdp2", m)
    step_fn = step_fn_for(model)
    losses: list[torch.Tensor] = []
    out: dict = {"error": None}
    if sc["kind"] == "ref":
        for step in range(sc["total"]):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m)))
    else:
        token = f"job-{sc['name']}"
        root = Path(ctx.out_dir) / sc["name"] / f"host{ctx.rank}"  # each rank a host with its own shm
        cfg = SnapshotConfig(root=str(root), ranks_sharing_root=1, push_every=sc.get("push_every", 1))
        rep = Replication(
            ctx.control, rank=ctx.rank, world_size=ctx.world_size, root=root, bind_host="127.0.0.1", job_token=token
        )
        snap = Snapshotter(
            model,
            optimizer,
            job_token=token,
            rank=ctx.rank,
            world_size=ctx.world_size,
            config=cfg,
            on_complete=rep.push,
            extra_state=lambda: {"data_position": "next"},
        )
        for step in range(sc["steps"]):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m), snap, step))
        snap.flush()
        assert rep.flush(120)
        out["own_steps"] = sorted(snap.held_steps())
        snap.close()
        out["push"] = rep.stats()
        ward = 1 - ctx.rank
        out["replica_steps"] = sorted(
            rm["step"] for s in paths.SLOTS if (rm := read_marker(paths.replica_dir(root, token, ward, s))) is not None
        )
        ctx.barrier(f"pushed/{sc['name']}")
        if ctx.rank == 0:
            shutil.rmtree(root / token / "rank0")  # rank 0's own snapshots are lost
        if sc["kind"] == "both_lost" and ctx.rank == 1:
            shutil.rmtree(root / token / "replica" / "rank0", ignore_errors=True)  # and so is its buddy's copy
        ctx.barrier(f"lost/{sc['name']}")
        fresh, fopt, _r, _m = build("fsdp2", m, seed=999)  # another init: every byte must come from a copy
        try:
            info = restore_latest(fresh, fopt, job_token=token, rank=ctx.rank, config=cfg, fetch=rep)
        except SnapshotError as exc:
            out.update(lost=isinstance(exc, BuddyLostError), message=str(exc), ranks=list(getattr(exc, "ranks", ())))
            rep.close(remove=True)
            return out
        out.update(step=info.step, source=info.source, extra=info.extra_state)
        fstep = step_fn_for(fresh)
        losses = losses[: info.step + 1]
        for step in range(info.step + 1, sc["total"]):
            losses.append(_plain_step(fresh, fopt, fstep, batch_for(step, ctx.rank, m)))
        model, optimizer = fresh, fopt
        ctx.barrier(f"done/{sc['name']}")  # the buddy serves until both restored
        rep.close(remove=True)
        shutil.rmtree(root, ignore_errors=True)
    out["losses"] = [float(x) for x in losses]
    torch.save({"losses": losses, "state": state_of(model, optimizer)}, ctx.out_dir / f"{sc['name']}.rank{ctx.rank}.pt")
    return out
