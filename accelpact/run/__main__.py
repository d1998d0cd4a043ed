"""``python -m accelpact.run [torchrun flags] SCRIPT [args]``: see accelpact.run.cli and docs/launcher.md."""

import sys

from accelpact.run.cli import main

sys.exit(main())
