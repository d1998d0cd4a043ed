"""A rank's life under NVRx in-process restart (``StrategySpec.rank_entry`` of strategy=checkpoint_restore).

Its own module, named only by the spec's ``rank_entry`` string: it runs the harness's rank loop
(harness.rank.train), which imports the strategy registry, which imports this strategy's package; kept
apart, no import cycle closes.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import identity
from harness.events import EventLog, Restart
from harness.rank.strategies.checkpoint_restore import CheckpointRestore
from harness.rank.train import TrainResult, build_context, exit_without_static_destructors, run_loop

__all__ = ["train_in_process"]


def train_in_process(cfg: Any, env: Any, run_dir: str) -> Any:
    """One rank's life under NVRx in-process restart; returns ``harness.rank.train.TrainResult``."""
    from harness.rank.strategies.nvrx_restart import (
        NvrxSettings,
        import_inprocess,
        run_with_inprocess_restart,
    )

    import_inprocess()  # fail first, with the fix named, if NVRx is missing
    logs = Path(run_dir) / "logs"
    settings = NvrxSettings(
        max_restarts=cfg.strategy.max_restarts,
        progress_timeout_s=max(600.0, 3 * cfg.cluster.pg_timeout_s),
        monitor_log_file=str(logs.resolve() / f"nvrx_monitor_rank{env.rank}.log"),
    )
    pg_timeout = timedelta(seconds=cfg.cluster.pg_timeout_s)
    with EventLog(run_dir, env.rank) as events:

        def train_fn(nctx: Any) -> TrainResult:
            import torch.distributed as dist

            nctx.init_process_group(timeout=pg_timeout)
            ctx = build_context(cfg, env, run_dir, events, control_store=None)
            ctx.incarnation = env.incarnation + nctx.incarnation
            strategy = CheckpointRestore(ctx, exclude_ports=nctx.exclude_ports)
            nctx.add_finalizer(strategy.abandon)
            fields = nctx.restart_event_fields(t_ready=time.time())
            fields["incarnation"] = ctx.incarnation
            if nctx.incarnation == 0:
                fields["t_launch"] = env.t_launch  # the parent's launch, as for every other strategy
            events.emit(Restart, **fields)
            committed = run_loop(ctx, strategy)
            strategy.close()
            record = identity.compute_identity(ctx.model, ctx.optimizer, committed)
            identity.write_identity(run_dir, record)
            dist.barrier()
            return TrainResult(steps_committed=committed, identity=record)

        run = run_with_inprocess_restart(
            train_fn,
            settings,
            token=f"{env.token}-nvrx",
            exclude_ports=[env.control_port],
            rank=env.rank,
            world_size=env.world_size,
        )
    if run.value is None:
        raise RuntimeError("NVRx kept this rank inactive; the harness needs every rank to train")
    exit_without_static_destructors()
    return run.value
