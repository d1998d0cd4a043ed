"""Scenario runners for multi-rank sessions: train the tiny decoder with or without faults, time rebinds.

``run`` is the runner the tests, the experiments and the benchmarks name in
``accelpact.testing.session.run_session(..., runner="experiments.workloads.fsdp_scenarios:run")``. Each
caller keeps its own list of scenarios; this module only says what a scenario of each kind does.

``kind: "train"`` (the default): N steps of the model of :mod:`experiments.workloads.fsdp_models`, either a
plain loop (``guard: False``, the fault-free reference) or under an attached guard with faults armed
through accelpact.testing.FaultInjector (real socket resets, stalls, dead ranks, resets during
recovery). Records every loss, every recovery event, the injections, optional resources and
dynamo's counters, and saves every local parameter shard and optimizer-state tensor to
``{name}.rank{rank}.pt`` for :mod:`accelpact.testing.compare`. Keys: ``steps``, ``flavour`` and
``compile`` (default: the session's settings), ``model`` (size overrides), ``faults`` (list of
``{step, phase, ranks, action?, stall_s?}``), ``pg_timeout_s`` (a short collective timeout set
after every rank built its model), ``verify_rebind``, ``reset`` (ResetConfig fields),
``leak_check`` (resources after step 0 and after teardown), ``track_resources`` (after every
step), ``progress`` (with ``track_resources``: append each step's resources and new recovery events
as one JSON line to ``progress.{name}.rank{rank}.jsonl``, flushed at once, so that a run killed
part-way keeps its data), ``settle_s`` (after the last step, wait this long, e.g. past the PG
timeout of abandoned generations, and record ``resources_settled``), ``resources_barrier`` (default
True: line the ranks up on the control store before the first and last samples), ``pause_s`` (sleep
after every step), ``heartbeat_misses`` (missed beats before a peer whose connection dropped is
called dead; default 4), ``save_state`` (default True).

``kind: "rebind"``: for each depth in ``depths``, build the model, run one step (FSDP initialises
lazily), build the binding table and time ``rebinds`` swaps back and forth between the live groups
and a second real set of groups with the same members.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelpact import ResetConfig
from accelpact import testing as fault_testing
from accelpact.guard import attach, clip_gradients
from accelpact.testing import BindingTable
from experiments.workloads.fsdp_models import (
    batch_for,
    build,
    dynamo_counters,
    model_config,
    resources,
    set_pg_timeout,
    state_of,
    step_fn_for,
)
from experiments.workloads.memory_probe import fd_kinds

if TYPE_CHECKING:  # only for the hints: runners are also used with an accelpact that predates it
    from accelpact.testing.rank import RankContext

__all__ = ["RUNNER", "run", "train", "rebind"]

RUNNER = f"{__name__}:run"  # what callers pass to run_session


def run(sc: dict, ctx: RankContext) -> dict:
    """The scenario runner: dispatch on ``sc["kind"]`` (default "train")."""
    kinds = {"train": train, "rebind": rebind}
    kind = sc.get("kind", "train")
    if kind not in kinds:
        raise ValueError(f"scenario {sc['name']!r}: unknown kind {kind!r}; use one of {sorted(kinds)}")
    return kinds[kind](sc, ctx)


def _arm(injector: fault_testing.FaultInjector, sc: dict, rank: int) -> None:
    for f in sc.get("faults", []):
        if rank in f["ranks"]:
            injector.arm(f["step"], f["phase"], f.get("action", "reset"), stall_s=f.get("stall_s", 0.0))


def _plain_step(model, optimizer, injector, step_fn, tokens: torch.Tensor, step: int) -> torch.Tensor:
    """The same math as a guarded step, without a guard (the reference, or a fault with no recovery)."""
    injector.begin_step(step)
    loss = step_fn(tokens)
    injector.maybe_fire("clip_allreduce", step)
    clip_gradients(model, 1.0)
    injector.maybe_fire("vote", step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def train(sc: dict, ctx: RankContext) -> dict:
    """Run one training scenario (see the module docstring for its keys)."""
    rank = ctx.rank
    m = model_config(sc.get("model"))
    compile_backend = sc.get("compile", ctx.settings.get("compile"))
    model, optimizer, root, middle = build(sc.get("flavour", ctx.settings.get("flavour", "fsdp2")), m, compile_backend)
    pg_timeout_s = sc.get("pg_timeout_s", ctx.pg_timeout_s)
    if "pg_timeout_s" in sc:
        # A short collective timeout (the hang case) only after every rank has built its model:
        # start-up skew on a loaded 2-core host must not look like a hang.
        ctx.barrier(f"built/{sc['name']}")
        set_pg_timeout(dist.group.WORLD, pg_timeout_s)
    injector = fault_testing.FaultInjector(exclude_ports=ctx.exclude_ports)
    injector.install(root, middle)
    _arm(injector, sc, rank)
    step_fn = step_fn_for(model)
    result: dict[str, Any] = {"events": [], "error": None, "resources": [], "step_s": []}
    guard = None
    if sc.get("guard", True):
        guard = attach(
            model,
            optimizer,
            ctx.control,
            max_grad_norm=1.0,
            pg_timeout=timedelta(seconds=pg_timeout_s),
            verify_rebind=sc.get("verify_rebind", False),
            reset=ResetConfig(**sc.get("reset", {})),
            injection_clock=injector.consume_injection_time,
            heartbeat_misses=int(sc.get("heartbeat_misses", 4)),
        )
        guard.phase_hooks.append(injector.on_phase)
    if compile_backend:
        from torch import _dynamo

        _dynamo.reset()  # a fresh model per scenario: start each from an empty cache
    losses: list[torch.Tensor] = []
    progress = None
    if sc.get("progress") and sc.get("track_resources"):
        progress = open(ctx.out_dir / f"progress.{sc['name']}.rank{rank}.jsonl", "a", buffering=1)
    t0 = time.time()
    try:
        for step in range(sc["steps"]):
            tokens = batch_for(step, rank, m)
            t = time.perf_counter()
            if guard is not None:
                losses.append(guard.step(step_fn, tokens))
            else:
                losses.append(_plain_step(model, optimizer, injector, step_fn, tokens, step))
            result["step_s"].append(time.perf_counter() - t)
            if sc.get("track_resources"):
                if step in (0, sc["steps"] - 1) and sc.get("resources_barrier", True):
                    # The leak figure is last minus first: take both at a quiet point, once every
                    # rank is done with the step, so no rank samples its sockets mid-handshake (one
                    # unsynchronised baseline read 11 fds / 0 sockets where its steady state was 15 / 3).
                    ctx.barrier(f"resources/{sc['name']}/{step}")
                    time.sleep(0.2)
                result["resources"].append(
                    {"step": step, "recoveries": guard.events.total if guard else 0, **resources(ctx.exclude_ports)}
                )
                if progress is not None:
                    new = [e.to_dict() for e in guard.events.since(result.get("_logged", 0))] if guard else []
                    result["_logged"] = guard.events.total if guard else 0
                    line = {
                        **result["resources"][-1],
                        "loss": float(losses[-1]),
                        "step_s": result["step_s"][-1],
                        "events": new,
                    }
                    if step == 0 or (new and guard.events.total == len(new)):  # type: ignore[union-attr]  # new: a guard
                        # which fds the count is made of, before and after the first recovery: a
                        # constant difference is then named, not guessed
                        line["fd_kinds"] = fd_kinds(ctx.exclude_ports)
                    progress.write(json.dumps(line) + "\n")
            if sc.get("pause_s"):
                time.sleep(float(sc["pause_s"]))  # room for a test to act between steps (e.g. kill the store)
            if step == 0 and sc.get("leak_check"):
                result["resources_before"] = resources(ctx.exclude_ports)
            if step == 0 and compile_backend:
                result["compile_after_warmup"] = dynamo_counters()
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        result["error"] = ctx.error(exc, elapsed_s=time.time() - t0)
    result.pop("_logged", None)
    if sc.get("settle_s") and result["error"] is None:
        # Abandoned generations' threads and sockets go only once their collectives time out: the
        # "back to baseline" figure is taken after that, with the guard still attached.
        ctx.barrier(f"settle/{sc['name']}")
        time.sleep(float(sc["settle_s"]))
        if guard is not None:  # what the guard does after its next committed step (no step runs here)
            guard.backend.forget_expired()
        result["resources_settled"] = resources(ctx.exclude_ports)
        if progress is not None:
            progress.write(
                json.dumps(
                    {
                        "settled": result["resources_settled"],
                        "after_s": sc["settle_s"],
                        "fd_kinds": fd_kinds(ctx.exclude_ports),
                    }
                )
                + "\n"
            )
    if progress is not None:
        progress.close()
    if "pg_timeout_s" in sc and result["error"] is None:
        set_pg_timeout(dist.group.WORLD, ctx.pg_timeout_s)
    if guard is not None:
        result["events"] = [e.to_dict() for e in guard.events]
        result["committed_step"] = guard.committed_step
        guard.close()
    if compile_backend:
        result["compile_at_end"] = dynamo_counters()
    injector.remove()
    result["fired"] = [{"step": f.step, "phase": f.phase, "action": f.action, "at": f.fired_at} for f in injector.fired]
    result["losses"] = [float(x) for x in losses]
    if result["error"] is None and sc.get("save_state", True):
        torch.save({"losses": losses, "state": state_of(model, optimizer)}, ctx.out_dir / f"{sc['name']}.rank{rank}.pt")
    del model, optimizer, guard, root, middle
    if (sc.get("leak_check") or sc.get("track_resources")) and result["error"] is None:
        result["resources_after"] = _after_teardown(ctx.exclude_ports, result.get("resources_before"))
    return result


def _after_teardown(
    exclude_ports: Any, baseline: dict[str, Any] | None = None, deadline_s: float = 15.0, pause_s: float = 0.2
) -> dict[str, Any]:
    """Resources once the closed guard's own threads (heartbeat, watchdog) and the old generations' sockets
    are gone: the smallest of each count, sampled until every count is back at ``baseline`` or
    ``deadline_s`` passed. close() lets them finish on their own, and on a loaded host (load 15 on 2 cores)
    2 s was not always enough. A leak per fault survives this: it never goes back down."""
    numeric = [k for k, v in resources(exclude_ports).items() if isinstance(v, (int, float))]
    low: dict[str, Any] = resources(exclude_ports)
    end = time.monotonic() + (deadline_s if baseline is not None else 2.0)  # no baseline: ~2 s of samples
    while time.monotonic() < end:
        if baseline is not None and all(low[k] <= baseline.get(k, low[k]) for k in numeric if k != "rss_mib"):
            break
        time.sleep(pause_s)
        now = resources(exclude_ports)
        low = {k: min(low[k], now[k]) if k in numeric else now[k] for k in now}
    return low


def rebind(sc: dict, ctx: RankContext) -> dict:
    """Time ``sc["rebinds"]`` rebinds of the binding table at each depth in ``sc["depths"]``."""
    out: dict[str, Any] = {"by_depth": {}}
    for depth in sc["depths"]:
        m = model_config({**sc.get("model", {}), "layers": depth})
        model, opt, _root, _middle = build(sc.get("flavour", ctx.settings.get("flavour", "fsdp2")), m)
        step_fn_for(model)(batch_for(0, ctx.rank, m))  # FSDP builds its per-group state lazily, on the first forward
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        table = BindingTable.build(model, opt)
        build_s = time.perf_counter() - t0
        olds = list(table.groups)
        twins = [dist.new_group(sorted(dist.get_process_group_ranks(g)), backend="gloo") for g in olds]
        fwd, back = dict(zip(olds, twins)), dict(zip(twins, olds))
        times = []
        for i in range(sc["rebinds"]):
            t = time.perf_counter()
            table.rebind(fwd if i % 2 == 0 else back)
            times.append(time.perf_counter() - t)
        if sc["rebinds"] % 2:
            table.rebind(back)
        times.sort()
        out["by_depth"][str(depth)] = {
            "slots": len(table.slots),
            "groups": len(olds),
            "table_build_s": build_s,
            "median_s": statistics.median(times),
            "p10_s": times[len(times) // 10],
            "p90_s": times[(len(times) * 9) // 10],
            "n": len(times),
        }
        for g in twins:
            dist.destroy_process_group(g)
        del table, model, opt, olds, twins, fwd, back
        gc.collect()
    return out
