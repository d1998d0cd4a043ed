"""Make the session helpers (_session, _compare, _shim) importable however pytest imports tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
