"""experiments/ is run from the repo root (`python -m experiments.X`) and is not an installed package
(pyproject's package list has accelpact and harness only): put the repo root on the path."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
