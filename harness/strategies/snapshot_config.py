"""The config of the strategies that snapshot (``accelpact``, ``accelpact_heal``): ``strategy.snapshot``.

accelpact's per-step snapshots in shared memory and the buddy replica they push are what let a killed rank or
a lost host heal in memory (accelpact.snapshot). The parent's memory plan and template choice, and the rank's
heal, read them through :func:`snapshots_of`, which also answers for any other strategy with a ``snapshot``
block (GEMINI's in-memory captures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from harness.schema import StrategyConfig, own_config

__all__ = ["SnapshotSettings", "AccelpactConfig", "Snapshots", "snapshots_of", "accelpact_config"]


@dataclass
class SnapshotSettings:
    """accelpact's per-step snapshots (accelpact.snapshot) and the in-memory heal of a lost rank."""

    every: int = 0  # snapshot every k committed steps; 0 = off (a lost rank then falls back to disk)
    replicas: bool = True  # also push each snapshot to the buddy rank (accelpact.snapshot.replica)
    # Push only every k-th snapshot (the steps divisible by every * push_every); a heal after a host loss
    # then replays up to every * push_every steps (docs/snapshots.md, "push_every"). 1: every snapshot.
    push_every: int = 1
    # A push counts as part of its snapshot: the next step's vote waits for the buddy's acknowledgement
    # (Replication(confirm=True)), which is what makes that bound hold when a push lags.
    confirm_push: bool = False
    pause_mid_copy_s: float = 0.0  # fault-injection tests only: each copy sleeps this long halfway
    # A budget for the protection's cost, a fraction of a step: every/push_every are then the warm-up's, and
    # after tax_warmup steps the ranks agree on the densest cadence that fits, replaying at most max_bound
    # steps after a host loss (accelpact.snapshot.tax_budget; docs/snapshots.md). None: a fixed cadence.
    max_tax: Optional[float] = None
    max_bound: int = 16
    tax_warmup: int = 8

    def cadence(self) -> dict[str, Any]:
        """The keyword arguments of accelpact's ``SnapshotConfig`` that these settings give (its cadence and budget)."""
        names = ("every", "push_every", "max_tax", "max_bound", "tax_warmup")
        return {name: getattr(self, name) for name in names}


@dataclass
class AccelpactConfig(StrategyConfig):
    """``strategy=accelpact`` and ``strategy=accelpact_heal``: the common settings plus the snapshots (on, every
    > 0, a killed rank heals in memory: the parent starts a replacement for that rank only)."""

    snapshot: SnapshotSettings = field(default_factory=SnapshotSettings)


class Snapshots(Protocol):
    """What the parent needs of any strategy's snapshot block: how often, and whether a peer holds a copy."""

    every: int
    replicas: bool


def snapshots_of(strategy: StrategyConfig) -> Snapshots | None:
    """The strategy's snapshot block when it takes snapshots (``every > 0``), else None."""
    snap: Snapshots | None = getattr(strategy, "snapshot", None)
    return snap if snap is not None and snap.every > 0 else None


def accelpact_config(strategy: StrategyConfig) -> AccelpactConfig:
    """``strategy`` as accelpact's config; ConfigError when a config of another strategy reaches accelpact's code."""
    return own_config(strategy, AccelpactConfig, "snapshot", "strategy=accelpact or strategy=accelpact_heal")
