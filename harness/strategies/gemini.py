"""Strategy ``gemini``'s spec: GEMINI in-memory checkpoints with a peer replica (lm-resiliency), every rank
restarted from them after a fault (the rank side, which says how, is ``harness.rank.strategies.gemini``), and
the check that it can run here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.schema import ConfigError, StrategyConfig
from harness.strategies.cold_restart import relaunch_after_any_failure
from harness.strategies.spec import Simulation, StrategySpec

LM_RESILIENCY_VERSION = "0.2.0"


@dataclass
class GeminiSnapshots:
    """GEMINI's in-memory captures: every ``every`` steps (lm-resiliency's ``interval``), replicated to the
    paired rank (``replicas``: lm-resiliency always pairs; the memory plan counts the peer's copy)."""

    every: int = 1
    replicas: bool = True


@dataclass
class GeminiConfig(StrategyConfig):
    """strategy=gemini: the common settings plus its captures (``strategy.snapshot.every``)."""

    snapshot: GeminiSnapshots = field(default_factory=GeminiSnapshots)


def check_runnable(run: Any) -> None:
    if run.cluster.world_size % 2:
        raise ConfigError(
            f"strategy=gemini pairs each rank with a neighbour: cluster.world_size={run.cluster.world_size} "
            f"must be even; try cluster.world_size={run.cluster.world_size + 1}"
        )
    try:
        import lm_resiliency  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(
            f"strategy=gemini needs lm-resiliency=={LM_RESILIENCY_VERSION}, its own extra: "
            "`pip install -e '.[gemini]'` (docs/peers.md says why `make setup` leaves it out); "
            f"importing it failed: {type(exc).__name__}: {exc}"
        ) from exc


SPEC = StrategySpec(
    name="gemini",
    rank_class="harness.rank.strategies.gemini:Gemini",
    description="GEMINI (lm-resiliency 0.2.0): in-memory checkpoints replicated to a peer; restart every rank from them",
    label="GEMINI (lm-resiliency)",
    color="tab:brown",
    order=5,
    config=GeminiConfig,
    relaunch=relaunch_after_any_failure,
    # The survivors write their copy and their peer's replica to disk after the collective error.
    settle_s=lambda run: 15.0,
    check=check_runnable,
    simulation=Simulation(
        "harness.scale.outcomes:relaunch_and_restore_from_peer_memory",
        "GEMINI (lm-resiliency 0.2.0): relaunch every process, reload the in-memory captures (a lost host's from "
        "its paired rank); its per-step capture from the cost model (harness.advise.taxes)",
        synchronous=True,
        per_step_tax="harness.advise.taxes:gemini_capture",
    ),
    unequal=(
        "per-step in-memory capture of each rank's state, replicated to its paired rank (a per-step cost)",
        "any fault restarts every rank (spawned; lm-resiliency's standby rendezvous does not register under "
        "torch 2.13) from the newest capture every rank holds; survivors get 15 s to write their copies first",
    ),
)
