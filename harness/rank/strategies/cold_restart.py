"""Strategy ``cold_restart``, rank side (the plain step; the spec is ``harness.strategies.cold_restart``):
what a cluster manager does. On a fault the ranks fail (the comm error
ends the process); the parent kills every rank process and launches fresh ones with incarnation + 1.
Those rebuild everything, load the newest DCP checkpoint (``restore`` event, in the base class) and
replay the steps lost since it (``replay=True`` step events)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.rank.strategies.base import Strategy

if TYPE_CHECKING:
    import torch


class ColdRestart(Strategy):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        return self.plain_step(step, tokens)
