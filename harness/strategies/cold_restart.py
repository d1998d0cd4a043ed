"""Strategy ``cold_restart``: what a cluster manager does. On a fault the ranks fail (the comm error
ends the process); the parent kills every rank process and launches fresh ones with incarnation + 1.
Those rebuild everything, load the newest DCP checkpoint (``restore`` event, in the base class) and
replay the steps lost since it (``replay=True`` step events)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from harness.strategies.base import Strategy
from harness.strategies.spec import Simulation, StrategySpec

if TYPE_CHECKING:
    import torch


class ColdRestart(Strategy):
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        return self.plain_step(step, tokens)


def relaunch_after_any_failure(exit_codes: Mapping[int, int | None], first_failure: int | None) -> str | None:
    """Relaunch every rank after any rank failed, as a cluster manager would."""
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    if not failed:
        return None
    rank = first_failure if first_failure in failed else min(failed)
    return f"cold restart: rank {rank} exited with {failed[rank]}"


SPEC = StrategySpec(
    name="cold_restart",
    rank_class="harness.strategies.cold_restart:ColdRestart",
    description="kill every rank, relaunch fresh processes, load the newest checkpoint, replay lost steps",
    label="cold restart",
    color="tab:red",
    order=2,
    relaunch=relaunch_after_any_failure,
    simulation=Simulation(
        "harness.scale.outcomes:relaunch_and_restore",
        "cold restart (torchrun + DCP)",
        synchronous=True,
        calibration_rollback="checkpoint",
    ),
    paper_gain={5: 1.197, 18: 1.698},  # Mistral-7B, 16 GPUs (harness.report.paper.PAPER_GAIN_SETUP)
    unequal=(
        "any fault ends every rank: all are relaunched (fresh interpreters) and restore the newest DCP "
        "checkpoint; the steps since it are replayed",
    ),
)
