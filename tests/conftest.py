"""Suite-wide set-up: session ranks are forked from one preloaded template.

Starting a session rank from scratch costs about 7.5 s of imports; the default suite starts a few dozen
sessions. With :func:`accelpact.testing.session.use_template` they fork from one process that imported
torch, FSDP, transformers and the scenario runners once (accelpact.testing.rank_template).
``ACCELPACT_TEST_SPAWN=1`` turns it off, to check that a failure does not depend on how ranks start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# What the suite's runners import at their top level beyond torch and accelpact (the model code).
PRELOAD = ("experiments.workloads.fsdp_models", "experiments.workloads.fsdp_scenarios")


@pytest.fixture(scope="session", autouse=True)
def _rank_template() -> Iterator[None]:
    if os.environ.get("ACCELPACT_TEST_SPAWN"):
        yield
        return
    from accelpact.testing import session

    session.use_template(PRELOAD)  # the template itself starts with the first session
    try:
        yield
    finally:
        session.stop_template()
