"""Strategy ``none``, rank side: the plain step, no recovery. The fault-free reference every other run is
compared with, bit for bit. It checkpoints on the same cadence as every other strategy, so it pays
the same checkpoint cost; a fault (if one is configured) simply fails the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.rank.strategies.base import Strategy

if TYPE_CHECKING:
    import torch


class PlainStep(Strategy):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        return self.plain_step(step, tokens)
