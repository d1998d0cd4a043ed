"""The data-plane seam: what recovery and the heal may do to the guard's process groups, and nothing more.

The guard owns one :class:`DataPlane`. It holds the backend, the binding table of every cached group
reference, each group's spec, which group carries the vote, the PG timeout and the data-plane peers'
addresses. Recovery rounds (accelpact.recovery) and the heal receive it instead of the guard, and only:

- ``abort()`` the live generation (peers blocked on this rank fail in milliseconds);
- ``rebuild(generation)``: make ``generation`` of every group live, returning (old groups, new groups);
- ``prove(new_groups)``: the first collective on the new vote group;
- ``prepare_next_generation()``, ``rescan()`` (FSDP's lazily created holders), ``is_comm_fault``.

Two ways to get a working generation after a fault differ only in ``rebuild``:

- :class:`accelpact.dataplane.rebind.RebindPlane` (today's, every torch release): build NEW group
  objects on a never-used store prefix under the old names, then rebind every cached reference
  (accelpact.dataplane.bindings). ``rebuild`` returns different old and new objects; the caller drops
  the old ones once the new ones work.
- :class:`accelpact.dataplane.reconfigure.ReconfigurePlane` (torch >= 2.15: ``_reconfigure`` of a live
  group) keeps the SAME group objects: ``rebuild`` returns the same list twice, and there is nothing to
  rebind. Where torch or a group cannot, or a round's reconfigure fails, it rebinds instead.

:data:`DATA_PLANES` names the implementations; ``GuardConfig.data_plane`` picks one.
"""

from __future__ import annotations

import abc
import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch.distributed as dist

from accelpact.backends import backend_for, generations
from accelpact.detection.linkprobe import peer_addresses
from accelpact.errors import GenerationSuperseded

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from accelpact.backends import Backend
    from accelpact.backends.generations import GroupSpec
    from accelpact.common.control_client import ControlClient
    from accelpact.dataplane.bindings import BindingTable
    from accelpact.events import RoundClock

__all__ = ["DataPlane"]

# Builds the binding table of the model and optimizer, given the vote group (BindingTable.build).
Scan = Callable[[Any], "BindingTable"]


class DataPlane(abc.ABC):
    """The guard's data-plane groups, their live generation and how to get the next one.

    Build with :meth:`attach`. ``groups``: the live generation, vote group included; ``specs[i]``
    rebuilds ``groups[i]`` under its identity.
    """

    #: the name under which accelpact.dataplane.DATA_PLANES lists this implementation
    name: str = ""

    def __init__(
        self,
        *,
        backend: Backend,
        table: BindingTable,
        specs: list[GroupSpec],
        vote_index: int,
        control: ControlClient,
        rank: int,
        group_timeout: datetime.timedelta | None,
        verify_rebind: bool,
        scan: Scan,
        peers: set[str],
    ) -> None:
        self.backend = backend
        self.table = table
        self.specs = specs
        self.vote_index = vote_index
        self.control = control
        self.rank = rank
        self.group_timeout = group_timeout  # the rebuilt groups' timeout (None: c10d's default)
        self.pg_timeout: datetime.timedelta = group_timeout or dist.default_pg_timeout
        self.verify_rebind = verify_rebind
        self.peers = peers  # the data-plane peers' addresses, probed before a rebuild (detection.linkprobe)
        self._scan = scan
        # FSDP creates part of its state lazily, on the first forward (FSDP1's _ExecOrderData holds
        # the group; so may FSDP2's comm state): the table built at attach can miss those holders, which
        # then keep every old generation alive. Scanned again once the first step ran (:meth:`rescan`).
        self.rescanned = False
        # Which way the live generation was made and why ({"path": ..., "why": ...}): every recovery and
        # heal event copies it, so a run says which path ran (an implementation that can degrade updates it).
        self.last_path: dict[str, str] = {"path": self.name, "why": f"data_plane={self.name!r}"}

    @classmethod
    def attach(
        cls,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        control: ControlClient,
        *,
        process_group: dist.ProcessGroup | None = None,
        group_timeout: datetime.timedelta | None = None,
        verify_rebind: bool = False,
    ) -> DataPlane:
        """The data plane of an FSDP model and optimizer whose groups exist (after init_process_group)."""
        from accelpact.dataplane.bindings import BindingTable

        vote_pg = process_group if process_group is not None else dist.group.WORLD
        backend = backend_for(cast("dist.ProcessGroup", vote_pg))  # WORLD exists: the groups were built
        table = BindingTable.build(model, optimizer, process_group)
        # Check first: the user's groups were built with the environment as it is now (configuring
        # first would hide, e.g., NCCL error handling that kills the process on their groups).
        for g in table.groups:
            backend.check(g)
        backend.configure()  # for the groups the guard rebuilds
        vote_index = next(i for i, g in enumerate(table.groups) if g is vote_pg)
        specs = [generations.group_spec(g, group_timeout) for g in table.groups]
        control_port = getattr(getattr(control, "config", None), "port", None) or getattr(control, "port", None)
        backend.track(table.groups, generations.store_ports([control_port] if isinstance(control_port, int) else []))
        sockets = getattr(backend, "sockets", None)
        peers = peer_addresses(sockets.inodes) if sockets is not None else set()
        return cls(
            backend=backend,
            table=table,
            specs=specs,
            vote_index=vote_index,
            control=control,
            rank=dist.get_rank(),
            group_timeout=group_timeout,
            verify_rebind=verify_rebind,
            scan=lambda vote: BindingTable.build(model, optimizer, vote),
            peers=peers,
        )

    def join_mode(self) -> str:
        """What a heal's replacement must run with the survivors to join their next generation (the
        plan carries it to accelpact.recovery.rejoin): this implementation's name."""
        return self.name

    def join_plan(self) -> dict[str, Any]:
        """What the heal plan tells a replacement about joining (accelpact.recovery.rejoin reads it):
        ``{"data_plane": join_mode(), "group_count": c10d's group counter}``; an implementation may add
        what its join needs. The replacement continues the counter, so that a group created after the
        heal (``new_group`` without a name) gets the same name on every rank."""
        import torch.distributed.distributed_c10d as c10d

        return {"data_plane": self.join_mode(), "group_count": int(c10d._world.group_count)}

    # -- the live generation ----------------------------------------------------------------------

    @property
    def groups(self) -> list[dist.ProcessGroup]:
        """The live generation of every data-plane group (the table's list: rebinds update it)."""
        return self.table.groups

    @property
    def vote_group(self) -> dist.ProcessGroup:
        return self.table.groups[self.vote_index]

    def abort(self) -> int:
        """Break the live generation's transport so that peers blocked on this rank fail now."""
        return self.backend.abort()

    def is_comm_fault(self, exc: BaseException) -> bool:
        return self.backend.is_comm_fault(exc)

    def forget_expired(self) -> None:
        """Let go of abandoned generations whose collectives have timed out (Backend.forget_expired)."""
        self.backend.forget_expired()

    def abandon(self, groups: list[dist.ProcessGroup], work: Any) -> None:
        """Keep a generation whose collective was abandoned alive until the PG timeout (Backend.abandon)."""
        self.backend.abandon(groups, work, self.pg_timeout)

    def prepare_next_generation(self) -> None:
        """Let the control channel open the next generation's store connection in the background."""
        prepare = getattr(self.control, "prepare_data_plane", None)
        if prepare is not None:
            prepare()

    def rescan(self) -> None:
        """Rebuild the binding table after FSDP's lazy init; keep each group's spec and the vote group."""
        vote = self.vote_group
        table = self._scan(vote)
        specs = []
        for g in table.groups:
            i = next((i for i, h in enumerate(self.table.groups) if h is g), None)
            specs.append(self.specs[i] if i is not None else generations.group_spec(g, self.group_timeout))
        for i, h in enumerate(self.table.groups):  # still data-plane groups even if nothing holds them
            if all(g is not h for g in table.groups):
                table.groups.append(h)
                specs.append(self.specs[i])
        self.table, self.specs = table, specs
        self.vote_index = next(i for i, g in enumerate(table.groups) if g is vote)
        self.backend.groups = list(table.groups)  # the same generation, now complete
        self.rescanned = True

    # -- the next generation ----------------------------------------------------------------------

    @abc.abstractmethod
    def rebuild(
        self, generation: int, clock: RoundClock | None = None
    ) -> tuple[list[dist.ProcessGroup], list[dist.ProcessGroup]]:
        """Make ``generation`` of every data-plane group live; returns (old groups, new groups).

        Called by every rank of the generation alike (and by the heal, with the replacement's groups
        joining the same rendezvous). The caller keeps the old list until :meth:`prove` passed, then
        drops it. An in-place implementation returns the same objects twice. ``clock.mark()`` once
        after the groups exist and once after they are bound where FSDP looks for them.
        """

    def prove(self, new_groups: list[dist.ProcessGroup]) -> None:
        """The first collective on the new vote group; a peer's newer round abandons it."""
        try:
            self.backend.first_collective(
                new_groups[self.vote_index], superseded=getattr(self.control, "generation_superseded", None)
            )
        except GenerationSuperseded as abandoned:
            # The abandoned collective may still run in the backend until the PG timeout; the
            # backend decides how to let go of it without blocking the next round.
            self.abandon(new_groups, abandoned.work)
            raise
