"""What a rank imported by the end of its first step, recorded for the template to preload.

A script's top-level imports are not all it loads: transformers, for one, imports a model's module
(``transformers.models.gpt2.modeling_gpt2``) only when the model is first built, and torch loads parts of
itself on first use. A replacement forked from a template that lacks them pays those imports inside the
heal (0.9-2.6 s measured at world 2 with a GPT-2 model). So under ``accelpact.run`` the agent names a
store key in ``ACCELPACT_MODULES_KEY`` for one rank per node; that rank's guard writes the names in
``sys.modules`` there once its first step committed (:func:`record`), and the agent hands them to the
template (accelpact.run.template), which imports them before it forks the next replacement.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient

__all__ = ["MODULES_KEY_ENV", "record", "names_to_preload"]

MODULES_KEY_ENV = "ACCELPACT_MODULES_KEY"


def names_to_preload(loaded: list[str]) -> list[str]:
    """The modules to import in a template: all of them but the script itself (``__main__``, run by each
    child) and the interpreter's own dunder modules. A name that is not importable on its own fails in the
    template, harmlessly."""
    return sorted(n for n in loaded if not n.startswith("__"))


def record(control: ControlClient, env: dict[str, str] | None = None) -> bool:
    """Write this process's modules to the key the agent named (nothing when it named none); True if written."""
    key = (os.environ if env is None else env).get(MODULES_KEY_ENV)
    if not key:
        return False
    control.set(key, json.dumps(names_to_preload(list(sys.modules))).encode())
    return True
