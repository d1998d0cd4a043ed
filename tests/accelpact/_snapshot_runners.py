"""Scenario runner for tests/accelpact/test_snapshot_fsdp2.py: FSDP2 training with snapshots, then restores.

Each scenario trains the tiny Mistral of experiments.workloads.fsdp_models on 2 gloo ranks and saves what
accelpact.testing.compare compares with the fault-free reference (``ref``): every loss, parameter
shard and optimizer tensor. ``kind``:

- ``ref``: the plain loop (no guard, no snapshots).
- ``guarded``: under ``attach(..., snapshots=)``; also reports held steps and the blocked time. Then
  ``fresh_step`` restores that step into a FRESH model and optimizer and trains the rest of the steps
  on it: what that fresh copy ends with is what the scenario saves.
- ``rollback``: the guard's hook order by hand (before_update / step / after_commit) for
  ``until + 1`` steps, an in-place ``restore(back_to)`` of the live model, then the remaining steps.
- ``corrupt``: snapshots of every step, then rank ``corrupt_rank`` flips one byte of its newest
  slot; a fresh model restores with ``restore_latest`` (agreed step) and trains the rest.
- ``refused``: a slot of another rank, of another job token, and a restore of a step nobody holds
  are all refused, and the live model is untouched.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch

from accelpact.guard import attach, clip_gradients
from accelpact.snapshot import SnapshotConfig, SnapshotError, Snapshotter, restore_latest
from accelpact.snapshot.layout import slot_dir
from experiments.workloads.fsdp_models import batch_for, build, model_config, state_of, step_fn_for


def _plain_step(model, optimizer, step_fn, tokens, snap=None, step=None):
    loss = step_fn(tokens)
    clip_gradients(model, 1.0)
    if snap is not None:
        snap.before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if snap is not None:
        snap.after_commit(step)
    return loss


def _cfg(ctx, sc) -> SnapshotConfig:
    return SnapshotConfig(root=str(Path(ctx.out_dir) / "snapshots"), ranks_sharing_root=ctx.world_size)


def _token(sc) -> str:
    return f"job-{sc['name']}"


def _snapper(model, optimizer, ctx, sc, token=None) -> Snapshotter:
    return Snapshotter(
        model,
        optimizer,
        job_token=token or _token(sc),
        rank=ctx.rank,
        world_size=ctx.world_size,
        config=_cfg(ctx, sc),
        extra_state=lambda: {"data_position": "next"},
    )


def _save(ctx, sc, model, optimizer, losses) -> None:
    torch.save({"losses": losses, "state": state_of(model, optimizer)}, ctx.out_dir / f"{sc['name']}.rank{ctx.rank}.pt")


def run(sc: dict, ctx) -> dict:
    m = model_config()
    steps = sc["steps"]
    model, optimizer, _root, _middle = build("fsdp2", m)
    step_fn = step_fn_for(model)
    kind = sc["kind"]
    out: dict = {"error": None}
    losses: list[torch.Tensor] = []
    if kind == "ref":
        for step in range(steps):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m)))
    elif kind == "guarded":
        snap = _snapper(model, optimizer, ctx, sc)
        guard = attach(
            model,
            optimizer,
            ctx.control,
            max_grad_norm=1.0,
            snapshots=snap,
            pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
        )
        for step in range(steps):
            losses.append(guard.step(step_fn, batch_for(step, ctx.rank, m)))
        snap.flush()
        out.update(
            held=snap.held_steps(verify=True),
            snapshots=snap.snapshots,
            wait_s=snap.wait_s,
            committed=guard.committed_step,
        )
        _save(ctx, {"name": sc["name"] + "_live"}, model, optimizer, losses)
        guard.close()
        # A fresh replacement: new model and optimizer (no state), the same process group.
        fresh, fopt, _r, _m = build("fsdp2", m, seed=999)  # other init: every byte must come from the slot
        fsnap = _snapper(fresh, fopt, ctx, sc)
        extra = fsnap.restore(sc["fresh_step"])
        out["extra"] = extra
        fstep = step_fn_for(fresh)
        losses = losses[: sc["fresh_step"] + 1]
        for step in range(sc["fresh_step"] + 1, steps):
            losses.append(_plain_step(fresh, fopt, fstep, batch_for(step, ctx.rank, m)))
        fsnap.close(remove=True)
        snap.close(remove=True)
        model, optimizer = fresh, fopt
    elif kind == "rollback":
        snap = _snapper(model, optimizer, ctx, sc)
        for step in range(sc["until"] + 1):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m), snap, step))
        ids = [id(p) for p in model.parameters()] + [id(v) for s in optimizer.state.values() for v in s.values()]
        snap.restore(sc["back_to"])
        out["identity_kept"] = ids == (
            [id(p) for p in model.parameters()] + [id(v) for s in optimizer.state.values() for v in s.values()]
        )
        out["held_after_restore"] = snap.held_steps()
        losses = losses[: sc["back_to"] + 1]
        for step in range(sc["back_to"] + 1, steps):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m), snap, step))
        out["held_at_end"] = snap.held_steps()
        snap.close(remove=True)
    elif kind == "corrupt":
        snap = _snapper(model, optimizer, ctx, sc)
        for step in range(steps):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m), snap, step))
        snap.flush()
        if ctx.rank == sc["corrupt_rank"]:
            newest = max(
                (slot_dir(snap.root, snap.job_token, ctx.rank, s) for s in (0, 1)),
                key=lambda d: (d / "marker.json").stat().st_mtime,
            )
            with open(newest / "shards.bin", "r+b") as f:
                f.seek(1000)
                b = f.read(1)
                f.seek(1000)
                f.write(bytes([b[0] ^ 0x40]))
        snap.close()
        ctx.barrier(f"corrupted/{sc['name']}")
        fresh, fopt, _r, _m = build("fsdp2", m, seed=999)
        info = restore_latest(fresh, fopt, job_token=_token(sc), rank=ctx.rank, config=_cfg(ctx, sc))
        out.update(restored_step=info.step, source=info.source)
        fstep = step_fn_for(fresh)
        losses = losses[: info.step + 1]
        for step in range(info.step + 1, steps):
            losses.append(_plain_step(fresh, fopt, fstep, batch_for(step, ctx.rank, m)))
        model, optimizer = fresh, fopt
    elif kind == "refused":
        snap = _snapper(model, optimizer, ctx, sc)
        for step in range(steps):
            losses.append(_plain_step(model, optimizer, step_fn, batch_for(step, ctx.rank, m), snap, step))
        snap.flush()
        ctx.barrier(f"written/{sc['name']}")
        before = {k: v.clone() for k, v in state_of(model, optimizer).items()}
        refusals = {}
        other = slot_dir(snap.root, snap.job_token, 1 - ctx.rank, 0)
        cases = {
            "other_rank": lambda: snap.restore(0 if (other / "marker.json").exists() else 1, source=other),
            "other_token": lambda: _snapper(model, optimizer, ctx, sc, token="job-someone-else").restore(
                steps - 1, source=slot_dir(snap.root, snap.job_token, ctx.rank, 0)
            ),
            "missing_step": lambda: snap.restore(0),
        }
        for name, fn in cases.items():
            try:
                fn()
                refusals[name] = None
            except SnapshotError as exc:
                refusals[name] = str(exc)
        out["refusals"] = refusals
        out["untouched"] = all(torch.equal(before[k], v) for k, v in state_of(model, optimizer).items())
        none_for_stranger = restore_latest(
            model, optimizer, job_token="job-never-ran", rank=ctx.rank, config=_cfg(ctx, sc)
        )
        out["stranger_restores"] = none_for_stranger is not None
        snap.close(remove=True)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    out["losses"] = [float(x) for x in losses]
    _save(ctx, sc, model, optimizer, losses)
    return out
