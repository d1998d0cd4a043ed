"""A hot spare's wait (``strategy.hot_spares``): import everything, then wait for the parent to assign a rank.

Started by the parent with ``ACCELPACT_SPARE`` and ``ACCELPACT_SPARE_KEY`` (harness.parent.replacements).
It imports torch, the harness's training code and transformers (a model on the meta device), then waits
on the control store as any ``accelpact.run`` hot spare does (accelpact.run.spare.wait_for_rank). When a
rank dies the parent writes the spare's key with that rank's environment (RANK, HARNESS_REPLACEMENT, its
launch time) and log; the spare takes both and trains as a replacement of that rank, which heals in
memory without paying for a process start.
"""

from __future__ import annotations

import os

from accelpact.run import spare as spare_protocol
from harness.contract import RankEnv
from harness.schema import RunConfig


def become_rank(cfg: RunConfig, env: RankEnv) -> RankEnv:
    """Block until the parent assigns this spare a rank; returns the environment of that rank."""
    import accelpact.snapshot  # noqa: F401 - everything a replacement imports, now rather than after a death
    import harness.rank.train  # noqa: F401
    from harness.models import meta_model  # lazy: torch

    meta_model(cfg.model)
    index = int(os.environ[spare_protocol.SPARE_ENV]) - 1
    spare_protocol.wait_for_rank()  # the rank's environment, in place; output to the rank's log from now on
    got = RankEnv.from_environ()
    print(f"spare {index}: taking rank {got.rank} (replacement {got.replacement})", flush=True)
    return got
