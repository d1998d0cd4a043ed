"""The ``host_loss`` fault: a whole simulated host dies, with its shared memory.

Hosts are network namespaces (``harness.faults.netns``; ``cluster=local_hosts`` puts
``world_size / hosts`` ranks in each, otherwise every rank is a host of its own). When the fault's
rank reaches the scheduled (step, phase), the parent:

1. records the ``fault`` event, naming the host and all of its ranks (``host_ranks``);
2. SIGKILLs every rank of that host (their process groups), as a power loss would;
3. deletes that host's snapshot root (``NetnsTopology.snapshot_root``): the host's shared memory is
   gone with it, so its ranks' own snapshots and the replicas it held for other hosts are lost.
   Killing first means no rank of the host can write into the directory after it is deleted.

What survives is what lives on the other hosts: the live state of their ranks, and the buddy
replicas of the lost ranks' snapshots (the buddy is on the next host). No rank is acked: they are dead.
"""

from __future__ import annotations

import shutil
import signal
from typing import Any

__all__ = ["apply_host_loss"]


def apply_host_loss(driver: Any, req: dict) -> None:
    topo = driver.topology_or_fail()
    host = topo.layout.host_of(int(req["rank"]))
    ranks = list(topo.layout.ranks_of_host(host))
    root = topo.snapshot_root(host)
    driver.record(req, host=host, host_ranks=ranks, snapshot_root=str(root))
    for rank in ranks:
        driver.signal(rank, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)
