"""The strategy registry: strategy name -> ``StrategySpec`` (see ``harness.strategies.spec``).

Each built-in strategy is one module here that defines ``SPEC``; the registry imports those modules
on first use. They are the strategies' common layer, torch-free, so the parent, the ranks and the reports all
read the same registry; a spec names its rank side (``harness.rank.strategies``) and parent side
(``harness.parent.strategies``) by "module:name" strings, which each side resolves (:func:`resolve`).
A strategy from outside the harness registers itself with :func:`register` from a plugin module named
in ``HARNESS_PLUGINS`` (``harness.plugins``), which the parent and every rank import at start-up.
Nothing outside this package compares strategy names: ask the spec.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from harness.registry import Registry
from harness.schema import StrategyConfig
from harness.strategies.spec import ProjectedStrategy, Simulation, StrategySpec, resolve

__all__ = [
    "StrategySpec",
    "Simulation",
    "ProjectedStrategy",
    "register",
    "register_projected",
    "get",
    "names",
    "specs",
    "reference",
    "under_test",
    "healer",
    "resolve",
    "relaunch_reason",
    "simulated",
    "projected_strategies",
    "color",
    "config_class",
]

_BUILTIN_MODULES = (
    "none",
    "accelpact",
    "accelpact_heal",
    "cold_restart",
    "checkpoint_restore",
    "torchft_hsdp",
    "gemini",
)
_REGISTRY: Registry[StrategySpec] = Registry(
    "strategy",
    StrategySpec,
    lambda s: s.name,
    lambda: [importlib.import_module(f"harness.strategies.{m}").SPEC for m in _BUILTIN_MODULES],
)


# Strategies only the scale simulator knows (harness.strategies.projected, and plugins').
_PROJECTED: Registry[ProjectedStrategy] = Registry(
    "projected strategy",
    ProjectedStrategy,
    lambda p: p.name,
    lambda: importlib.import_module("harness.strategies.projected").PROJECTED,
)


def register_projected(strategy: ProjectedStrategy) -> ProjectedStrategy:
    """Add a strategy the simulator projects and the harness does not run (a plugin's, say)."""
    if strategy.name in names():
        raise ValueError(f"strategy {strategy.name!r} is a harness strategy: give its StrategySpec a simulation")
    return _PROJECTED.register(strategy)


def simulated() -> dict[str, Simulation]:
    """Every strategy the scale simulator models, by name: the harness's (table order), then the projected
    ones (registration order)."""
    out = {s.name: s.simulation for s in specs() if s.simulation is not None}
    for p in _PROJECTED.specs():
        out.setdefault(p.name, p.simulation)
    return out


def projected_strategies() -> list[ProjectedStrategy]:
    """The strategies only the simulator knows, in registration order."""
    return list(_PROJECTED.specs())


def color(name: str) -> str:
    """The plot colour of ``name``: a harness strategy's spec, else a projected strategy's."""
    if name in names():
        return get(name).color
    return _PROJECTED.get(name).color


def register(spec: StrategySpec) -> StrategySpec:
    """Add a strategy (a plugin's, say). The same spec again is a no-op; another under a taken name raises."""
    return _REGISTRY.register(spec)


def get(name: str) -> StrategySpec:
    """The spec of ``name``; KeyError naming the registered strategies if there is none."""
    return _REGISTRY.get(name)


def config_class(name: str) -> type[StrategyConfig]:
    """The config class ``strategy=NAME`` composes against; the common StrategyConfig for a name not registered
    (validation then says which names are)."""
    return get(name).config if name in names() else StrategyConfig


def names() -> list[str]:
    return [s.name for s in specs()]


def specs() -> list[StrategySpec]:
    """Every registered strategy, in table order."""
    return sorted(_REGISTRY.specs(), key=lambda s: (s.order, s.name))


def reference() -> StrategySpec:
    """The fault-free reference strategy."""
    return next(s for s in specs() if s.reference)


def under_test(present: Iterable[str] = (), preferred: str | None = None) -> StrategySpec:
    """The strategy whose gain over the others a comparison reports: ``preferred`` when given (it must be
    registered: ``compare.ours``), else the first in-memory strategy (table order) among the ``present``
    names, else the first in-memory strategy (AccelPact)."""
    if preferred:
        return get(preferred)
    ours = [s for s in specs() if s.recovers_in_memory]
    present = set(present)
    return next((s for s in ours if s.name in present), ours[0])


def healer() -> StrategySpec:
    """The strategy under test that heals a lost process or host in memory by default (AccelPact's heal):
    what an experiment about losing a rank runs."""
    return next(s for s in specs() if s.recovers_in_memory and s.heals_lost_ranks)


def relaunch_reason(
    name: str,
    exit_codes: Mapping[int, int | None],
    restarts: int,
    max_restarts: int,
    interrupted: bool,
    first_failure: int | None = None,
) -> str | None:
    """Why the parent should relaunch every rank of a ``name`` run now, or None to stop there.

    The strategy's own policy decides, within ``strategy.max_restarts`` and never after Ctrl-C.
    ``first_failure``: the rank that failed first (the others were torn down by the parent)."""
    if interrupted or restarts >= max_restarts:
        return None
    if not any(c not in (0, None) for c in exit_codes.values()):
        return None
    return get(name).relaunch(exit_codes, first_failure)
