"""Put FSDP2 / FSDP1 back into a clean between-steps state after a step failed mid-flight.

Two traps make a naive reset silently wrong (wrong numbers, no error, ranks still agreeing; docs/design.md,
"Two silent-divergence traps"):

- FSDP2: when backward raises, the root's ``_unsharded_param.grad`` survives ``reset_iter_state()``. Fix:
  clear every ``_unsharded_param.grad`` and ``unsharded_accumulated_grad``.
- FSDP1: an all-gather that fails midway leaves the unsharded flat parameter allocated and
  ``needs_unshard()`` False. Fix: reshard (and free) every handle.

Each fix has a switch (:class:`ResetConfig`) so tests can prove the trap is real by disabling it. Pending
all-gather Work objects of the broken group are dropped, never waited on: waiting can block or raise, and
holding them keeps the old group alive.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from accelpact.errors import AccelPactError

__all__ = ["ResetConfig", "fsdp_flavour", "reset_after_fault"]


@dataclass(frozen=True)
class ResetConfig:
    """Switches for the two trap fixes. Both True in production; tests turn one off to show the trap."""

    clear_unsharded_grads: bool = True  # FSDP2 trap
    reshard_fsdp1_handles: bool = True  # FSDP1 trap


def fsdp_flavour(model: nn.Module) -> str:
    """'fsdp2', 'fsdp1' or 'none' (no FSDP found under ``model``)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    for m in model.modules():
        if isinstance(m, FSDPModule):
            return "fsdp2"
        if isinstance(m, FullyShardedDataParallel):
            return "fsdp1"
    return "none"


def reset_after_fault(model: nn.Module, optimizer: torch.optim.Optimizer, config: ResetConfig = ResetConfig()) -> None:
    """Discard the failed step's partial state: FSDP iteration state, unsharded buffers, all grads."""
    flavour = fsdp_flavour(model)
    if flavour == "fsdp2":
        _reset_fsdp2(model, config)
    elif flavour == "fsdp1":
        _reset_fsdp1(model, config)
    optimizer.zero_grad(set_to_none=True)
    for p in model.parameters():  # parameters the optimizer does not own (frozen / unregistered)
        p.grad = None


def _fsdp2_root(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule) and m._get_fsdp_state()._is_root is not False:
            return m
    raise ValueError("no FSDP2 root module found; call fully_shard on the model root")


def _reset_fsdp2(model: nn.Module, config: ResetConfig) -> None:
    root: Any = _fsdp2_root(model)  # Any: FSDP2's private state, untyped
    root_state = root._get_fsdp_state()
    if root_state._is_root is None:
        return  # never ran forward: nothing to reset (lazy init has not happened)
    states = root_state._state_ctx.all_states
    for state in states:
        for group in state._fsdp_param_groups:
            # Drop, never wait: the Work belongs to the broken group.
            group._all_gather_result = None
            if config.clear_unsharded_grads:
                for fp in group.fsdp_params:
                    unsharded = getattr(fp, "_unsharded_param", None)
                    if unsharded is not None:
                        unsharded.grad = None
                    _clear_accumulated_grad(fp)
    comm_ctx = root_state._comm_ctx
    comm_ctx.all_gather_state = None
    root.reset_iter_state()  # covers every FSDP state reachable from the root


def _clear_accumulated_grad(fp: Any) -> None:
    """Clear FSDPParam's reduce-dtype gradient accumulator, wherever this torch keeps it.

    torch 2.13 keeps a separate buffer in the attribute ``unsharded_accumulated_grad`` (set to None
    here). torch 2.15 made it a read-only property returning ``_unsharded_param.grad`` (accumulation
    moved onto the autograd leaf), so clearing that grad above already cleared it; assigning raised
    "property 'unsharded_accumulated_grad' of 'FSDPParam' object has no setter" and killed recovery on
    every rank. Which form this torch has is read from the class, not from a version number, and a
    form that neither clears nor derives from the leaf raises instead of leaving a stale gradient.
    """
    attr = inspect.getattr_static(type(fp), "unsharded_accumulated_grad", None)
    if isinstance(attr, property):
        if attr.fset is not None:
            attr.fset(fp, None)
        elif attr.fget is not None and attr.fget(fp) is not None:
            raise AccelPactError(
                f"torch {torch.__version__}: FSDPParam.unsharded_accumulated_grad is read-only and still holds a "
                "gradient after _unsharded_param.grad was cleared; this torch keeps FSDP2's accumulated gradient "
                "somewhere accelpact/reset.py does not know. Supported: torch>=2.13,<2.16"
            )
        return
    fp.unsharded_accumulated_grad = None  # torch 2.13/2.14: a plain attribute (or not created yet)


def _reset_fsdp1(model: nn.Module, config: ResetConfig) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import TrainingState
    from torch.distributed.fsdp._flat_param import HandleTrainingState

    states = [m for m in model.modules() if isinstance(m, FSDP)]
    root: Any = next((s for s in states if s._is_root), None)  # Any: FSDP1's private state, untyped
    if root is None:
        return  # never ran forward
    for state in states:
        handle: Any = state._handle
        if handle is not None:
            if config.reshard_fsdp1_handles and handle.uses_sharded_strategy:
                handle.reshard(free_unsharded_flat_param=True)
                handle.post_reshard()
            fp = handle.flat_param
            fp.grad = None
            if hasattr(fp, "_saved_grad_shard"):
                delattr(fp, "_saved_grad_shard")
            if hasattr(fp, "_post_backward_called"):
                fp._post_backward_called = False
            handle._ran_pre_backward_hook = False
            handle._needs_pre_backward_unshard = False
            handle._needs_pre_forward_unshard = False
            handle._post_forward_index = None
            handle._prefetched = False
            handle._training_state = HandleTrainingState.IDLE
        state.training_state = TrainingState.IDLE
    root._post_backward_callback_queued = False
    root._exec_order_data.next_iter()
