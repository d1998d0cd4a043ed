"""Scenario runners for the detection tests: a rank that dies for real, a slow step; survivors time it.

Named as ``tests.accelpact._detection_runners:<function>`` in a session launched by
accelpact.testing.session.run_session (a plain launch: no parent writes death notices, so a dead
rank is found by the survivors' own heartbeat rule).
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

from accelpact.errors import RankLostError
from accelpact.guard import attach
from accelpact.testing.rank import RankContext
from experiments.workloads.fsdp_models import batch_for, build, model_config, step_fn_for


def die(sc: dict, ctx: RankContext) -> dict:
    """Rank ``sc["victim"]`` SIGKILLs itself inside step_fn of step ``sc["at_step"]`` (after writing the
    wall time to ``died.json``); the survivors record when and how they learnt of it."""
    m = model_config(None)
    model, optimizer, _root, _middle = build("fsdp2", m)
    guard = attach(
        model,
        optimizer,
        ctx.control,
        max_grad_norm=1.0,
        pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
        heartbeat_interval_s=sc.get("heartbeat_interval_s", 0.5),
    )
    inner = step_fn_for(model)
    victim, at_step = sc["victim"], sc["at_step"]

    def step_fn(batch):
        if ctx.rank == victim and guard.next_step == at_step:
            (ctx.out_dir / "died.json").write_text(json.dumps({"t": time.time(), "pid": os.getpid()}))
            os.kill(os.getpid(), signal.SIGKILL)
        return inner(batch)

    ctx.barrier(f"built/{sc['name']}")
    try:
        for step in range(sc["steps"]):
            guard.step(step_fn, batch_for(step, ctx.rank, m))
    except RankLostError as exc:
        return {
            "t_raised": time.time(),
            "ranks": list(exc.ranks),
            "detected_by": exc.detected_by,
            "generation": exc.generation,
            "last_committed_step": exc.last_committed_step,
            "message": str(exc)[:1000],
            "error": None,
        }
    finally:
        guard.close()
    return {"t_raised": None, "error": None}


def train(sc: dict, ctx: RankContext) -> dict:
    """Train ``steps`` steps, guarded unless ``guard`` is False (the fault-free reference).

    ``stop``: ``{"rank", "step"}``: that rank writes ``stopped.json`` and SIGSTOPs itself inside
    step_fn (the test process continues it). ``slow``: ``{"rank", "step", "factor"}``: that rank
    sleeps ``factor`` x its median step so far inside step_fn. Saves the state for the comparison.
    """
    import statistics

    import torch

    from experiments.workloads.fsdp_models import state_of

    m = model_config(None)
    model, optimizer, _root, _middle = build("fsdp2", m)
    guard = None
    if sc.get("guard", True):
        guard = attach(
            model,
            optimizer,
            ctx.control,
            max_grad_norm=1.0,
            pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
            stall_timeout_s=sc.get("stall_timeout_s"),
        )
    inner = step_fn_for(model)
    stop, slow = sc.get("stop"), sc.get("slow")
    times: list[float] = []
    state = {"step": 0}

    def step_fn(batch):
        if stop and ctx.rank == stop["rank"] and state["step"] == stop["step"]:
            (ctx.out_dir / "stopped.json").write_text(json.dumps({"t": time.time(), "pid": os.getpid()}))
            stop["rank"] = -1  # once: the retried step must not stop again
            os.kill(os.getpid(), signal.SIGSTOP)
        if slow and ctx.rank == slow["rank"] and state["step"] == slow["step"]:
            pause = slow["factor"] * statistics.median(times)
            (ctx.out_dir / "slow.json").write_text(json.dumps({"t": time.time(), "sleep_s": pause}))
            slow["rank"] = -1
            time.sleep(pause)
        return inner(batch)

    ctx.barrier(f"built/{sc['name']}")
    losses = []
    for step in range(sc["steps"]):
        state["step"] = step
        batch = batch_for(step, ctx.rank, m)
        t = time.perf_counter()
        if guard is not None:
            losses.append(guard.step(step_fn, batch))
        else:
            from accelpact.guard import clip_gradients

            losses.append(step_fn(batch))
            clip_gradients(model, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    events = [e.to_dict() for e in guard.events] if guard is not None else []
    if guard is not None:
        guard.close()
    torch.save({"losses": losses, "state": state_of(model, optimizer)}, ctx.out_dir / f"{sc['name']}.rank{ctx.rank}.pt")
    return {"events": events, "step_s": times, "error": None}
