"""The scenario runner of test_first_collective: rank 1 joins the group but never enters the collective.

Named as ``tests.accelpact._first_collective_rank:run`` for a 2-rank session whose process groups
time out after 6 s. Rank 0 calls ``first_collective`` with a ``superseded`` poll that answers
``sc["superseded"]`` and returns what happened; rank 1 stays alive and connected, waiting on the
control store until rank 0 is done, and never enters the collective.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from accelpact.backends import generations as comm
from accelpact.errors import GenerationSuperseded
from accelpact.testing.rank import RankContext


def run(sc: dict, ctx: RankContext) -> dict:
    done = ctx.control.key("done", sc["name"])
    if ctx.rank == 1:
        ctx.control.get(done, deadline_s=60.0)  # alive, connected, and never in the collective
        return {}
    flag = bool(sc["superseded"])
    t0 = time.monotonic()
    try:
        comm.first_collective(dist.group.WORLD, superseded=lambda: flag, poll_s=0.05)
        out = {"result": "completed"}
    except GenerationSuperseded as exc:
        out = {"result": "superseded", "work_kept": exc.work is not None}
    except Exception as exc:  # noqa: BLE001 - the test looks at which error it was
        out = {"result": type(exc).__name__}
    out["seconds"] = time.monotonic() - t0
    ctx.control.set(done, b"1")
    return out  # the rank then exits without teardown: the abandoned collective still runs in gloo
