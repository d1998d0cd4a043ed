"""Strategy ``cold_restart``'s spec: after any rank failed, the parent kills every rank and launches fresh ones,
which restore the newest checkpoint (the rank side is ``harness.rank.strategies.cold_restart``)."""

from __future__ import annotations

from collections.abc import Mapping

from harness.strategies.spec import Simulation, StrategySpec


def relaunch_after_any_failure(exit_codes: Mapping[int, int | None], first_failure: int | None) -> str | None:
    """Relaunch every rank after any rank failed, as a cluster manager would."""
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    if not failed:
        return None
    rank = first_failure if first_failure in failed else min(failed)
    return f"cold restart: rank {rank} exited with {failed[rank]}"


SPEC = StrategySpec(
    name="cold_restart",
    rank_class="harness.rank.strategies.cold_restart:ColdRestart",
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
