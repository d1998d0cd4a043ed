"""The fault registry: fault kind -> ``FaultSpec`` (``harness.faults.spec``: who applies it, and how).

The built-in kinds are the entries in ``harness.faults.kinds``; a plugin module named in
``HARNESS_PLUGINS`` adds its own with :func:`register`. Nothing outside ``harness.faults`` compares
fault kinds: ask the spec. Torch-free and cheap to import.
"""

from __future__ import annotations

import importlib

from harness.faults.spec import NO_FAULT, FaultSpec
from harness.registry import Registry

__all__ = ["FaultSpec", "register", "get", "kinds", "NO_FAULT"]

_REGISTRY: Registry[FaultSpec] = Registry(
    "fault kind", FaultSpec, lambda s: s.kind, lambda: importlib.import_module("harness.faults.kinds").BUILTIN
)


def register(spec: FaultSpec) -> FaultSpec:
    """Add a fault kind (a plugin's, say). The same spec again is a no-op; another under a taken kind raises."""
    return _REGISTRY.register(spec)


def get(kind: str) -> FaultSpec:
    """The spec of ``kind``; KeyError naming the registered kinds if there is none."""
    return _REGISTRY.get(kind)


def kinds() -> list[str]:
    return _REGISTRY.names()
