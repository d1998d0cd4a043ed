"""Gradient clipping by global norm, the same float operations with or without a guard.

The guard clips before its vote; a plain loop that wants the very same numbers (the harness's
fault-free reference) calls the same function, so a comparison bit for bit compares like with like.
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["clip_gradients"]


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients by their global norm; the same math with or without a guard.

    FSDP2 grads are DTensors: the total norm is a partial DTensor whose ``full_tensor()`` is the
    all-reduce. FSDP1 needs its own ``clip_grad_norm_`` (flat parameters are sharded plain tensors).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.tensor import DTensor

    if isinstance(model, FSDP):
        return model.clip_grad_norm_(max_norm)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(
        [p for p in model.parameters() if p.grad is not None], max_norm, total, foreach=True
    )
    return total
