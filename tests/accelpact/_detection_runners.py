"""Scenario runners for the detection tests: a rank that dies for real, a slow step; survivors time it.

Named as ``tests.accelpact._detection_runners:<function>`` in a session launched by
accelpact.testing.session.run_session (a plain launch: no parent writes death notices, so a dead
rank is found by the survivors' own heartbeat rule).
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

from accelpact.errors import RankLostError
from accelpact.guard import attach
from accelpact.testing.rank import RankContext
from experiments._fsdp_models import batch_for, build, model_config, step_fn_for


def die(sc: dict, ctx: RankContext) -> dict:
    """Rank ``sc["victim"]`` SIGKILLs itself inside step_fn of step ``sc["at_step"]`` (after writing the
    wall time to ``died.json``); the survivors record when and how they learnt of it."""
    m = model_config(None)
    model, optimizer, _root, _middle = build("fsdp2", m)
    guard = attach(model, optimizer, ctx.control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
                   heartbeat_interval_s=sc.get("heartbeat_interval_s", 0.5))
    inner = step_fn_for(model)
    victim, at_step = sc["victim"], sc["at_step"]

    def step_fn(batch):
        if ctx.rank == victim and guard.next_step == at_step:
            (ctx.out_dir / "died.json").write_text(json.dumps({"t": time.time(), "pid": os.getpid()}))
            os.kill(os.getpid(), signal.SIGKILL)
        return inner(batch)

    ctx.barrier(f"built/{sc['name']}")
    try:
        for step in range(sc["steps"]):
            guard.step(step_fn, batch_for(step, ctx.rank, m))
    except RankLostError as exc:
        return {"t_raised": time.time(), "ranks": list(exc.ranks), "detected_by": exc.detected_by,
                "generation": exc.generation, "last_committed_step": exc.last_committed_step,
                "message": str(exc)[:1000], "error": None}
    finally:
        guard.close()
    return {"t_raised": None, "error": None}
