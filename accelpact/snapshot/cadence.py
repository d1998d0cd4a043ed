"""The snapshot cadence a per-step tax budget allows (``SnapshotConfig.max_tax``).

Pure logic (no torch, no I/O). Protection costs every step: the snapshot (copy and CRC-32) and the buddy
push (the sender's and, on the buddy's host, the receiver's CPU). How much depends on the machine: on a
CPU-bound host all of it competes with training, on a GPU node most of it hides beside compute. So
instead of a fixed cadence the snapshotter can measure the first snapshots' costs and take the densest
cadence whose predicted tax fits the budget:

    tax(e, k) = (snapshot_s / e + push_s / (e * k)) / step_s

for ``every`` = e and ``push_every`` = k, powers of two, with the replay bound K = e * k at most
``max_bound``. The densest is the smallest K, then the smallest e (a crashed process replays at most
e - 1 steps, a lost host at most K). When no cadence within the bound fits the budget, the cheapest
within the bound is taken, and the caller says so. Higher costs never give a denser cadence.

Every rank must use the same cadence, or a heal finds no step that every rank holds; ranks agree by
combining their measurements (:func:`combine`) and switching at the same step (:class:`Schedule`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Costs", "Schedule", "CostProbe", "predicted_tax", "choose", "combine", "candidates"]

_POW2 = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Costs:
    """What protection costs on one rank: CPU seconds per snapshot (copy + seal) and per push (both ends),
    and the wall seconds of a step."""

    snapshot_s: float
    push_s: float
    step_s: float

    def __post_init__(self) -> None:
        if min(self.snapshot_s, self.push_s) < 0 or self.step_s <= 0:
            raise ValueError(f"{self}: costs must be >= 0 and the step > 0")

    def to_list(self) -> list[float]:
        return [self.snapshot_s, self.push_s, self.step_s]

    @classmethod
    def from_list(cls, v: Sequence[float]) -> Costs:
        return cls(float(v[0]), float(v[1]), float(v[2]))


def predicted_tax(costs: Costs, every: int, push_every: int) -> float:
    """The fraction of a step that protection costs at this cadence."""
    return (costs.snapshot_s / every + costs.push_s / (every * push_every)) / costs.step_s


def candidates(max_bound: int, pushes: bool = True) -> list[tuple[int, int]]:
    """(every, push_every) pairs, powers of two, with every * push_every <= max_bound, densest first."""
    if max_bound < 1:
        raise ValueError(f"max_bound={max_bound}: the most steps a heal may replay must be >= 1")
    pairs = [(e, k) for e in _POW2 for k in (_POW2 if pushes else (1,)) if e * k <= max_bound]
    return sorted(pairs, key=lambda p: (p[0] * p[1], p[0]))


def choose(costs: Costs, max_tax: float, max_bound: int = 64, pushes: bool = True) -> tuple[int, int, bool]:
    """(every, push_every, fits): the densest cadence whose tax is at most ``max_tax``; else the cheapest
    within ``max_bound`` and ``fits=False``."""
    if not 0 < max_tax < 1:
        raise ValueError(f"max_tax={max_tax}: give the budget as a fraction of a step, e.g. 0.03 for 3%")
    pairs = candidates(max_bound, pushes)
    for e, k in pairs:
        if predicted_tax(costs, e, k) <= max_tax:
            return e, k, True
    e, k = min(pairs, key=lambda p: (predicted_tax(costs, *p), p[0] * p[1]))
    return e, k, False


def combine(per_rank: Iterable[Costs]) -> Costs:
    """The job's costs from every rank's: the dearest snapshot and push, the shortest step (the cadence is
    then within budget on every rank)."""
    rows = list(per_rank)
    if not rows:
        raise ValueError("no rank's costs to combine")
    return Costs(max(c.snapshot_s for c in rows), max(c.push_s for c in rows), min(c.step_s for c in rows))


@dataclass(frozen=True)
class Schedule:
    """The warm-up cadence until ``switch_at``, the chosen one from then on. ``switch_at`` is a step both
    cadences push (a multiple of both replay bounds), so the slot of the newest pushed step stays kept
    across the switch (``accelpact.snapshot.push_rule.slot_to_overwrite``)."""

    every: int
    push_every: int
    switch_at: int
    warm_every: int = 1
    warm_push_every: int = 1

    @classmethod
    def after(cls, step: int, warm: tuple[int, int], chosen: tuple[int, int]) -> Schedule:
        """Switch at the first step after ``step`` that both cadences push."""
        k_old, k_new = warm[0] * warm[1], chosen[0] * chosen[1]
        lcm = k_old * k_new // _gcd(k_old, k_new)
        return cls(chosen[0], chosen[1], (step // lcm + 1) * lcm, warm[0], warm[1])

    def at(self, step: int) -> tuple[int, int]:
        """(every, push_every) in force for ``step``."""
        if step >= self.switch_at:
            return self.every, self.push_every
        return self.warm_every, self.warm_push_every

    def to_text(self) -> str:
        return f"{self.every},{self.push_every},{self.switch_at},{self.warm_every},{self.warm_push_every}"

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        e, k, s, we, wk = (int(x) for x in text.split(","))
        return cls(e, k, s, we, wk)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@dataclass
class CostProbe:
    """One rank's measurements: the median snapshot and push CPU seconds and step wall seconds seen."""

    snapshot_s: list[float] = field(default_factory=list)
    push_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)

    def add_snapshot(self, cpu_s: float, push_cpu_s: float | None) -> None:
        """One snapshot's copy + seal CPU, and its push's sender CPU when it was pushed (None otherwise)."""
        self.snapshot_s.append(cpu_s)
        if push_cpu_s is not None:
            self.push_s.append(push_cpu_s)

    def add_step(self, wall_s: float) -> None:
        if wall_s > 0:
            self.step_s.append(wall_s)

    def ready(self, n: int) -> bool:
        return len(self.snapshot_s) >= n and len(self.step_s) >= n

    def costs(self, receiver_factor: float = 1.0) -> Costs:
        """Medians; the push counts the sender's CPU and the receiver's, taken as ``receiver_factor`` times
        the sender's (the buddy's host pays it; measured here at 1.0-1.2x, results/heal_tax)."""
        push = statistics.median(self.push_s) * (1.0 + receiver_factor) if self.push_s else 0.0
        return Costs(statistics.median(self.snapshot_s), push, statistics.median(self.step_s))
