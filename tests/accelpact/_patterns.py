"""Scenario runner for test_patterns: the training-loop patterns of the README, each with and without a fault.

Named ``tests.accelpact._patterns:run`` in a session of accelpact.testing.session.run_session. The
model is the example's (examples/train_fsdp.py: a small decoder, FSDP2 per block + root); a pattern
changes only what the README says goes where:

- ``grad_accum``: ``accum`` micro-batches inside ``step_fn``, gradient sync only on the last one
  (``set_requires_gradient_sync``), the guard steps once per global batch;
- ``lr_scheduler``: ``scheduler.step()`` after ``guard.step`` (a rolled-forward or retried step moves
  the schedule exactly once);
- ``mixed_precision``: FSDP2's ``MixedPrecisionPolicy`` (bf16 compute and all-gather, fp32 reduce);
- ``activation_checkpointing``: ``torch.distributed._composable.checkpoint`` on every block before
  ``fully_shard`` (the backward recomputes the forward, all-gathers included);
- ``hsdp``: a 2D device mesh (replicate x shard) given to ``fully_shard``.

Scenario keys: ``pattern``, ``steps``, ``fault`` (``{step, phase, action, ranks}`` or absent: the
fault-free reference). Saves ``{name}.rank{r}.pt`` for accelpact.testing.compare.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.nn.functional as F

import accelpact
from accelpact.testing import FaultInjector
from accelpact.testing.rank import RankContext
from examples.train_fsdp import VOCAB, TinyLM, batch_for, local_state

PATTERNS = ("grad_accum", "lr_scheduler", "mixed_precision", "activation_checkpointing", "hsdp")


def build(pattern: str, world_size: int) -> torch.nn.Module:
    """The example's model, wrapped as the pattern wraps it; the same seed every time."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = TinyLM()
    kwargs: dict[str, Any] = {}
    if pattern == "mixed_precision":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if pattern == "hsdp":
        from torch.distributed.device_mesh import init_device_mesh

        shard = 2 if world_size % 2 == 0 and world_size >= 4 else 1
        kwargs["mesh"] = init_device_mesh("cpu", (world_size // shard, shard), mesh_dim_names=("replicate", "shard"))
    if pattern == "activation_checkpointing":
        from torch.distributed._composable import checkpoint

        for layer in model.layers:
            checkpoint(layer)
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def run(sc: dict, ctx: RankContext) -> dict:
    pattern, steps, fault = sc["pattern"], sc["steps"], sc.get("fault")
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; choose one of {PATTERNS}")
    model = build(pattern, ctx.world_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = (
        torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=steps)
        if pattern == "lr_scheduler"
        else None
    )
    guard = accelpact.attach(
        model, optimizer, ctx.control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=ctx.pg_timeout_s)
    )
    injector = FaultInjector(exclude_ports=ctx.exclude_ports)
    if fault and ctx.rank in fault["ranks"]:
        injector.arm(fault["step"], fault["phase"], fault.get("action", "reset"))
    injector.install(model, model.layers[len(model.layers) // 2])
    guard.phase_hooks.append(injector.on_phase)
    accum = 2 if pattern == "grad_accum" else 1

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(())
        for i, micro in enumerate(tokens.chunk(accum)):
            if accum > 1:  # reduce-scatter only after the last micro-batch
                model.set_requires_gradient_sync(i == accum - 1)
            logits = model(micro[:, :-1]).float()  # bf16 under mixed precision: the loss in fp32
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), micro[:, 1:].reshape(-1)) / accum
            loss.backward()
            total += loss.detach()
        return total

    losses, lrs = [], []
    for step in range(steps):
        losses.append(guard.step(step_fn, batch_for(step, ctx.rank, torch.device("cpu"))))
        if scheduler is not None:
            scheduler.step()  # after guard.step: once per committed step
        lrs.append(optimizer.param_groups[0]["lr"])
    guard.close()
    injector.remove()
    state = local_state(model, optimizer)
    state["lr"] = torch.tensor(lrs, dtype=torch.float64)
    torch.save({"losses": losses, "state": state}, ctx.out_dir / f"{sc['name']}.rank{ctx.rank}.pt")
    return {
        "error": None,
        "events": len(guard.events),
        "fired": len(injector.fired),
        "actions": [e.decision["action"] for e in guard.events],
        "committed_step": guard.committed_step,
    }
