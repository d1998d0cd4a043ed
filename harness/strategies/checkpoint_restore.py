"""Strategy ``checkpoint_restore``: NVIDIA Resiliency Extension in-process restart (the NVRx baseline).

The rank's whole training function runs under ``harness.strategies.nvrx_restart.run_with_inprocess_restart``:
the process stays alive; when a collective fails on any rank, NVRx interrupts every rank, the adapter
tears the process groups down, and the training function runs again (incarnation + 1). Each
incarnation builds its process group on a never-used store prefix, rebuilds model and optimizer,
restores the newest DCP checkpoint (``restore`` event) and replays the steps lost since it
(``replay=True``). Its ``restart`` event carries NVRx's own timestamps.

NVRx must be importable: without it this strategy fails with ``NvrxUnavailable`` naming the fix;
there is no silent substitute. The spec's ``rank_entry`` makes ``harness.rank.train.train`` hand the
rank's whole life to ``train_in_process``, because NVRx must own the process groups from the start.
NVRx's own TCPStore is hosted by the parent (``host_nvrx_store``) so that a rank's death does not
take it down.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.strategies.base import Strategy
from harness.strategies.spec import StrategySpec

if TYPE_CHECKING:
    import torch


class CheckpointRestore(Strategy):
    def run_step(self, step: int, tokens: "torch.Tensor") -> float:
        return self.plain_step(step, tokens)

    def abandon(self) -> None:
        """Finalizer of a torn-down incarnation: drop hooks and the checkpointer without raising."""
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the incarnation is gone; its save error is moot
            print(f"checkpoint_restore: closing the torn-down incarnation's checkpointer: {exc}", flush=True)


def train_in_process(cfg: Any, env: Any, run_dir: str) -> Any:
    """One rank's life under NVRx in-process restart; returns ``harness.rank.train.TrainResult``."""
    from harness.rank import identity
    from harness.events import EventLog
    from harness.strategies.nvrx_restart import NvrxSettings, import_inprocess, run_with_inprocess_restart
    from harness.rank.train import TrainResult, build_context, run_loop

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
            events.emit("restart", **fields)
            committed = run_loop(ctx, strategy)
            strategy.close()
            record = identity.compute_identity(ctx.model, ctx.optimizer, committed)
            identity.write_identity(run_dir, record)
            dist.barrier()
            return TrainResult(steps_committed=committed, identity=record)

        run = run_with_inprocess_restart(
            train_fn, settings, token=f"{env.token}-nvrx", exclude_ports=[env.control_port],
            rank=env.rank, world_size=env.world_size,
        )
    if run.value is None:
        raise RuntimeError("NVRx kept this rank inactive; the harness needs every rank to train")
    from harness.rank.train import exit_without_static_destructors

    exit_without_static_destructors()
    return run.value


class _NvrxStore:
    """NVRx's TCPStore, hosted in the parent for the whole run; its port goes to every rank."""

    def __init__(self, run: Any, launcher: Any) -> None:
        from harness.strategies.nvrx_restart import STORE_PORT_ENV, host_store

        self.store = host_store(host=run.cluster.master_addr)
        launcher.extra_env.update({STORE_PORT_ENV: str(self.store.port), "MASTER_ADDR": run.cluster.master_addr,
                                   "TORCH_CPP_LOG_LEVEL": "ERROR"})

    def close(self) -> None:
        self.store = None  # the server thread stops with its last reference


def check_runnable(run: Any) -> None:
    """NVRx must be importable, and its parent-hosted store cannot reach ranks in network namespaces."""
    from harness.app.validate import ConfigError
    from harness.faults import registry as faults
    from harness.strategies.nvrx_restart import NvrxUnavailable, import_inprocess

    if faults.get(run.fault.kind).needs_netns:
        raise ConfigError(
            f"fault={run.fault.kind} with strategy=checkpoint_restore is not supported: NVRx's store is hosted "
            "outside the ranks' namespaces; use a fault that needs no namespaces (socket_reset, hang, kill)")
    try:
        import_inprocess()
    except NvrxUnavailable as exc:
        raise ConfigError(str(exc)) from exc


SPEC = StrategySpec(
    name="checkpoint_restore",
    rank_class="harness.strategies.checkpoint_restore:CheckpointRestore",
    description="NVRx in-process restart: keep processes, rebuild groups, restore the newest checkpoint, replay",
    label="NVRx checkpoint restore",
    color="tab:orange",
    order=3,
    parent_setup=_NvrxStore,
    rank_entry="harness.strategies.checkpoint_restore:train_in_process",
    check=check_runnable,
)
