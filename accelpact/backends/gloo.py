"""The gloo backend: abort by resetting this process's own data-plane TCP connections.

``ProcessGroupGloo.abort()`` / ``.shutdown()`` do nothing to an in-flight collective in torch 2.13
(measured: it completes, later ones succeed), so the only fast way to make peers blocked on this
rank fail is to ``shutdown(SHUT_RDWR)`` the generation's own TCP sockets: every peer then raises
"Connection closed by peer" within about 1-10 ms. Listeners and store connections are never
touched (a shut-down listener terminates the process; a broken store breaks the agreement).

Which sockets belong to the live generation: generation 0 was built by the user before attach, so
its sockets are "every TCP socket open at attach time that is not a store connection"; later
generations are exactly the sockets that appeared while the guard built them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import torch

from accelpact.backends.base import Backend
from accelpact.common.sockets import shutdown_sockets, tcp_socket_inodes

if TYPE_CHECKING:
    import torch.distributed as dist

    from accelpact.backends.generations import GroupSpec

__all__ = ["DataPlaneSockets", "GlooBackend"]


class DataPlaneSockets:
    """Which TCP sockets (by inode) belong to the live data-plane generation."""

    def __init__(self, exclude_ports: Collection[int]) -> None:
        self.exclude_ports = set(exclude_ports)
        self.inodes: set[int] = set(tcp_socket_inodes(self.exclude_ports))

    def snapshot(self) -> set[int]:
        """Every candidate socket open now (store connections and listeners excluded)."""
        return set(tcp_socket_inodes(self.exclude_ports))

    def adopt(self, before: set[int]) -> None:
        """The sockets that appeared since ``before`` are the new generation's."""
        self.inodes = self.snapshot() - before

    def shutdown(self) -> int:
        """Reset this generation's connections so peers blocked on them fail now, not at the timeout."""
        return shutdown_sockets(self.inodes)


class GlooBackend(Backend):
    """gloo over TCP: abort = reset own sockets; vote and probes on the CPU."""

    name = "gloo"
    devices = ("cpu",)  # FSDP2 on CUDA needs a reduce-scatter, which gloo has only for CPU tensors
    # Lower-cased fragments of gloo's transport errors in torch 2.13, as provoked here:
    #   "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:30857" (socket reset)
    #   "[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation" (hang)
    # A bare "ProcessGroupGloo" is deliberately NOT a marker: "ProcessGroupGloo::allreduce: unsupported
    # layout" and friends are usage errors that a new process group would hit again.
    fault_markers = (
        "connection closed by peer",
        "timed out waiting",
        "connectfullmesh",
        "gloo/transport/",
        "read error",
        "write error",
    )

    def __init__(self) -> None:
        super().__init__()
        self.sockets: DataPlaneSockets | None = None

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def track(self, groups: Sequence[dist.ProcessGroup], exclude_ports: Collection[int] = ()) -> None:
        super().track(groups, exclude_ports)
        self.sockets = DataPlaneSockets(self.exclude_ports)

    def abort(self) -> int:
        if self.sockets is None:
            raise RuntimeError("GlooBackend.abort() before track(): the guard tracks the groups at attach")
        return self.sockets.shutdown()

    def reconfigured(self, reconfigure: Callable[[], list[dist.ProcessGroup]]) -> list[dist.ProcessGroup]:
        if self.sockets is None:
            raise RuntimeError("GlooBackend.reconfigured() before track()")
        before = self.sockets.snapshot()
        groups = super().reconfigured(reconfigure)
        self.sockets.adopt(before)  # the reconfigure's new connections are what abort() must reset
        return groups

    def rebuild_groups(
        self, olds: Sequence[dist.ProcessGroup | None], specs: Sequence[GroupSpec], store: dist.Store, rank: int
    ) -> list[dist.ProcessGroup]:
        if self.sockets is None:
            raise RuntimeError("GlooBackend.rebuild_groups() before track()")
        before = self.sockets.snapshot()
        new = super().rebuild_groups(olds, specs, store, rank)
        self.sockets.adopt(before)
        return new
