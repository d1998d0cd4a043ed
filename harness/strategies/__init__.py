"""The strategy registry: strategy name -> ``StrategySpec`` (see ``harness.strategies.spec``).

Each built-in strategy is one module here that defines ``SPEC``; the registry imports those modules
on first use (they import torch only inside their methods, so reading the registry stays cheap).
A strategy from outside the harness registers itself with :func:`register` from a plugin module named
in ``HARNESS_PLUGINS`` (``harness.plugins``), which the parent and every rank import at start-up.
Nothing outside this package compares strategy names: ask the spec.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Mapping, Optional

from harness.strategies.spec import StrategySpec

if TYPE_CHECKING:
    from harness.strategies.base import Strategy

__all__ = ["StrategySpec", "register", "get", "names", "specs", "reference", "under_test", "rank_class", "relaunch_reason"]

_BUILTIN_MODULES = ("none", "accelpact", "cold_restart", "checkpoint_restore")
_REGISTRY: dict[str, StrategySpec] = {}
_loaded = False


def _ensure_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        register(importlib.import_module(f"harness.strategies.{module}").SPEC)


def register(spec: StrategySpec) -> StrategySpec:
    """Add a strategy. Registering the same spec again is a no-op; a different one under a taken name raises."""
    if not isinstance(spec, StrategySpec):
        raise TypeError(f"register() takes a StrategySpec, got {type(spec).__name__}")
    _ensure_builtins()  # a plugin must not take a built-in's name before the built-ins load
    old = _REGISTRY.get(spec.name)
    if old is not None and old != spec:
        raise ValueError(f"strategy {spec.name!r} is already registered (by {old.rank_class}); pick another name")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> StrategySpec:
    """The spec of ``name``; KeyError naming the registered strategies if there is none."""
    _ensure_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; registered: {', '.join(names())}") from None


def names() -> list[str]:
    return [s.name for s in specs()]


def specs() -> list[StrategySpec]:
    """Every registered strategy, in table order."""
    _ensure_builtins()
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))


def reference() -> StrategySpec:
    """The fault-free reference strategy."""
    return next(s for s in specs() if s.reference)


def under_test() -> StrategySpec:
    """The strategy whose gain over the others the comparison reports (AccelPact)."""
    return next(s for s in specs() if s.recovers_in_memory)


def rank_class(name: str) -> "type[Strategy]":
    """Import the rank-side class of ``name`` (rank processes only: it imports torch)."""
    module_name, cls_name = get(name).rank_class.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def relaunch_reason(name: str, exit_codes: "Mapping[int, Optional[int]]", restarts: int, max_restarts: int,
                    interrupted: bool, first_failure: Optional[int] = None) -> Optional[str]:
    """Why the parent should relaunch every rank of a ``name`` run now, or None to stop there.

    The strategy's own policy decides, within ``strategy.max_restarts`` and never after Ctrl-C.
    ``first_failure``: the rank that failed first (the others were torn down by the parent)."""
    if interrupted or restarts >= max_restarts:
        return None
    if not any(c not in (0, None) for c in exit_codes.values()):
        return None
    return get(name).relaunch(exit_codes, first_failure)
