"""The commit rule of a guarded region (``Guard.run`` / ``Guard.finish``): pure logic, no torch, no I/O.

A guarded region is the user's own collectives between two steps (evaluation, a checkpoint save, a
final gather), run as ``fn()`` and closed by a *region vote*: a one-element all-reduce every rank enters
only once its ``fn()`` returned. Regions are numbered per committed step: region ``(c, d)`` is the
(d+1)-th region a rank runs after committing step ``c`` (every rank runs the same program, so the same
numbers name the same region everywhere). Each rank's consensus report carries where it is
(:class:`RegionState`): the regions it completed since its last commit and, inside one, its phase.

After a fault inside region ``(c, d)`` every rank gathers the reports (accelpact.recovery.rounds) and the
step rule (accelpact.recovery.consensus) settles the steps first. Then, for a rank still inside ``(c, d)``:

- the region vote of ``(c, d)`` completed on SOME rank -> every rank entered that vote, so every rank's
  ``fn()`` returned: this rank COMPLETEs (returns its ``fn()`` result, no second run);
- it completed on NO rank -> no rank moved past the region: this rank RETRIEs ``fn()`` from the start,
  and so does every other rank inside it (ranks that had not reached it yet run it for the first time);
- anything else (a rank two regions ahead, a completed vote that this rank never entered) cannot come
  from the protocol: StateDivergedError, never continue.

Why a vote: without it a rank whose last collective of ``fn()`` completed moves on (into the next
step), while a peer whose copy of that collective failed would run ``fn()`` again: the two would then
run different collectives against each other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from accelpact.errors import StateDivergedError

__all__ = ["RegionPhase", "RegionState", "RegionAction", "decide_region"]


class RegionPhase(enum.Enum):
    RUNNING = "running"  # inside fn(), or about to enter the region vote
    IN_VOTE = "in_vote"  # fn() returned on this rank; its region vote failed locally
    VOTED = "voted"  # the region vote completed on this rank


class RegionAction(enum.Enum):
    NONE = "none"  # this rank is not inside a region
    RETRY = "retry"  # run fn() again from its start
    COMPLETE = "complete"  # fn() completed everywhere: return its result


@dataclass(frozen=True)
class RegionState:
    """One rank's place among guarded regions: ``done`` regions completed since it committed
    ``committed``; ``phase`` inside the next one (None: between regions, e.g. in a step)."""

    committed: int
    done: int
    phase: RegionPhase | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "committed": self.committed,
            "done": self.done,
            "phase": None if self.phase is None else self.phase.value,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> RegionState:
        try:
            phase = d.get("phase")
            return cls(
                int(d["committed"]),  # type: ignore[call-overload]
                int(d["done"]),  # type: ignore[call-overload]
                None if phase is None else RegionPhase(phase),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise StateDivergedError(f"malformed region report {dict(d)!r}: {exc}") from exc


def decide_region(states: Mapping[int, RegionState], rank: int, committed_after: int) -> RegionAction:
    """What ``rank`` does with the region it is in, given every rank's state and the committed step
    every rank holds once the step rule's decision is applied (``committed_after``)."""
    me = states[rank]
    if me.phase is None:
        return RegionAction.NONE
    if me.committed != committed_after:
        raise StateDivergedError(
            f"rank {rank} is inside region {me.done} after step {me.committed}, but the ranks agreed on committed "
            f"step {committed_after}: a region runs only between committed steps (this is a bug)",
            ranks=(rank,),
        )
    # Ranks the step rule rolled forward now stand at committed_after with no region done.
    here = {
        r: s if s.committed == committed_after else RegionState(committed_after, 0, None) for r, s in states.items()
    }
    ahead = sorted(
        r for r, s in here.items() if s.done > me.done + 1 or (s.done == me.done + 1 and s.phase is RegionPhase.VOTED)
    )
    if ahead:
        raise StateDivergedError(
            f"rank(s) {ahead} completed a region vote past region {me.done} after step {committed_after} while "
            f"rank {rank} is still inside it ({me.phase.value}); restore from a checkpoint",
            ranks=(rank, *ahead),
        )
    completed = [r for r, s in here.items() if s.done > me.done or (s.done == me.done and s.phase is RegionPhase.VOTED)]
    if not completed:
        return RegionAction.RETRY
    if me.phase is RegionPhase.RUNNING:
        raise StateDivergedError(
            f"the vote of region {me.done} after step {committed_after} completed on rank(s) {sorted(completed)} but "
            f"rank {rank} never entered it; restore from a checkpoint",
            ranks=(rank, *completed),
        )
    return RegionAction.COMPLETE
