"""The Hydra application side: typed config schemas, composition, validation, preflight, memory plan.

Only the parent process imports this package's Hydra parts (``config``, ``preflight``); rank processes
use ``schema`` alone, which is plain dataclasses.
"""

import sys
from pathlib import Path

# Hydra instantiates a sweeper only from the top-level ``hydra_plugins`` namespace package. The
# harness's trials sweeper (``hydra/sweeper=trials``) lives in ``harness/app/plugins/hydra_plugins/``
# (the repository's top level is fixed), and that folder joins the namespace here, before any Hydra
# composition: every Hydra entry (``python -m harness``, ``harness.app.config.compose``) imports this
# package first. Appended, so installed plugin packages (e.g. hydra-submitit-launcher) keep precedence.
_PLUGINS = str(Path(__file__).resolve().parent / "plugins")
if _PLUGINS not in sys.path:
    sys.path.append(_PLUGINS)
