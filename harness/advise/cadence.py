"""The heal's snapshot settings a fault rate calls for, and what each setting costs a fault.

For a cadence (``every`` = e, ``push_every`` = k, ``confirm``), with K = e k (the replay bound of
``accelpact.snapshot.push_rule``) and steps of s seconds:

- a crashed process heals from its own shared-memory snapshot, the newest of every e-th step: it replays
  the committed steps since, (e - 1) / 2 on average (at most e - 1);
- a lost host heals from the buddy's replica of the newest pushed step: (K - 1) / 2 steps on average,
  plus, when the loss strikes the step right after a pushed one before its replica landed (a chance of
  min(1, push / s) in K), K steps instead of 0: at most K with ``confirm``;
- without ``confirm`` nothing makes a pushed step wait for its replica: when the loss strikes while the
  newest pushed replica is still in flight (a chance of min(1, (snapshot + push) / (K s))), no step is held
  by every rank and the job falls back to its disk checkpoint: a cold restart plus half a checkpoint
  interval replayed;
- planned maintenance drains the host after a pushed step: nothing replayed.

The choice minimises the expected time lost per unit of time, to first order: the per-step tax
(``harness.advise.cost``) plus, for each class, its rate x the expected replay (and fallback) per failure.
That is tax(c) + r x loss(c) for a fault rate r times the mix's shape, and loss grows with K, so a higher
rate never picks a cadence with a larger expected loss; ties go to the denser cadence. The simulator then
measures the chosen cadence's ETTR (``harness.scale.project`` with the rows of ``heal_outcomes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.advise.cost import Cadence, Platform, Tax, push_time_s, tax
from harness.fleet.config import CLASSES, ROLLBACK_NONE, Cluster, FailureClass, Outcome

__all__ = ["CANDIDATES", "Choice", "expected_replay_steps", "heal_outcomes", "choose"]

_POW2 = (1, 2, 4, 8, 16, 32, 64)
# Every e and k a power of two up to 64, K = e k at most 256, with and without confirmed pushes.
CANDIDATES: tuple[Cadence, ...] = tuple(
    Cadence(e, k, c) for e in _POW2 for k in _POW2 if e * k <= 256 for c in (True, False)
)


def _snapshot_s(platform: Platform, state_bytes: float) -> float:
    gb = state_bytes / 1e9
    return gb / platform.copy_gbps + gb / platform.checksum_gbps + platform.fixed_s


def expected_replay_steps(
    cadence: Cadence, cls: str, platform: Platform, state_bytes: float, step_s: float
) -> tuple[float, float]:
    """(mean steps replayed by a heal, chance the heal finds no common step and falls back to disk)."""
    e, k = cadence.every, cadence.push_every
    K = e * k
    if cls == "process_crash":
        return (e - 1) / 2.0, 0.0
    if cls == "gpu_host_loss":
        push = push_time_s(platform, state_bytes)
        if cadence.confirm:
            return (K - 1) / 2.0 + min(1.0, push / step_s), 0.0
        return (K - 1) / 2.0, min(1.0, (_snapshot_s(platform, state_bytes) + push) / (K * step_s))
    return 0.0, 0.0


def heal_outcomes(
    base: Mapping[str, Outcome],
    cold: Mapping[str, Outcome],
    cadence: Cadence,
    platform: Platform,
    state_bytes: float,
    step_s: float,
    fallback_interval_s: float,
) -> dict[str, Outcome]:
    """The heal's outcome rows at ``cadence``: ``base`` (the simulator's heal, which replays only the step in
    flight) plus a ``replay`` part for the steps the cadence loses, and a ``fallback`` part for the expected
    disk restart (``cold``'s downtime plus half of ``fallback_interval_s``, times its chance)."""
    out = {}
    for cls in CLASSES:
        o = base[cls]
        if o.rollback == ROLLBACK_NONE or cls not in ("process_crash", "gpu_host_loss"):
            out[cls] = o
            continue
        replay, p_fb = expected_replay_steps(cadence, cls, platform, state_bytes, step_s)
        parts = dict(o.parts)
        parts["replay"] = replay * step_s
        if p_fb:
            parts["fallback"] = p_fb * (cold[cls].downtime_s + fallback_interval_s / 2.0)
        out[cls] = Outcome(o.rollback, parts, f"{o.note}; {cadence.text()}")
    return out


@dataclass(frozen=True)
class Choice:
    cadence: Cadence
    tax: Tax
    loss_rate: float  # expected fraction of time lost to replays and fallbacks
    objective: float  # tax fraction + loss_rate

    @property
    def replay_bound(self) -> int:
        return self.cadence.replay_bound


def _loss_rate(
    cadence: Cadence,
    rates_per_s: Mapping[str, float],
    platform: Platform,
    state_bytes: float,
    step_s: float,
    fallback_s: Mapping[str, float],
) -> float:
    lost = 0.0
    for cls in ("process_crash", "gpu_host_loss"):
        replay, p_fb = expected_replay_steps(cadence, cls, platform, state_bytes, step_s)
        lost += rates_per_s.get(cls, 0.0) * (replay * step_s + p_fb * fallback_s.get(cls, 0.0))
    return lost


def choose(
    platform: Platform,
    state_bytes: float,
    step_s: float,
    rates_per_s: Mapping[str, float],
    fallback_s: Mapping[str, float] | None = None,
    candidates: Sequence[Cadence] = CANDIDATES,
) -> Choice:
    """The cadence with the least tax + expected loss; ties to the smaller replay bound, then every, then
    confirmed pushes. ``rates_per_s``: job-wide failures per second by class; ``fallback_s``: what a fall
    back to disk costs per class (restart + half a checkpoint interval)."""
    fallback_s = fallback_s or {}
    best: tuple[tuple, Choice] | None = None
    for c in candidates:
        t = tax(platform, state_bytes, step_s, c)
        loss = _loss_rate(c, rates_per_s, platform, state_bytes, step_s, fallback_s)
        obj = t.fraction + loss
        key = (round(obj, 12), c.every * c.push_every, c.every, not c.confirm)
        if best is None or key < best[0]:
            best = (key, Choice(c, t, loss, obj))
    assert best is not None
    return best[1]


def job_rates(mix: Mapping[str, FailureClass], cluster: Cluster) -> dict[str, float]:
    """Failures per second of the whole job, by class."""
    return {c: mix[c].job_rate_per_s(cluster.gpus) for c in CLASSES}
