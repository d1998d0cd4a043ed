"""One rank's training: data-plane process group, FSDP2 model, AdamW, the loop, events, identity.

``train(cfg, env, run_dir)`` is a plain function (NVRx's in-process restart wraps a function). The
per-step work belongs to a ``Strategy``; this loop is the same for all of them. No Hydra here.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness import identity, strategies
from harness.contract import RankEnv
from harness.events import EventLog, Restart, Step
from harness.models import build_model
from harness.rank.data import make_batch
from harness.rank.mesh import MeshLayout, build_mesh, mesh_layout
from harness.rank.strategies.base import Rewind, Strategy, TrainContext
from harness.schema import Device, Precision, RunConfig
from harness.strategies.spec import resolve


@dataclass
class TrainResult:
    steps_committed: int
    identity: dict[str, Any]


def connect_control_store(env: RankEnv, timeout_s: float) -> Any:
    """A client of the parent's long-lived TCPStore (the out-of-band channel)."""
    return dist.TCPStore(
        env.control_host,
        env.control_port,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def init_data_plane(cfg: RunConfig, env: RankEnv, control_store: Any, generation: int = 0) -> None:
    """The default process group, built on the token/generation prefix of the control store."""
    store = dist.PrefixStore(env.data_plane_prefix(generation), control_store)
    kwargs: dict[str, Any] = {}
    if cfg.cluster.device == Device.cuda:
        kwargs["device_id"] = torch.device("cuda", env.local_rank)
    dist.init_process_group(
        backend=cfg.cluster.backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=cfg.cluster.pg_timeout_s),
        **kwargs,
    )


def rank_device(cfg: RunConfig, env: RankEnv) -> torch.device:
    if cfg.cluster.device == Device.cuda:
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def mixed_precision_policy(cfg: RunConfig) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.train.mixed_precision == Precision.bf16:
        # bf16 compute and all-gathers, fp32 gradient reduction and fp32 sharded master weights.
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def set_cpu_threads(world_size_on_host: int) -> None:
    """Split the cores between the ranks of this host: oversubscribed intra-op threads thrash."""
    from harness.machine import usable_cores  # lazy: psutil

    cores = usable_cores()
    torch.set_num_threads(max(1, cores // max(1, world_size_on_host)))


def build_context(
    cfg: RunConfig,
    env: RankEnv,
    run_dir: str,
    events: EventLog,
    control_store: Any,
    rejoin: Any = None,
    layout: MeshLayout | None = None,
) -> TrainContext:
    """Model, optimizer and scheduler of this rank, sharded over ``layout`` (default: the run's mesh over
    the default process group, ``cluster.replicate`` replicas of it; harness.rank.mesh)."""
    device = rank_device(cfg, env)
    layout = layout or mesh_layout(env.world_size, cfg.cluster.replicate)
    mesh = build_mesh(device.type, layout, rejoin)
    model = build_model(cfg.model, cfg.train.seed, mesh, device, mixed_precision_policy(cfg))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    scheduler = None
    if cfg.train.warmup_steps > 0:
        warmup = cfg.train.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return TrainContext(
        cfg=cfg,
        rank=env.rank,
        world_size=env.world_size,
        device=device,
        model=model,
        optimizer=optimizer,
        events=events,
        run_dir=run_dir,
        incarnation=env.incarnation,
        control_store=control_store,
        replacement=env.replacement,
        rejoin=rejoin,
        scheduler=scheduler,
    )


def run_loop(ctx: TrainContext, strategy: Strategy, steps: int | None = None, start: int | None = None) -> int:
    """Steps ``start`` (default ``strategy.first_step()``) .. ``steps``-1, one ``step`` event each.

    Returns the index after the last committed step."""
    cfg, m = ctx.cfg, ctx.cfg.model
    last = cfg.train.steps if steps is None else steps
    tokens_per_step = m.batch_size * m.seq_len
    step = strategy.first_step() if start is None else start
    while True:
        if step >= last:
            try:
                strategy.finish()  # every rank agrees the run ended (a rank lost after the last vote heals here)
                return step
            except Rewind as back:
                step = back.step
                continue
        t_start = time.time()
        batch = make_batch(cfg.train.seed, step, ctx.rank, m.batch_size, m.seq_len, m.vocab_size)
        try:
            loss = strategy.step(step, batch.to(ctx.device, non_blocking=True))
        except Rewind as back:  # a heal rolled this rank back in memory: run from there again
            step = back.step
            continue
        t_end = time.time()
        ctx.events.emit(
            Step,
            step=step,
            t_start=t_start,
            t_end=t_end,
            loss=loss,
            tokens=tokens_per_step,
            incarnation=ctx.incarnation,
            replay=strategy.is_replay(step),
            **strategy.step_fields(),
        )
        try:
            strategy.after_step(step)  # the LR schedule, a checkpoint save, an evaluation
        except Rewind as back:
            step = back.step
            continue
        step += 1


def exit_without_static_destructors() -> None:
    """Once this rank's work is done and written, let the process end with os._exit(0) at exit.

    Seen here: a rank that finished cleanly (identity written, "done" printed) was sometimes killed by
    "terminate called without an active exception" (SIGABRT) from a C++ destructor (gloo / store threads)
    during interpreter shutdown, which turned a good run into a failed one. Only registered after
    success, so a failing rank still exits with its own status."""

    def _exit() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    atexit.register(_exit)


def train(cfg: RunConfig, env: RankEnv, run_dir: str) -> TrainResult:
    """One rank's whole life after start-up. Collective: every rank of the job must call it."""
    if cfg.cluster.device == Device.cpu:
        set_cpu_threads(env.world_size)
    spec = strategies.get(cfg.strategy.name)
    if spec.rank_entry is not None:
        # The strategy owns the process groups from the start (NVRx in-process restart): its own life.
        return resolve(spec.rank_entry)(cfg, env, run_dir)
    with EventLog(run_dir, env.rank) as events:
        control_store = connect_control_store(env, cfg.cluster.pg_timeout_s)
        rejoin = None
        if env.replacement and spec.rejoin is not None:
            # A replacement joins the running job's next generation instead of a fresh rendezvous.
            rejoin = resolve(spec.rejoin)(cfg, env)
        else:
            init_data_plane(cfg, env, control_store)
        try:
            ctx = build_context(cfg, env, run_dir, events, control_store, rejoin)
            strategy_class: type[Strategy] = resolve(spec.rank_class)
            strategy = strategy_class(ctx)
            events.emit(
                Restart,
                t_launch=env.t_launch,
                t_ready=time.time(),
                incarnation=env.incarnation,
                replacement=env.replacement,
                pid=os.getpid(),
            )
            try:
                committed = run_loop(ctx, strategy)
            finally:
                strategy.close()
            record = identity.compute_identity(ctx.model, ctx.optimizer, committed)
            identity.write_identity(run_dir, record)
            exit_without_static_destructors()
            return TrainResult(steps_committed=committed, identity=record)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
