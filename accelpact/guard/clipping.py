"""Gradient clipping by global norm, the same float operations with or without a guard.

The guard clips before its vote; a plain loop that wants the very same numbers (the harness's
fault-free reference) calls the same function, so a comparison bit for bit compares like with like.

With FSDP2 on a one-dimensional mesh the norm's all-reduce is posted here (the same operations as
DTensor's ``full_tensor()``: the local norm to the power p, a sum all-reduce, the p-th root), so that
the guard can wait for it through its :class:`accelpact.backends.interruptible.CollectiveWaiter`: a
one-element all-reduce is the kind of collective gloo can leave waiting for the PG timeout when it is
posted just as its rank's connection breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

__all__ = ["clip_gradients"]


def clip_gradients(
    model: nn.Module, max_norm: float, wait: Callable[[Any, str, str], None] | None = None
) -> torch.Tensor:
    """Clip gradients by their global norm; the same math with or without a guard.

    FSDP2 grads are DTensors: the total norm is a partial DTensor whose ``full_tensor()`` is the
    all-reduce. FSDP1 needs its own ``clip_grad_norm_`` (flat parameters are sharded plain tensors).
    ``wait(work, what, phase)`` waits for the norm's all-reduce where this function posts it (None:
    ``work.wait()``).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.tensor import DTensor

    if isinstance(model, FSDP):
        return model.clip_grad_norm_(max_norm)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(total, DTensor):
        total = _reduce_norm(total, wait)
    torch.nn.utils.clip_grads_with_norm_(
        [p for p in model.parameters() if p.grad is not None], max_norm, total, foreach=True
    )
    return total


def _reduce_norm(total: Any, wait: Callable[[Any, str, str], None] | None) -> torch.Tensor:
    """``total.full_tensor()`` of a partial 2-norm DTensor, with the all-reduce waited for by ``wait``."""
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate

    mesh = total.device_mesh
    partial = [p for p in total.placements if not isinstance(p, Replicate)]
    norm_type = getattr(partial[0], "norm_type", None) if len(partial) == 1 else None
    if mesh.ndim != 1 or norm_type is None or getattr(partial[0], "reduce_op", "sum") != "sum":
        full: torch.Tensor = total.full_tensor()  # HSDP meshes, other norms: DTensor's own reduction
        return full
    local = total.to_local() ** norm_type
    work = dist.all_reduce(local, op=dist.ReduceOp.SUM, group=mesh.get_group(), async_op=True)
    if wait is None:
        work.wait()
    else:
        wait(work, "the gradient-norm all-reduce", "clip_allreduce")
    norm: torch.Tensor = local ** (1.0 / norm_type)
    return norm
