"""The Strategy interface: what happens in one training step, and around the loop.

The loop in ``harness.rank.train`` never changes between strategies: it asks the strategy where to start
(a restarted rank resumes after its checkpoint), then calls ``run_step`` per step and
``after_step`` once the step committed. A strategy owns recovery (accelpact), checkpoint save and
restore (cold_restart, checkpoint_restore), or nothing at all (``none``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from harness.events import EventLog
from harness.app.schema import RunConfig


@dataclass
class TrainContext:
    """Everything one rank's step needs. Built once per process by ``harness.rank.train``."""

    cfg: RunConfig
    rank: int
    world_size: int
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    events: EventLog
    run_dir: str
    incarnation: int = 0
    control_store: Optional[Any] = None  # the parent's long-lived TCPStore (client), for later strategies


def forward_backward(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss of ``tokens`` (inputs and labels; transformers shifts them), then backward."""
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return loss


def clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> None:
    """Clip (a collective under FSDP2: the norm is all-reduced), step, drop the gradients."""
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class Strategy(ABC):
    """One rank's step policy."""

    def __init__(self, ctx: TrainContext) -> None:
        self.ctx = ctx

    def first_step(self) -> int:
        """Index of the first step this process runs (0 unless it resumed from a checkpoint)."""
        return 0

    def is_replay(self, step: int) -> bool:
        """Whether ``step`` had already committed once before a rollback (goodput counts it as lost)."""
        return False

    @abstractmethod
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        """Run step ``step`` to commit on this rank; return this rank's loss."""

    def after_step(self, step: int) -> None:
        """Called once step ``step`` committed (checkpoint saves go here)."""

    def close(self) -> None:
        """End of training (flush async checkpoints, release resources)."""
