"""Where a strategy's own server process runs, so that every rank reaches it, wherever the ranks run.

Some strategies need a server that outlives the ranks: NVRx's TCPStore
(``harness.parent.strategies.nvrx_store``), torchft's Lighthouse
(``harness.parent.strategies.torchft_lighthouse``). It must run at an address every rank can dial. There are
two homes, the same two the harness's control store has (``harness.faults.placement``):

- the parent's network namespace, on ``cluster.master_addr``: the ranks run in that namespace too
  (``cluster=local_cpu``);
- the topology's bridge namespace, on the control network's bridge address: the ranks run in network
  namespaces (``cluster.hosts`` > 0, or a namespace fault such as ``host_loss``). The parent's
  namespace has no link into the ranks' (by design: no job address reaches the root namespace), so a
  server at 127.0.0.1 in the parent is unreachable and each rank would dial its own loopback. Every
  host reaches the bridge namespace over its control link (``ctl0``), which data-plane faults never
  touch, and a host loss kills only the lost host's processes: the server lives on.

``ServerHome`` is that decision; ``command`` wraps a server's argv so it starts there. With
``ip netns exec`` (which execs the command: no extra process) the server is still the parent's child,
so a parent-death signal and ``Popen.wait`` keep working, and the topology's teardown kills it with
every other process of the job's namespaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ServerHome", "server_home"]


@dataclass(frozen=True)
class ServerHome:
    """A server's namespace (None: the parent's own) and the address it listens on there."""

    host: str
    netns: str | None = None

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in this home's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def describe(self) -> str:
        return f"{self.host} in namespace {self.netns}" if self.netns else f"{self.host} in the parent's namespace"


def server_home(run: Any, launcher: Any) -> ServerHome:
    """Where this run's strategy servers live: the launcher names a namespace for them when its ranks run
    in network namespaces (``LaunchPlan.store_netns``; the control store's host is their address there),
    else the parent's namespace on ``cluster.master_addr``."""
    netns: str | None = getattr(launcher, "store_netns", None)
    if netns:
        return ServerHome(launcher.control_host, netns)
    return ServerHome(run.cluster.master_addr)
