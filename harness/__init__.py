"""AccelPact's benchmarking harness: Hydra app (parent) plus Hydra-free rank processes.

Importing this package must stay cheap and must not import Hydra: rank processes import
``harness.rank.worker`` through it. Two things happen here:

- the harness's own dependencies (the ``harness`` extra) are checked with ``find_spec`` (nothing is
  imported); without them ``import harness`` fails with one line naming the extra, instead of a
  traceback from deep inside whichever module first needed one;
- a deprecation warning that torch prints on import when the ``pynvml`` shim is installed is
  silenced; left on, it would turn every one-line config error on stderr into three lines.
"""

import importlib.util
import sys
import warnings

# Import names of the `harness` extra in pyproject.toml (hydra-core installs `hydra`).
_EXTRA_MODULES = ("hydra", "omegaconf", "transformers", "pandas", "matplotlib", "pyarrow", "psutil", "tqdm")


class MissingExtraError(ImportError):
    """The harness was imported without its extra; the message names the install command."""


def _missing_extra() -> list[str]:
    return [name for name in _EXTRA_MODULES if importlib.util.find_spec(name) is None]


def _one_line_excepthook(previous):
    """Report MissingExtraError as its one line (the traceback only points here); others as before."""

    def hook(exc_type, exc, tb):
        if isinstance(exc, MissingExtraError):
            print(f"ImportError: {exc}", file=sys.stderr)
        else:
            previous(exc_type, exc, tb)

    return hook


_missing = _missing_extra()
if _missing:
    sys.excepthook = _one_line_excepthook(sys.excepthook)
    raise MissingExtraError(
        f"the harness needs its extra: pip install 'accelpact[harness]' (missing: {', '.join(_missing)})"
    )

warnings.filterwarnings("ignore", message="The pynvml package is deprecated", category=FutureWarning)
