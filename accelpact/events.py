"""RecoveryEvent: what one in-memory recovery did and how long each part took.

Plain data, JSON-serialisable through ``dataclasses.asdict`` so the harness can write it straight
into its per-rank event log (kind ``recovery``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RecoveryEvent"]


@dataclass
class RecoveryEvent:
    step: int  # the step this rank was attempting when the fault hit
    generation: int  # the data-plane generation the recovery built
    phase: str  # consensus.Phase value of this rank when the fault hit
    fault: dict[str, str]  # {"type": ..., "message": ...} of this rank's fault
    ranks: list[int]  # ranks that reported a fault in this round (all of them: every rank sees one)
    decision: dict[str, Any]  # {"action": "retry"|"roll_forward", "step", "apply_on", "resume_step"}
    t_detected: float  # time.time() when this rank caught the fault
    detection_s: float  # fault injection (when accelpact.testing recorded one) or attempt start -> caught
    agreement_s: float  # reset + report exchange + decision
    rebuild_s: float  # new process group(s) on the never-used store prefix
    rebind_s: float  # swapping every cached reference
    first_collective_s: float  # the first all-reduce on the new generation
    total_s: float  # caught -> ready to continue (excludes detection)
    rounds: int = 1  # >1 when faults hit during recovery (nested)
    retire_s: float = 0.0  # dropping the old group (its C++ destructor), after the step continued
    reports: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
