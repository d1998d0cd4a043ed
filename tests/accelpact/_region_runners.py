"""Scenario runner for test_guard_run: steps with an evaluation between them, under ``guard.run``.

Named as ``tests.accelpact._region_runners:run`` in a session of accelpact.testing.session.run_session.
Each step is ``guard.step`` (or a plain step for the reference, ``guard: False``), then an evaluation: a
forward of a held-out batch under no_grad, the ``eval`` fault point, and an all-reduce of its loss (the
user's own collective). Faults come from accelpact.testing.FaultInjector (real socket resets). Saves every
parameter and optimizer shard to ``{name}.rank{rank}.pt`` and returns every step's and evaluation's loss.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelpact import testing as fault_testing
from accelpact.guard import attach
from experiments.workloads.fsdp_models import batch_for, build, model_config, state_of, step_fn_for
from experiments.workloads.fsdp_scenarios import _arm, _plain_step

if TYPE_CHECKING:
    from accelpact.testing.rank import RankContext


def run(sc: dict, ctx: RankContext) -> dict:
    rank = ctx.rank
    m = model_config(sc.get("model"))
    model, optimizer, root, middle = build("fsdp2", m, None)
    injector = fault_testing.FaultInjector(exclude_ports=ctx.exclude_ports)
    injector.install(root, middle)
    _arm(injector, sc, rank)
    step_fn = step_fn_for(model)
    guard = None
    if sc.get("guard", True):
        guard = attach(
            model,
            optimizer,
            ctx.control,
            max_grad_norm=1.0,
            pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
            injection_clock=injector.consume_injection_time,
        )
        guard.phase_hooks.append(injector.on_phase)
    runs = {"eval": 0}

    def evaluate(step: int) -> float:
        runs["eval"] += 1
        tokens = batch_for(10_000 + step, rank, m)
        with torch.no_grad():
            loss = model(input_ids=tokens, labels=tokens).loss.detach().reshape(1).clone()
        injector.maybe_fire("eval", step)
        dist.all_reduce(loss)
        return float(loss.item()) / ctx.world_size

    result: dict[str, Any] = {"error": None, "losses": [], "evals": []}
    losses: list[torch.Tensor] = []
    try:
        for step in range(sc["steps"]):
            tokens = batch_for(step, rank, m)
            if guard is not None:
                injector.begin_step(step)
                loss = guard.step(step_fn, tokens)
                result["evals"].append(guard.run(evaluate, step))
            else:
                loss = _plain_step(model, optimizer, injector, step_fn, tokens, step)
                result["evals"].append(evaluate(step))
            result["losses"].append(float(loss))
            losses.append(loss.detach().reshape(()).clone())
        if guard is not None:
            guard.finish()
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        result["error"] = ctx.error(exc)
    result["eval_runs"] = runs["eval"]
    if guard is not None:
        result["events"] = [e.to_dict() for e in guard.events]
        result["finished"] = guard.finished
        guard.close()
    injector.remove()
    result["fired"] = [{"step": f.step, "phase": f.phase} for f in injector.fired]
    if result["error"] is None:
        torch.save({"losses": losses, "state": state_of(model, optimizer)}, ctx.out_dir / f"{sc['name']}.rank{rank}.pt")
    return result
