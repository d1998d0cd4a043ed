"""Today's data plane (every torch release): new group objects under the old names, then a rebind.

A process group never works again after an error (gloo; NCCL once aborted), so each generation is
NEW group objects, built on a never-used prefix of the control store under the old groups' names
(accelpact.backends.generations), and every place FSDP caches a group is pointed at the new ones
(accelpact.dataplane.bindings). The old objects are returned to the caller, which drops them once the
new generation's first collective worked: their destructors join their threads and close their sockets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelpact.backends import generations
from accelpact.dataplane.bindings import find_stale_references
from accelpact.dataplane.plane import DataPlane
from accelpact.detection.linkprobe import wait_reachable
from accelpact.errors import AccelPactError
from accelpact.events import RoundClock

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["RebindPlane"]


class RebindPlane(DataPlane):
    """Rebuild every group under its old name on generation ``n``'s store prefix, then rebind in place."""

    name = "rebind"

    def rebuild(
        self, generation: int, clock: RoundClock | None = None
    ) -> tuple[list[dist.ProcessGroup], list[dist.ProcessGroup]]:
        self.wait_for_peers()
        return self.rebuild_on(self.control.data_plane_store(generation), clock)

    def wait_for_peers(self) -> None:
        """A link still down or blackholed: wait for it (within the deadline) instead of building on it."""
        wait_reachable(self.peers, getattr(getattr(self.control, "config", None), "deadline_s", 30.0))

    def rebuild_on(
        self, store: dist.Store, clock: RoundClock | None = None
    ) -> tuple[list[dist.ProcessGroup], list[dist.ProcessGroup]]:
        """New groups under the old names on ``store`` (never used), then the rebind; (old, new)."""
        old_groups = list(self.table.groups)
        new_groups = self.backend.rebuild_groups(old_groups, self.specs, store, self.rank)
        if clock is not None:
            clock.mark()
        # Rebind in place (function defaults of modules imported since attach included).
        self.table.refresh_defaults()
        self.table.rebind(dict(zip(old_groups, new_groups)))
        if clock is not None:
            clock.mark()
        if self.verify_rebind:
            stale = [(generations.describe(pg), find_stale_references(pg, ignore=(old_groups,))) for pg in old_groups]
            stale = [(pg, refs) for pg, refs in stale if refs]
            if stale:
                raise AccelPactError(f"rebind incomplete, still referring to the old group: {stale}")
        return old_groups, new_groups
