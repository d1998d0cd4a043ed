"""A torchft rank's life (``StrategySpec.rank_entry`` of strategy=torchft): its replica group's store and
process group, the model sharded over the group, torchft's Manager, the harness's loop, and the identity in
the reference's layout.

Named only by the spec's ``rank_entry`` string, so the spec (harness.strategies.torchft_hsdp, the common
layer) never imports the rank side.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

from harness import identity
from harness.events import EventLog
from harness.rank.mesh import mesh_layout
from harness.rank.strategies.torchft_hsdp import TorchftHsdp
from harness.rank.strategies.torchft_identity import replica_identity
from harness.strategies.torchft_config import torchft_config
from harness.strategies.torchft_layout import GroupLayout, gen_key, group_store_key

__all__ = ["train_replica"]


def train_replica(cfg: Any, env: Any, run_dir: str) -> Any:
    """One rank's life under torchft (``StrategySpec.rank_entry``): its group's store and process group,
    the model sharded over the group, the Manager, the loop, identity in the reference's layout."""
    import torch.distributed as dist  # lazy: torch

    from harness.rank.train import (  # lazy: torch
        TrainResult,
        build_context,
        connect_control_store,
        exit_without_static_destructors,
        run_loop,
    )

    st = torchft_config(cfg.strategy)
    layout = GroupLayout(env.rank, env.world_size, st.group_size)
    pg_timeout = timedelta(seconds=cfg.cluster.pg_timeout_s)
    with EventLog(run_dir, env.rank) as events:
        control = connect_control_store(env, cfg.cluster.pg_timeout_s)
        gen = int(control.get(gen_key(env.token, layout.group)).decode()) if env.replacement else 0
        store, store_addr = _group_store(
            control, env.token, layout, gen, group_store_host(env.control_host), cfg.cluster.pg_timeout_s
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("harness/torchft/dp", store),
            rank=layout.local,
            world_size=layout.size,
            timeout=pg_timeout,
        )
        try:
            # FSDP over the group's own ranks: the replicate dimension is torchft's, across groups.
            ctx = build_context(
                cfg,
                dataclasses.replace(env, world_size=layout.size),
                run_dir,
                events,
                control,
                layout=mesh_layout(layout.size),
            )
            ctx.world_size = env.world_size
            strategy = TorchftHsdp(ctx, layout, control, store_addr, gen, env.token, env.t_launch)
            if not env.replacement:
                # Start the groups together (every Manager up and heartbeating before any quorum): with
                # min_replicas=1 the first group would otherwise form a quorum alone and run ahead.
                control.add(f"{env.token}/torchft/started", 1)
                deadline = time.monotonic() + cfg.cluster.pg_timeout_s
                while int(control.add(f"{env.token}/torchft/started", 0)) < env.world_size:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the torchft replica groups did not all start; see the other ranks' logs")
                    time.sleep(0.01)
            events.emit(
                "restart",
                t_launch=env.t_launch,
                t_ready=time.time(),
                incarnation=env.incarnation,
                replacement=env.replacement,
                torchft_group=layout.group,
                torchft_generation=gen,
            )
            try:
                if env.replacement and strategy.job_finished():
                    committed = strategy.heal_to_end()
                else:
                    committed = run_loop(ctx, strategy)
                record = replica_identity(
                    ctx.model, ctx.optimizer, committed, env.rank, mesh_layout(env.world_size, cfg.cluster.replicate)
                )
                identity.write_identity(run_dir, record)
                strategy.wait_for_every_rank(committed)
            finally:
                strategy.close()
            exit_without_static_destructors()
            return TrainResult(steps_committed=committed, identity=record)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def group_store_host(control_host: str) -> str:
    """The address local rank 0 hosts its group's TCPStore (and its Manager's server) on: this host's
    address on the control network, the one it reaches the control store from.

    Every rank of every group dials it: the group's own ranks for their store and Manager, and every other
    group's ranks too, since torchft hands the quorum's primary group store to all of them to configure the
    cross-group process group (``Manager._async_quorum``: ``quorum.store_address``). With the ranks in network
    namespaces ``cluster.master_addr`` (127.0.0.1) is each rank's own loopback, and the data address is what
    data-plane faults cut and ``tcp_reset`` resets; the control link (``ACCELPACT_REPLICA_ADDR`` there) is
    neither. On one host (``cluster=local_cpu``) this is the route to the control store: 127.0.0.1."""
    from accelpact.snapshot import control_bind_address  # lazy: torch

    return control_bind_address(control_host)


def _group_store(control: Any, token: str, layout: GroupLayout, gen: int, host: str, timeout_s: float) -> Any:
    """This generation's replica-group TCPStore (hosted by local rank 0 on ``host``, as torchrun's agent
    hosts it), published on the control store for the group's other ranks."""
    import torch.distributed as dist  # lazy: torch

    key = group_store_key(token, layout.group, gen)
    if layout.local == 0:
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
        control.set(key, f"{host}:{store.port}".encode())
        return store, (host, int(store.port))
    h, p = control.get(key).decode().rsplit(":", 1)
    store = dist.TCPStore(h, int(p), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    return store, (h, int(p))
