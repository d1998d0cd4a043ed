"""``python -m harness.advise``: see harness.advise.cli."""

import sys

from harness.advise.cli import main

sys.exit(main())
