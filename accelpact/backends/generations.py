"""Data-plane generations: build process-group generation n+1 under the OLD names, retire generation n.

A process group never works again after an error (gloo; NCCL once aborted), so recovery builds a new
one. Each generation is built on a never-used prefix of the long-lived control store (one rendezvous
costs a few ms; a fresh TCPStore costs 0.4-0.7 s). The new group is registered in c10d under the old
group's name, because DeviceMesh and torch.compile'd graphs resolve groups by name and a graph bakes
the name in: a stable name means no recompile and no stale lookup. The old group is retired by dropping every
reference, so its C++ destructor (about 20 ms) joins its threads and closes its sockets.

Backend-neutral: what differs per backend (how to abort a generation's transport, which device a
group is bound to, ...) lives in :mod:`accelpact.backends`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Collection
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from accelpact.common.group_spec import GroupSpec
from accelpact.errors import CollectiveAbandoned, GenerationSuperseded

__all__ = ["GroupSpec", "group_spec", "rebuild_group", "retire_group", "store_ports", "first_collective", "describe"]


def group_spec(pg: dist.ProcessGroup, timeout: datetime.timedelta | None = None) -> GroupSpec:
    """Read a live group's identity from c10d's registries (call before the group is retired)."""
    world = c10d._world
    if pg not in world.pg_map:
        raise ValueError(
            "process group is not registered in c10d (was it destroyed?); attach accelpact after "
            "init_process_group and fully_shard, before any recovery"
        )
    backend = world.pg_map[pg][0]
    group_ranks = world.pg_group_ranks[pg]
    ranks = tuple(sorted(group_ranks, key=lambda g: group_ranks[g]))
    tag = world.pg_to_tag.get(pg)
    if tag is not None and tag.startswith("user:"):
        tag = tag[len("user:") :]
    else:
        tag = None  # the default "ptd:<name>" tag is recreated by c10d itself
    return GroupSpec(
        name=world.pg_names[pg],
        backend=str(backend),
        ranks=ranks,
        is_default=pg is world.default_pg,
        tag=tag,
        desc=pg.group_desc,
        timeout=timeout,
        device_id=getattr(pg, "bound_device_id", None),
    )


def _forget(pg: dist.ProcessGroup) -> None:
    """Drop c10d's references to ``pg`` and free its name (idempotent)."""
    c10d._cleanup_process_group_global_state(pg)
    # c10d's cleanup removes the group from its own tag's list only; a group created with
    # add_to_default_tag=True also sits in the "" list and would stay alive there forever.
    for tag, groups in list(c10d._world.tags_to_pg.items()):
        if any(g is pg for g in groups):
            c10d._world.tags_to_pg[tag] = [g for g in groups if g is not pg]
    if c10d._world.default_pg is pg:
        c10d._update_default_pg(None)


def rebuild_group(
    old: dist.ProcessGroup | None,
    spec: GroupSpec,
    store: dist.Store,
    rank: int,
    device_id: torch.device | None = None,
) -> dist.ProcessGroup:
    """Build the next generation of ``spec`` on ``store`` (a never-used prefix) under the same name.

    ``old``'s registrations are removed first (its name must be free to be reused); ``old`` may be
    None when a previous round already removed them. ``device_id`` binds the new group to an
    accelerator (NCCL; None for gloo). Must be called by every member of the group.
    """
    if old is not None:
        _forget(old)
    else:
        # A previous round may have registered a half-built group under this name; free it.
        for pg, name in list(c10d._world.pg_names.items()):
            if name == spec.name:
                _forget(pg)
    group_rank = spec.ranks.index(rank)
    store = dist.PrefixStore(f"pg{spec.name}/", store)
    timeout = spec.timeout or datetime.timedelta(minutes=30)
    new, _ = c10d._new_process_group_helper(
        len(spec.ranks),
        group_rank,
        [] if spec.is_default else list(spec.ranks),
        spec.backend,
        store,
        spec.name,  # type: ignore[arg-type]  # torch types it GroupName, a NewType of str
        timeout=timeout,
        pg_tag=spec.tag,
        group_desc=spec.desc,
        device_id=device_id,
    )
    if spec.is_default:
        c10d._update_default_pg(new)
        c10d._world.pg_group_ranks[new] = {r: i for i, r in enumerate(spec.ranks)}
    else:
        c10d._world.pg_group_ranks[new] = {r: i for i, r in enumerate(spec.ranks)}
    return cast("dist.ProcessGroup", new)


def retire_group(pg: dist.ProcessGroup) -> None:
    """Remove ``pg`` from c10d. Its destructor runs when the caller drops the last reference."""
    _forget(pg)


def store_ports(extra: Collection[int] = ()) -> set[int]:
    """Ports of every TCPStore the process groups were built on, plus ``extra``: never reset these."""
    ports = set(extra)
    store: Any
    for _backend, store in list(c10d._world.pg_map.values()):
        while store is not None:
            port = getattr(store, "port", None)
            if isinstance(port, int):
                ports.add(port)
            store = getattr(store, "underlying_store", None)
    return ports


def first_collective(
    pg: dist.ProcessGroup,
    device: torch.device | str = "cpu",
    superseded: Callable[[], bool] | None = None,
    poll_s: float = 0.02,
) -> None:
    """One tiny all-reduce proving the new generation works before anything else uses it.

    With ``superseded`` (the control channel's ``generation_superseded``), the wait is polled: if a
    peer has already started another round, raise :class:`GenerationSuperseded` instead of waiting
    for a collective its peers have abandoned (gloo may otherwise sit out the whole PG timeout).
    """
    from accelpact.backends.interruptible import wait_interruptibly

    t = torch.ones(1, device=device)
    if superseded is None:
        dist.all_reduce(t, group=pg)
    else:
        work = dist.all_reduce(t, group=pg, async_op=True)
        try:
            wait_interruptibly(
                work,
                lambda: "superseded" if superseded() else None,
                what=f"the first collective of {describe(pg)}",
                phase="recovery",
                poll_s=poll_s,
            )
        except CollectiveAbandoned:
            raise GenerationSuperseded(
                f"a peer started a newer recovery round while this rank waited on the first collective "
                f"of {describe(pg)}",
                work=work,
            ) from None
    if int(t.item()) != pg.size():
        raise RuntimeError(f"first collective on the new generation returned {t.item()}, expected {pg.size()}")


def describe(pg: dist.ProcessGroup) -> str:
    """A short description of a process group for error messages (never raises)."""
    try:
        return f"ProcessGroup(name={pg.group_name!r}, size={pg.size()})"
    except Exception:
        return repr(pg)
