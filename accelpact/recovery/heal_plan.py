"""The heal's resume-step rule: pure logic over every rank's :class:`HealReport` (no torch, no I/O).

After a rank is lost and a replacement has joined, every rank (survivors and replacements) posts what
training state it can reach without a disk read: a survivor its live committed step plus the steps of
its valid own snapshot slots; a replacement the steps of the dead process's own slots that survived,
plus the steps of the buddy replicas it fetched. :func:`decide_resume` picks the resume step S, the
newest step EVERY rank holds, identically on every rank. Survivors that committed past S roll back to
their own slot S; everyone continues at S + 1.

Why at most one step is replayed with per-step snapshots: a rank waits for its snapshot of step c
before it enters the vote of c + 1 (the guard's ``before_update`` runs ahead of the vote), and no rank
commits c + 1 unless every rank entered that vote. So whenever some survivor committed c + 1, the lost
rank's snapshot of c was complete, and the survivors hold c in a slot too: S >= c, one step back at
most. (With ``snapshot.every=k``, up to k steps.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from accelpact.errors import RankLostError, StateDivergedError

__all__ = ["HealReport", "ResumePlan", "decide_resume", "SOURCES"]

# Where a rank's state of the resume step comes from, in the order a replacement tries them.
SOURCES = ("live", "own", "buddy", "disk")


@dataclass(frozen=True)
class HealReport:
    """One rank's account of the steps it can resume from (wire form: JSON)."""

    rank: int
    role: str  # "survivor" | "replacement"
    committed: int  # the live committed step (-1 for a replacement: it has no live state)
    # step -> where this rank would load it from: "live" (its current state), "own" (its own
    # snapshot slot) or "buddy" (a replica fetched from its buddy)
    held: dict[int, str] = field(default_factory=dict)
    buddy: int | None = None  # the rank whose replica a replacement fetched from (for the error text)
    # The latest step this rank can resume at (None: no limit). A survivor healing inside a guarded region
    # (Guard.run / finish) sends its committed step: everyone then re-runs the loop from the top of that
    # step's iteration, the region included, because a replacement can only start at the top of a step.
    resume_by: int | None = None

    def to_bytes(self) -> bytes:
        d = {
            "rank": self.rank,
            "role": self.role,
            "committed": self.committed,
            "held": {str(k): v for k, v in self.held.items()},
            "buddy": self.buddy,
        }
        if self.resume_by is not None:
            d["resume_by"] = self.resume_by
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> HealReport:
        try:
            d = json.loads(raw.decode())
            held = {int(k): str(v) for k, v in d["held"].items()}
            bad = [v for v in held.values() if v not in SOURCES]
            if bad:
                raise ValueError(f"unknown source(s) {bad}")
            return cls(
                int(d["rank"]),
                str(d["role"]),
                int(d["committed"]),
                held,
                None if d.get("buddy") is None else int(d["buddy"]),
                None if d.get("resume_by") is None else int(d["resume_by"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise StateDivergedError(f"malformed heal report {raw[:200]!r}: {exc}") from exc


@dataclass(frozen=True)
class ResumePlan:
    """What every rank does: load ``step`` (from ``sources[rank]``) and continue at ``step + 1``."""

    step: int
    sources: dict[int, str]  # rank -> "live" | "own" | "buddy"
    replacements: tuple[int, ...]

    @property
    def resume_step(self) -> int:
        return self.step + 1

    def replayed(self, committed: int) -> int:
        """Steps a rank that had committed ``committed`` runs again."""
        return max(committed - self.step, 0)

    def healed_from(self) -> str:
        """The source the replacements were healed from ("own" or "buddy"; "buddy" if any used it)."""
        used = {self.sources[r] for r in self.replacements}
        return "buddy" if "buddy" in used else ("own" if used else "live")


def decide_resume(reports: Sequence[HealReport], world_size: int) -> ResumePlan:
    """The newest step every rank holds (resuming no later than any rank's ``resume_by``); RankLostError
    when a replacement holds nothing in common.

    Deterministic and independent of the order of ``reports``: every rank computes the same plan.
    """
    by_rank = {r.rank: r for r in reports}
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing or len(by_rank) != len(reports):
        raise StateDivergedError(
            f"heal reports from ranks {sorted(by_rank)} (of {world_size}, "
            f"{len(reports)} reports): missing {missing} or duplicated"
        )
    replacements = tuple(sorted(r.rank for r in reports if r.role == "replacement"))
    common = set.intersection(*(set(r.held) for r in reports)) if reports else set()
    caps = [r.resume_by for r in reports if r.resume_by is not None]
    if caps:  # resume at or before the earliest step a rank in a guarded region can re-run from
        capped = {s for s in common if s + 1 <= min(caps)}
        if common and not capped:
            raise RankLostError(
                f"a rank inside guard.run or finish must resume at step {min(caps)} or earlier, but the oldest "
                f"step every rank holds is {min(common)}: snapshot every step (SnapshotConfig(every=1)) so that "
                "the step before a region is held, or restore from a disk checkpoint",
                ranks=replacements,
                detected_by="heal",
                last_committed_step=min((r.committed for r in reports if r.role == "survivor"), default=None),
            )
        common = capped
    if common:
        return _plan(reports, max(common), replacements)
    survivors_low = min((r.committed for r in reports if r.role == "survivor"), default=None)
    # A replacement holding no copy (its fresh state is only step -1, which the survivors left behind).
    empty = [r for r in reports if r.role == "replacement" and not set(r.held.values()) & {"own", "buddy"}]
    if empty:
        names = "; ".join(
            f"rank {r.rank}: no valid own snapshot slot and no replica"
            + (f" from its buddy rank {r.buddy}" if r.buddy is not None else "")
            for r in empty
        )
        raise RankLostError(
            f"no in-memory copy of the lost rank(s) {[r.rank for r in empty]} survives ({names}); the state "
            f"of a rank and of its buddy's replica are both gone: restore from a disk checkpoint",
            ranks=tuple(sorted({r.rank for r in empty} | {r.buddy for r in empty if r.buddy is not None})),
            last_committed_step=survivors_low,
            detected_by="heal",
        )
    held = "; ".join(f"rank {r.rank} ({r.role}): {sorted(r.held)}" for r in sorted(reports, key=lambda r: r.rank))
    raise RankLostError(
        f"the ranks hold no step in common ({held}): the lost rank's newest copy is older than every "
        "survivor's oldest snapshot slot; restore from a disk checkpoint",
        ranks=replacements,
        detected_by="heal",
        last_committed_step=survivors_low,
    )


def _plan(reports: Sequence[HealReport], step: int, replacements: tuple[int, ...]) -> ResumePlan:
    return ResumePlan(step=step, sources={r.rank: r.held[step] for r in reports}, replacements=replacements)
