"""Plugins: modules named in ``HARNESS_PLUGINS`` that register strategies and fault kinds.

``HARNESS_PLUGINS=my_pkg.strategies,my_pkg.faults python -m harness strategy=mine fault=my_fault``
imports each module in the parent before the config is composed, and in every rank before it reads
the registries (the ranks inherit the environment). A plugin module calls
``harness.strategies.register(StrategySpec(...))`` and/or ``harness.faults.registry.register(
FaultSpec(...))`` at import; its options become selectable as ``strategy=NAME`` / ``fault=KIND``
without a YAML file (``harness.app.config.register_schemas``). It must not import Hydra at module level:
rank processes import it too. See docs/extending.md.
"""

from __future__ import annotations

import importlib
import os

PLUGINS_ENV = "HARNESS_PLUGINS"


class PluginError(ImportError):
    """A module named in HARNESS_PLUGINS could not be imported."""


def load_plugins(environ: os._Environ[str] | dict[str, str] = os.environ) -> list[str]:
    """Import every module named in ``HARNESS_PLUGINS`` (comma-separated); returns their names."""
    names = [n.strip() for n in environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise PluginError(
                f"{PLUGINS_ENV} names {name!r}, which failed to import ({type(exc).__name__}: {exc}); "
                "check the module path and that it is on PYTHONPATH"
            ) from exc
    return names
