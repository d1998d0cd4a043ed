"""Strategy ``none``: the plain step, no recovery. The fault-free reference every other run is
compared with, bit for bit. It checkpoints on the same cadence as every other strategy, so it pays
the same checkpoint cost; a fault (if one is configured) simply fails the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.strategies.base import Strategy
from harness.strategies.spec import Simulation, StrategySpec

if TYPE_CHECKING:
    import torch


class PlainStep(Strategy):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        return self.plain_step(step, tokens)


SPEC = StrategySpec(
    name="none",
    rank_class="harness.strategies.none:PlainStep",
    description="fault-free reference: a plain training step, no recovery",
    label="none (reference)",
    color="black",
    order=0,
    reference=True,
    simulation=Simulation("harness.scale.outcomes:no_failures", "fault-free reference", fault_free=True),
)
