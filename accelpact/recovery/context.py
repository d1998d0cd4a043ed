"""What a recovery round and a heal get from the guard: its step state and a few narrow collaborators.

Recovery (accelpact.recovery) and the heal never see the :class:`accelpact.Guard`. They get a
:class:`RecoveryContext`: this rank's identity, the control channel, the guard's
:class:`accelpact.dataplane.DataPlane`, the :class:`StepState` they read and move, and callables for
what stays the guard's business (resetting FSDP, the phase hooks). A test can drive ``recover`` with a
stand-in data plane and control channel, no process group needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accelpact.errors import AccelPactError
from accelpact.events import RecoveryLog
from accelpact.recovery.consensus import Phase
from accelpact.recovery.region_rule import RegionPhase, RegionState

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient
    from accelpact.dataplane.plane import DataPlane
    from accelpact.detection.liveness import LivenessConfig

__all__ = ["StepState", "RecoveryContext", "InjectionClock"]

# Given the start time of the failed attempt, the wall time of a fault injected at or after it (and
# forgotten from then on), or None: e.g. accelpact.testing.FaultInjector.consume_injection_time.
InjectionClock = Callable[[float], "float | None"]


@dataclass
class StepState:
    """Where this rank is in the step: what it committed, what runs next, and the commit protocol's phase."""

    committed_step: int = -1
    next_step: int = 0
    phase: Phase = Phase.BEFORE_VOTE
    # Wall time since which the data plane is unchecked: the last vote or recovery that completed.
    # A fault injected after it (e.g. after the vote, while no collective is in flight) surfaces at the
    # next collective, so the injection clock is asked from here, not from the attempt's start.
    unchecked_since: float | None = None
    # Guarded regions (Guard.run / finish): how many completed since the last commit, and the phase inside
    # the current one (None: not in a region). accelpact.recovery.region_rule has the rule.
    region_done: int = 0
    region_phase: RegionPhase | None = None
    # Every rank's region state from the last recovery round's reports (rank -> state): a rank inside a
    # guarded region decides from them whether to run it again (accelpact.recovery.rounds sets it).
    peer_regions: dict[int, RegionState] = field(default_factory=dict)

    def region(self) -> RegionState:
        """Where this rank is among guarded regions (what its consensus report carries)."""
        return RegionState(self.committed_step, self.region_done, self.region_phase)

    def commit(self, step: int) -> None:
        """``step`` is committed here: the next one is ``step + 1``, with no region done after it."""
        self.committed_step = step
        self.next_step = step + 1
        self.region_done = 0

    def resume_at(self, step: int) -> None:
        """Continue numbering from ``step`` (state of ``step - 1`` restored by the caller)."""
        if step < 0:
            raise ValueError(f"resume_at(step={step}): steps count from 0")
        if step <= self.committed_step:
            raise AccelPactError(
                f"resume_at({step}) would move back past step {self.committed_step}, which this guard "
                "already committed; build a new guard with attach() for a rolled-back run"
            )
        self.next_step = step
        self.committed_step = step - 1
        self.region_done = 0


@dataclass
class RecoveryContext:
    """Everything a recovery round or a heal touches (the guard builds one at attach)."""

    rank: int
    world_size: int
    control: ControlClient  # accelpact.control.ControlChannel (or a stand-in with its methods)
    plane: DataPlane
    state: StepState
    # Puts FSDP back into a clean between-steps state and drops its gradients (accelpact.dataplane.reset).
    reset_fsdp: Callable[[], None]
    # Called as hook(phase, step) ("recovery": the new generation exists, before its first collective).
    hook: Callable[[str, int], None]
    liveness: LivenessConfig | None = None
    events: RecoveryLog = field(default_factory=RecoveryLog)
