"""``StrategySpec``: everything the harness knows about one recovery strategy, in one object.

A strategy is registered once (``harness.strategies.register``) and every part of the harness asks
its spec instead of comparing strategy names: the rank process builds ``rank_class``; the parent
runs ``parent_setup`` before starting the ranks and asks ``relaunch`` after they exit; validation
calls ``check``; tables and plots use ``label``, ``color`` and ``order``; the scale simulator uses
``simulation``; the paper's published gains over a baseline are that baseline's ``paper_gain``.

Pure data plus small callables: importing this module costs nothing (no torch, no Hydra), so the
parent, the ranks and the report code can all read the registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.schema import StrategyConfig

if TYPE_CHECKING:
    from harness.schema import RunConfig

# exit_codes (rank -> code, None while running), the rank that failed first -> why relaunch, or None.
RelaunchPolicy = Callable[[Mapping[int, int | None], int | None], str | None]
# run -> None, or raise ConfigError naming the fix.
Check = Callable[["RunConfig"], None]
# (run, dead rank, its exit code, every rank's exit code) -> start a replacement for that rank only
# (the strategy heals it in memory) instead of ending the incarnation.
ReplacePolicy = Callable[["RunConfig", int, int, Mapping[int, int | None]], bool]


@dataclass(frozen=True)
class Simulation:
    """How the scale simulator (``harness.scale``) models a strategy at sizes this machine cannot run."""

    # "module:function" taking (harness.fleet.config.Cluster, failure class) -> Outcome; the mechanisms
    # are in harness.scale.outcomes, each named for what it does, so two strategies can share one.
    build: str
    label: str  # in the simulator's legend and tables
    # A lost host stops the whole job (no replica keeps training): compared with a source's synchronous
    # ETTR when it publishes one.
    synchronous: bool = False
    fault_free: bool = False  # no failures are drawn for it: the upper bound (the reference)
    # What the harness's calibration fault (a socket reset) throws away under it: "step" or "checkpoint"
    # (harness.fleet.config's rollbacks); None: the simulator is not calibrated against its runs.
    calibration_rollback: str | None = None
    # "module:function" taking (Cluster, harness.advise.cost.Platform) -> the protection it pays on every step,
    # as a fraction of the step (the advisor charges it; harness.advise.taxes); None: nothing per step, or a
    # cost the advisor chooses itself (the heal's cadence).
    per_step_tax: str | None = None

    def __post_init__(self) -> None:
        for ref in (self.build, self.per_step_tax):
            if ref is not None and ":" not in ref:
                raise ValueError(f"Simulation: {ref!r} must be 'module:function'")


@dataclass(frozen=True)
class ProjectedStrategy:
    """A strategy the simulator projects but the harness does not run (a design not built as modelled,
    or an outside system): a name and its :class:`Simulation`."""

    name: str
    simulation: Simulation
    color: str = "tab:gray"  # matplotlib colour in the simulator's plots


def never_relaunch(exit_codes: Mapping[int, int | None], first_failure: int | None) -> str | None:
    """A failed rank ends the run (the reference, and strategies that recover in process)."""
    return None


@dataclass(frozen=True)
class StrategySpec:
    """One strategy. ``name`` is what ``strategy=NAME`` selects and what results rows record."""

    name: str
    # "module:Class" of its ``harness.rank.strategies.base.Strategy`` subclass, imported in the rank only
    # (it imports torch).
    rank_class: str
    description: str
    label: str  # in tables and legends
    color: str  # matplotlib colour in every plot
    order: int  # position in tables (reference first)
    # Its config (``strategy.*``): StrategyConfig, or a subclass in the strategy's module with its own settings.
    config: type[StrategyConfig] = StrategyConfig
    relaunch: RelaunchPolicy = never_relaunch
    # "module:name" of a callable (run, launcher) -> an object the parent keeps alive for the run (closed with
    # ``close()`` if it has one), imported in the parent only (harness.parent.run); None: nothing to set up.
    parent_setup: str | None = None
    # After the first rank fails, how long the parent lets the others finish on their own (a strategy
    # whose survivors write a fallback event before exiting needs a moment) before tearing down.
    settle_s: Callable[[RunConfig], float] = lambda run: 0.0
    # "module:function" that replaces the standard rank life (harness.rank.train) when the strategy
    # must own the process groups from the start (NVRx's in-process restart); None: standard life.
    rank_entry: str | None = None
    check: Check | None = None
    replace_dead: ReplacePolicy | None = None
    # "module:function" called as fn(cfg, env) INSTEAD of building the default process group in a
    # replacement process (harness.contract REPLACEMENT > 0); what it returns is ``TrainContext.rejoin``.
    rejoin: str | None = None
    reference: bool = False  # the fault-free run every other run is compared with
    recovers_in_memory: bool = False  # the strategy under test (AccelPact's gain is measured against the rest)
    heals_lost_ranks: bool = False  # by default it heals a killed rank or a lost host in memory (AccelPact's heal)
    # The strategy's own bound on a stalled step, in seconds (torchft: its Manager's timeout), or None. A
    # network outage longer than it breaks the step whatever the PG timeout (harness.app.capabilities).
    step_timeout_s: Callable[[RunConfig], float | None] = lambda run: None
    simulation: Simulation | None = None  # how harness.scale projects it (None: not simulated)
    # The paper's published whole-run goodput gain of AccelPact over this strategy, by checkpoint age in
    # steps ({} when the paper does not compare with it); harness.report.paper collects them.
    paper_gain: Mapping[int, float] = field(default_factory=dict, hash=False)
    # What the paper calls this strategy where it quotes ``paper_gain`` ("" : ``label``).
    paper_label: str = ""
    # What a like-for-like comparison cannot make equal about this strategy, one item each: the same mesh,
    # fault and data for every strategy, each at its own default heartbeat and timeouts, every replacement
    # a fresh process (experiment=peers). experiments.peers lists them under its verdict.
    unequal: tuple[str, ...] = ()
    # Why this strategy's productive steps may run at another pace than the reference's, where known
    # (experiments.peers prints it beside every cell whose step_drift interval lies outside 0.9-1.1).
    pace: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"strategy name {self.name!r} must be a non-empty identifier (letters, digits, _)")
        for ref in (self.parent_setup, self.rank_entry, self.rejoin):
            if ref is not None and ":" not in ref:
                raise ValueError(f"StrategySpec({self.name}): {ref!r} must be 'module:name'")
        if ":" not in self.rank_class:
            raise ValueError(f"StrategySpec({self.name}).rank_class must be 'module:Class', got {self.rank_class!r}")


def resolve(ref: str) -> Any:
    """What a spec's "module:name" reference names (``rank_class``, ``parent_setup``, ``rank_entry``,
    ``rejoin``), imported now: each side resolves only its own, so this module never imports a side."""
    module_name, _, name = ref.partition(":")
    return getattr(importlib.import_module(module_name), name)
