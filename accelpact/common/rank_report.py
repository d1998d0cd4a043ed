"""One rank's account of where it was when a fault hit (:class:`RankReport`, with its :class:`Phase`): the
message every rank posts to the recovery round.

In the bottom layer because the detection code that times a round (accelpact.detection.start) reads it, and
the consensus rule that decides the round (accelpact.recovery.consensus) sits above detection.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from accelpact.errors import StateDivergedError

__all__ = ["Phase", "RankReport"]


class Phase(enum.Enum):
    """Where the rank was in its attempted step when the fault hit."""

    BEFORE_VOTE = "before_vote"  # forward/backward/clip: never entered the vote
    IN_VOTE = "in_vote"  # entered the vote, it failed locally (grads complete, clipped)
    VOTED = "voted"  # the vote completed locally; optimizer.step not yet applied
    STEPPED = "stepped"  # optimizer.step for the attempted step was applied (fault came after)


@dataclass(frozen=True)
class RankReport:
    """One rank's account of where it was when the fault hit.

    ``fault`` (optional) names the exception type this rank caught; ``injected_at`` (optional) is the
    wall time of a fault injected on this rank (tests and benchmarks: the guard's ``injection_clock``),
    so that every rank can time its detection from the earliest injection of the round, not from its
    own attempt's start. Both are carried for the recovery event only and never influence
    :func:`decide`; both are left off the wire when unset, and a reader ignores keys it does not know,
    so ranks of older and newer versions read each other's reports.
    """

    rank: int
    attempt_step: int  # the step index the rank was running (0-based)
    committed_step: int  # last step whose optimizer.step applied on this rank (-1 = none)
    phase: Phase
    fault: str | None = None
    injected_at: float | None = None
    # Where the rank is among guarded regions (accelpact.recovery.region_rule: RegionState.to_dict()); never read
    # by decide(); left off the wire when unset, like ``fault``.
    region: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, object]:
        """The wire form as a dict (JSON types only); ``fault`` and ``injected_at`` appear only when set."""
        d: dict[str, object] = {
            "rank": self.rank,
            "attempt_step": self.attempt_step,
            "committed_step": self.committed_step,
            "phase": self.phase.value,
        }
        if self.fault is not None:
            d["fault"] = self.fault
        if self.injected_at is not None:
            d["injected_at"] = self.injected_at
        if self.region is not None:
            d["region"] = self.region
        return d

    def to_bytes(self) -> bytes:
        """Wire form for the control channel (JSON, stable across Python versions)."""
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> RankReport:
        """Inverse of :meth:`to_bytes`; raises StateDivergedError on a malformed payload."""
        try:
            d = json.loads(data.decode())
            fault = d.get("fault")
            if fault is not None and not isinstance(fault, str):
                raise TypeError(f"fault must be a string, got {type(fault).__name__}")
            injected_at = d.get("injected_at")
            if injected_at is not None and (isinstance(injected_at, bool) or not isinstance(injected_at, (int, float))):
                raise TypeError(f"injected_at must be a number, got {type(injected_at).__name__}")
            region = d.get("region")
            if region is not None and not isinstance(region, dict):
                raise TypeError(f"region must be an object, got {type(region).__name__}")
            return cls(
                int(d["rank"]),
                int(d["attempt_step"]),
                int(d["committed_step"]),
                Phase(d["phase"]),
                fault,
                None if injected_at is None else float(injected_at),
                region,
            )
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise StateDivergedError(f"malformed consensus report {data[:200]!r}: {exc}") from exc
