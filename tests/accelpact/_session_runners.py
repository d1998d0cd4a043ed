"""Scenario runners that misbehave on purpose, for test_session: no model, only the rank side.

Named as ``tests.accelpact._session_runners:<function>`` in a session launched by
accelpact.testing.session.run_session.
"""

from __future__ import annotations

import os
import sys
import time

from accelpact.testing.rank import RankContext


def echo(sc: dict, ctx: RankContext) -> dict:
    """Report who ran it and with which settings (the plumbing itself)."""
    ctx.barrier(sc["name"])
    return {"rank": ctx.rank, "world_size": ctx.world_size, "settings": ctx.settings, "value": sc["value"]}


def parent(sc: dict, ctx: RankContext) -> dict:
    """This rank's process and its parent's (the session's process, or the template it was forked from)."""
    return {"pid": os.getpid(), "ppid": os.getppid()}


def die_on_rank_1(sc: dict, ctx: RankContext) -> dict:
    """Rank 1 prints a marker and exits with code 3, without writing a result."""
    if ctx.rank == 1:
        print(f"marker-{sc['name']}-rank1-dies", flush=True)
        os._exit(3)
    return {"rank": ctx.rank}


def raise_on_rank_0(sc: dict, ctx: RankContext) -> dict:
    """Rank 0's scenario raises; the rank reports it as the scenario's error and skips the rest."""
    if ctx.rank == 0:
        raise ValueError(f"scenario {sc['name']} failed on purpose")
    return {"rank": ctx.rank}


def hang(sc: dict, ctx: RankContext) -> dict:
    """Never returns in time: the session's timeout must kill it."""
    print("hanging", flush=True)
    sys.stdout.flush()
    time.sleep(600)
    return {}
