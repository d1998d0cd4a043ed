"""The in-place data plane (torch >= 2.15): a recovery reconfigures the SAME process groups.

torch 2.15 re-initialises a live group's communicator without replacing the group object
(``dist._reconfigure``; the per-group handle exchange is :mod:`accelpact.backends.reconfigure`). Every
reference FSDP2, DeviceMesh and DTensor cached stays valid, so :meth:`ReconfigurePlane.rebuild` returns
the very objects it was given and there is nothing to rebind.

It degrades instead of failing, and always says why (``last_path``, copied into every recovery and heal
event):

- at attach, when this torch has no reconfigure or a group cannot take it, every rebuild takes the
  rebind path of :class:`accelpact.dataplane.rebind.RebindPlane` (``data_plane="auto"``; asking for
  ``"reconfigure"`` explicitly refuses at attach instead, naming the reason);
- in a round where ANY rank's reconfigure failed, every rank rebuilds and rebinds on a never-used
  sub-prefix of the generation's store (the reconfigure used the generation's keys already), and later
  rounds keep doing so: the rebind path is the proven one.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from accelpact.backends import reconfigure
from accelpact.dataplane.rebind import RebindPlane
from accelpact.events import RoundClock

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["ReconfigurePlane"]

# The sub-prefix a round rebuilds on after a failed reconfigure (the replacement's rejoin uses it too).
FALLBACK_PREFIX = "fallback/"


class ReconfigurePlane(RebindPlane):
    """Reconfigure every group in place where torch and the groups allow it; else rebuild and rebind."""

    name = "reconfigure"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        why_not = reconfigure.unsupported_reason(self.groups)
        self.unsupported = why_not  # None: reconfigure is possible (attach refuses otherwise when asked for)
        world = sorted({r for spec in self.specs for r in spec.ranks})
        # The reconfigure's bound, once every handle is published: the control channel's deadline.
        deadline_s = getattr(getattr(self.control, "config", None), "deadline_s", None)
        timeout = (
            datetime.timedelta(seconds=deadline_s)
            if isinstance(deadline_s, (int, float))
            else reconfigure.DEFAULT_TIMEOUT
        )
        self._path = None if why_not is not None else reconfigure.ReconfigurePath(world, timeout)
        self.last_path = (
            {"path": "reconfigure", "why": "every data-plane group supports reconfigure"}
            if why_not is None
            else {"path": "rebind", "why": why_not}
        )

    def join_mode(self) -> str:
        """What a heal's replacement must run with the survivors: "reconfigure" or "rebind"."""
        return "reconfigure" if self._path is not None else "rebind"

    def join_plan(self) -> dict[str, Any]:
        """The heal plan's part: reconfigure, with where each group's store is (the replacement must
        create its groups on the survivors' store keys: accelpact.backends.reconfigure), or rebind.

        Where a group's store cannot be described (not a TCPStore, say), this heal and every later
        round take the rebind path, and ``last_path`` says why.
        """
        rebind = {**super().join_plan(), "data_plane": "rebind"}
        if self._path is None:
            return rebind
        try:
            stores = [reconfigure.group_store_address(g) for g in self.groups]
        except reconfigure.Fallback as fallback:
            self._path = None
            self.last_path = {"path": "rebind", "why": f"a replacement cannot join in place: {fallback.reason}"}
            return rebind
        return {**super().join_plan(), "data_plane": "reconfigure", "group_stores": stores}

    def rebuild(
        self, generation: int, clock: RoundClock | None = None
    ) -> tuple[list[dist.ProcessGroup], list[dist.ProcessGroup]]:
        if self._path is None:
            return super().rebuild(generation, clock)
        self.wait_for_peers()
        store = self.control.data_plane_store(generation)
        groups = list(self.table.groups)
        path = self._path
        try:
            same = self.backend.reconfigured(lambda: path.reconfigure(groups, self.specs, store, self.rank))
        except reconfigure.Fallback as fallback:
            self._path = None  # later rounds rebuild too
            why = f"reconfigure failed, fell back: {fallback.reason}"
            old, new = self.rebuild_on(_fallback_store(store), clock)
            self.last_path = {"path": "rebind", "why": why}
            return old, new
        if clock is not None:
            clock.mark()  # the groups work again ...
            clock.mark()  # ... and nothing needs rebinding
        self.last_path = {"path": "reconfigure", "why": "the same groups, reconfigured in place"}
        return groups, same


def _fallback_store(store: Any) -> Any:
    import torch.distributed as dist

    return dist.PrefixStore(FALLBACK_PREFIX, store)
