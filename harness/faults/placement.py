"""Where a run's control store lives, and whether its ranks run in network namespaces.

One decision, from the specs of every kind the run plans (their union: ``harness.faults.planned``) and the cluster: the parent follows it when it sets a run up
(``harness.parent.run``), and validation (``harness.app.capabilities``) refuses a run whose fault needs a
store somewhere else, so the two cannot disagree (docs/reliability.md has the case that split them).

- ``bridge_namespace``: the ranks run in namespaces (a namespace fault, or ``cluster.hosts`` > 0); the
  store runs in the topology's bridge namespace, on the control network every host reaches.
- ``child``: a fault that kills the store (``FaultSpec.store_in_child``): the parent hosts it in a
  child process it can SIGKILL.
- ``parent``: everything else: the parent hosts it in itself.

Torch-free and cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from harness.faults import planned
from harness.schema import RunConfig

__all__ = ["StoreHome", "Placement", "placement", "unmet_need"]


class StoreHome(str, Enum):
    parent = "parent"
    child = "child"
    bridge_namespace = "bridge_namespace"


@dataclass(frozen=True)
class Placement:
    namespaces: bool  # the ranks run in network namespaces (root only)
    store: StoreHome


def placement(run: RunConfig) -> Placement:
    """What the parent sets up for ``run``: namespaces or not, and the control store's home."""
    specs = planned.specs(run)
    namespaces = any(s.needs_netns for s in specs) or run.cluster.hosts > 0
    if namespaces:
        store = StoreHome.bridge_namespace
    elif any(s.store_in_child for s in specs):
        store = StoreHome.child
    else:
        store = StoreHome.parent
    return Placement(namespaces, store)


def unmet_need(run: RunConfig) -> str | None:
    """Why the placement of ``run`` cannot give its fault what the fault's spec needs (one line with
    the fix), or None when it can."""
    where = placement(run)
    for spec in planned.specs(run):
        if spec.store_in_child and where.store != StoreHome.child:
            if planned.is_trace(run.fault):
                return (
                    f"{planned.describe(run)} draws {spec.kind}, which kills the control store the parent hosts "
                    "in a child process, and a namespace fault, which puts the store in the hosts' bridge "
                    "namespace, where it cannot be killed; try another `fault.seed`"
                )
            return (
                f"fault={spec.kind} kills the control store the parent hosts in a child process; with "
                f"cluster.hosts={run.cluster.hosts} the store runs in the hosts' bridge namespace, which it "
                f"cannot kill; try `cluster=local_cpu` (or `cluster.hosts=0`)"
            )
    return None
