"""Strategy ``none``'s spec: the fault-free reference every other run is compared with, bit for bit (its rank
side, the plain step, is ``harness.rank.strategies.none``)."""

from __future__ import annotations

from harness.strategies.spec import Simulation, StrategySpec

SPEC = StrategySpec(
    name="none",
    rank_class="harness.rank.strategies.none:PlainStep",
    description="fault-free reference: a plain training step, no recovery",
    label="none (reference)",
    color="black",
    order=0,
    reference=True,
    simulation=Simulation("harness.scale.outcomes:no_failures", "fault-free reference", fault_free=True),
)
