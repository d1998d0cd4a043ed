"""The scenario runner of test_vote_race: a rank breaks its own connections and at once posts a tiny all-reduce.

Named as ``tests.accelpact._vote_race_rank:run`` for a 2-rank session. For each of ``sc["rounds"]``
fresh gloo groups (timeout ``sc["pg_timeout_s"]``): one healthy all-reduce, then rank 1 shuts down
its own gloo sockets and immediately posts a one-element all-reduce (what the guard's vote does
after a reset injected at the vote). Rank 0's all-reduce fails within milliseconds; it then marks
"moved on" on the control store, as a peer entering the next recovery generation does. Rank 1
waits either with ``work.wait()`` (``sc["wait"] == "plain"``) or through the guard's
:class:`accelpact.backends.interruptible.CollectiveWaiter`, and reports how long each wait took.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from accelpact.backends.interruptible import CollectiveWaiter
from accelpact.errors import CollectiveAbandoned
from accelpact.inject import reset_own_gloo_sockets
from accelpact.testing.rank import RankContext


def run(sc: dict, ctx: RankContext) -> dict:
    control, name = ctx.control, sc["name"]
    timeout = datetime.timedelta(seconds=sc["pg_timeout_s"])
    kept: list = []  # abandoned collectives stay alive until the rank exits (it skips teardown)
    waits, outcomes = [], []
    for i in range(sc["rounds"]):
        pg = dist.ProcessGroupGloo(
            dist.PrefixStore(control.key(name, str(i), "pg") + "/", ctx.store), ctx.rank, ctx.world_size, timeout
        )
        t = torch.ones(1)
        pg.allreduce([t]).wait()  # the pair is connected and healthy
        control.barrier(f"{name}/{i}/ready", control.generation)
        moved = control.key(name, str(i), "moved")
        if ctx.rank == 0:
            try:
                pg.allreduce([torch.ones(1)]).wait()
                outcomes.append("completed")
            except Exception as exc:  # noqa: BLE001 - the peer broke the link: expected
                outcomes.append(type(exc).__name__)
            control.set(moved, b"1")  # as a peer posting at the next recovery generation
        else:
            reset_own_gloo_sockets(ctx.exclude_ports)
            work = pg.allreduce([torch.ones(1)])
            t0 = time.monotonic()
            try:
                if sc["wait"] == "plain":
                    work.wait()
                else:
                    waiter = CollectiveWaiter(
                        fired=None,
                        superseded=lambda: ctx.store.check([moved]),  # noqa: B023 - awaited here
                        abandon=kept.append,
                    )
                    waiter(work, "the vote", "vote")
                outcomes.append("completed")
            except CollectiveAbandoned:
                outcomes.append("abandoned")
            except Exception as exc:  # noqa: BLE001 - the backend's own error: the usual case
                outcomes.append(type(exc).__name__)
            waits.append(time.monotonic() - t0)
        control.barrier(f"{name}/{i}/done", control.generation)
        kept.append(pg)
    return {"waits": waits, "outcomes": outcomes}
