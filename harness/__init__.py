"""AccelPact's benchmarking harness: Hydra app (parent) plus Hydra-free rank processes.

Importing this package must stay cheap and must not import Hydra: rank processes import
``harness.rank.worker`` through it. The only side effect is silencing a deprecation warning that torch
prints on import when the ``pynvml`` shim is installed; left on, it would turn every one-line
config error on stderr into three lines.
"""

import warnings

warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
