"""Rows only the scale simulator has (no harness strategy of that name), one ``ProjectedStrategy`` each.

They extend the simulator's comparison (AccelPact's heal of a lost process or host is the harness
strategy ``accelpact_heal``, measured in results/process_loss): the heal on torch 2.15's process-group reconfigure (measured in
results/reconfigure), and torchft's replica group that drops out and rejoins by peer heal (the
harness runs it as ``torchft``; its per-failure costs are measured, see harness.scale.torchft_measured).
Two rows are designs, not built, and say so: the heal growing the communicator instead of rebuilding it,
and the heal of one HSDP replica group while the others go on (docs/scale.md). Each label says where its
costs come from. Plugins add more with ``harness.strategies.register_projected``.
"""

from __future__ import annotations

from harness.strategies.spec import ProjectedStrategy, Simulation

PROJECTED: tuple[ProjectedStrategy, ...] = (
    ProjectedStrategy(
        "accelpact_reconfigure",
        Simulation(
            "harness.scale.outcomes:reconfigure_and_heal_in_memory",
            "AccelPact on torch 2.15 reconfigure + in-memory heal (measured: results/process_loss heal x "
            "results/reconfigure's 2.15/2.13 heal ratio)",
            synchronous=True,
        ),
        color="tab:olive",
    ),
    ProjectedStrategy(
        "accelpact_grow",
        Simulation(
            "harness.scale.outcomes:heal_growing_the_communicator",
            "design, not built: AccelPact heal that grows the communicator instead of rebuilding the world",
            synchronous=True,
        ),
        color="tab:brown",
    ),
    ProjectedStrategy(
        "accelpact_hsdp_continue",
        Simulation(
            "harness.scale.outcomes:heal_replica_while_others_continue",
            "design, not built: AccelPact heal of one HSDP replica group while the others go on",
        ),
        color="tab:purple",
    ),
    ProjectedStrategy(
        "torchft_peer_heal",
        Simulation(
            "harness.scale.outcomes:replica_drops_and_peer_heals",
            "torchft 0.2.0 replica drop + peer heal (survivors' stop and replica restart measured: "
            "results/scale_projection/torchft_runs.csv)",
            per_step_tax="harness.advise.taxes:torchft_quorum",
        ),
        color="tab:pink",
    ),
)
