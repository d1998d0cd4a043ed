"""Strategy registry: strategy name -> ``module:Class``, imported lazily in the rank process.

A later issue adds a strategy by adding its module and one line here; ``harness.rank.train`` is unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.strategies.base import Strategy

REGISTRY: dict[str, str] = {
    "none": "harness.strategies.none:PlainStep",
    "accelpact": "harness.strategies.accelpact:AccelPactStep",
    "cold_restart": "harness.strategies.cold_restart:ColdRestart",
    "checkpoint_restore": "harness.strategies.checkpoint_restore:CheckpointRestore",
}


def is_available(name: str) -> bool:
    """Whether the strategy's module exists yet (some arrive in later issues)."""
    target = REGISTRY.get(name)
    if target is None:
        return False
    return importlib.util.find_spec(target.split(":")[0]) is not None


def load(name: str) -> "type[Strategy]":
    if not is_available(name):
        raise NotImplementedError(
            f"strategy={name} is not implemented in this checkout; use strategy=none"
        )
    module_name, cls_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)
