"""Strategy ``accelpact_heal``: AccelPact with its heal of a lost process or host turned on.

The same rank-side class as ``accelpact`` (in-memory rebinding on a network fault), plus per-step
snapshots in shared memory and a buddy replica (``strategy.snapshot`` in conf/strategy/accelpact_heal.yaml),
so a SIGKILLed rank or a lost host heals in memory instead of falling back to the disk checkpoint.
Its own name, because its per-step protection is a cost the plain rebinding never pays: comparisons
run it where the heal can help (kills, host loss, mixed faults) and show that cost there.
"""

from __future__ import annotations

import dataclasses

from harness.strategies.accelpact import SPEC as REBIND
from harness.strategies.accelpact import relaunch_from_snapshots
from harness.strategies.spec import Simulation

SPEC = dataclasses.replace(
    REBIND,
    name="accelpact_heal",
    description="in-memory recovery plus the heal of a lost process or host from per-step snapshots and a buddy replica",
    label="AccelPact + heal",
    color="tab:cyan",
    simulation=Simulation(
        "harness.scale.outcomes:rebind_and_heal_in_memory",
        "AccelPact rebinding + in-memory heal (measured: results/process_loss)",
        synchronous=True,
    ),
    paper_gain={},
    heals_lost_ranks=True,
    # A whole-job crash (fault=kill_all) relaunches every rank; they resume from the snapshots, not from disk.
    relaunch=relaunch_from_snapshots,
    unequal=(
        "per-step snapshot of each rank's shards into shared memory and a push to its buddy rank: a cost on every "
        "productive step, which no checkpoint-based peer pays (GEMINI pays its own capture)",
        "a lost rank's survivors learn of it from the parent's death notice (accelpact-run's launcher gives the same), "
        "not from a heartbeat timeout",
    ),
    pace="its per-step snapshot (a copy and a CRC-32 of each rank's shards into shared memory) and buddy push run "
    "inside every productive step; their cost alone, side by side: results/process_loss/push_every.md",
)
