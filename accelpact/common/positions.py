"""Where each rank's loop is, carried by the guard's votes, so that a diverged loop is named at the vote.

The commit vote (``guard.step``) and the region votes (``guard.run``, ``guard.finish``) are one all-reduce
(SUM) of ONE int64, because the vote's cost is its latency (docs/design.md, "The vote's cost"). Each rank
adds its position to it: what it votes on, the guard's step, the regions closed since that step and the
loop's own step (-1 when the loop does not say). The position is folded into a ``b``-bit number ``h`` (each
field times its own odd constant, summed modulo ``2**b``: two positions that differ in one field by less
than ``2**b`` never fold alike), and the rank contributes ``1 + h * 2**c + h*h * 2**(2c + b)``, where
``2**c`` exceeds the world size and ``b = 21 - c`` keeps the three sums apart in 63 bits. The sum then
holds the voters' count ``n``, ``sum(h)`` and ``sum(h*h)``: the ranks agree exactly when
``n * sum(h*h) == sum(h) ** 2`` (Cauchy-Schwarz), which every rank computes from the same sum.

A disagreement means the ranks run different steps, or one finishes while another trains; the guard
then gathers every rank's position and raises ``StateDivergedError`` naming them, before any rank applies
the step. Pure logic, free of torch.distributed.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Position", "KINDS", "VoteCodec", "encode", "count_of", "agreed", "describe", "NO_LOOP_STEP"]

KINDS = ("step", "region", "finish")
NO_LOOP_STEP = -1  # the loop did not pass its step


@dataclass(frozen=True)
class Position:
    """One rank's position at a vote."""

    kind: str  # one of KINDS: what the vote closes
    guard_step: int  # guard.next_step: the step the guard runs (or the one after the last commit, in a region)
    region: int  # regions closed since the last commit (a region vote counts the one it closes)
    loop_step: int = NO_LOOP_STEP  # the loop's own step number, as last passed to guard.step(step=...)

    def values(self) -> tuple[int, int, int, int]:
        return KINDS.index(self.kind), self.guard_step, self.region, self.loop_step

    @classmethod
    def from_values(cls, values: Sequence[int]) -> Position:
        kind, guard_step, region, loop_step = (int(v) for v in values)
        return cls(KINDS[kind], guard_step, region, loop_step)

    def __str__(self) -> str:
        where = {
            "step": f"in guard.step of step {self.guard_step}",
            "region": f"in guard.run no. {self.region} after step {self.guard_step - 1}",
            "finish": f"in guard.finish after step {self.guard_step - 1}",
        }[self.kind]
        loop = "" if self.loop_step == NO_LOOP_STEP else f", the loop at step {self.loop_step}"
        return where + loop


_FOLD = (0x1B873593, 0x9E3779B1, 0x7F4A7C15, 1)  # odd: kind, guard step, region, loop step


class VoteCodec:
    """The one-element vote's arithmetic for ``world_size`` voters (see the module docstring); built once per
    group, because the vote runs every step."""

    def __init__(self, world_size: int, group: object = None) -> None:
        c = max(1, world_size.bit_length())  # 2**c > world_size
        b = 21 - c
        if b < 1:
            raise ValueError(f"a one-element position vote holds at most 2**20 - 1 ranks, not {world_size}")
        self.world_size, self.c, self.b = world_size, c, b
        # The vote group it was built for (the guard's cache key), held weakly: a recovery's rebind must find
        # no strong reference to a retired group anywhere (accelpact.dataplane.references).
        self._group = weakref.ref(group) if group is not None else None
        self._mask_b, self._mask_c, self._mask_s1 = (1 << b) - 1, (1 << c) - 1, (1 << (c + b)) - 1
        self._shift2 = 2 * c + b

    @property
    def group(self) -> object:
        """The group this codec was built for, or None once that group is gone."""
        return self._group() if self._group is not None else None

    def fold(self, kind: int, guard_step: int, region: int, loop_step: int) -> int:
        """The position as a ``b``-bit number: two positions that differ in one field by less than 2**b never
        fold alike (each field's constant is odd)."""
        k0, k1, k2, k3 = _FOLD
        return (k0 * (kind + 1) + k1 * (guard_step + 1) + k2 * (region + 1) + k3 * (loop_step + 1)) & self._mask_b

    def encode(self, kind: int, guard_step: int, region: int, loop_step: int) -> int:
        """This rank's contribution to the vote's sum (``kind``: an index into KINDS)."""
        # fold(), inlined: this runs in every vote, where each Python call adds to the step's latency
        h = (
            0x1B873593 * (kind + 1) + 0x9E3779B1 * (guard_step + 1) + 0x7F4A7C15 * (region + 1) + loop_step + 1
        ) & self._mask_b
        return 1 + (h << self.c) + ((h * h) << self._shift2)

    def count(self, summed: int) -> int:
        """How many ranks voted: the NCCL vote's proof that every rank's vote arrived."""
        return summed & self._mask_c

    def agreed(self, summed: int) -> bool:
        """True when every voter voted from the same position (``summed``: the vote's result)."""
        s1 = (summed >> self.c) & self._mask_s1
        return (summed & self._mask_c) * (summed >> self._shift2) == s1 * s1


def encode(position: Position, world_size: int) -> int:
    """``position``'s contribution to a vote of ``world_size`` ranks."""
    return VoteCodec(world_size).encode(*position.values())


def count_of(summed: int, world_size: int) -> int:
    return VoteCodec(world_size).count(summed)


def agreed(summed: int, world_size: int) -> bool:
    return VoteCodec(world_size).agreed(summed)


def describe(positions: dict[int, Position]) -> str:
    """The error text: every rank's position, and the fix when a loop's step is not the guard's."""
    lines = "; ".join(f"rank {r}: {p}" for r, p in sorted(positions.items()))
    behind = sorted(
        r for r, p in positions.items() if p.loop_step not in (NO_LOOP_STEP, p.guard_step) and p.kind == "step"
    )
    hint = (
        (
            "the loop's step is not the guard's on rank(s) "
            f"{behind}: a RolledBack was not applied; on `except accelpact.RolledBack as back:` set the loop's "
            "step to back.resume_step (and restore back.extra_state)"
        )
        if behind
        else ("every rank must call guard.step, guard.run and guard.finish in the same order, at the same steps")
    )
    return f"the ranks' loops diverged ({lines}): {hint}"
