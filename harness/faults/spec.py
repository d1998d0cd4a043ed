"""``FaultSpec``: everything the harness knows about one fault kind, in one object.

Who applies a fault (``where``):

- ``rank``: the rank itself at the scheduled (step, phase), through accelpact's ``FaultInjector``
  with ``rank_action`` (e.g. ``reset``: shut its own gloo connections);
- ``parent``: the rank asks the parent at the phase and waits; the parent calls ``parent_apply``
  (signals from outside: SIGSTOP, SIGKILL);
- ``netns``: like ``parent``, but the ranks run in network namespaces and ``parent_apply`` acts on
  a rank's link (needs root);
- ``none``: no fault (the fault-free reference).

Its own module so that the built-in kinds (``harness.faults.kinds``) and the registry that loads them
(``harness.faults.registry``) both import it and not each other. Pure data, torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FaultSpec", "NO_FAULT", "ParentApply"]

NO_FAULT = "none"
_WHERE = ("rank", "parent", "netns", "none")
# (driver: harness.faults.driver.FaultDriver, request: dict from the rank) -> None
ParentApply = Callable[[Any, dict], None]


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    description: str
    where: str  # "rank" | "parent" | "netns" | "none"
    # FaultInjector action: for where == "rank", the fault itself; for where == "parent", what the rank
    # does once the parent acted and acked (control_store_loss: the store dies, then a data-plane reset)
    rank_action: str | None = None
    parent_apply: ParentApply | None = None  # for where == "parent" / "netns"
    # An outage (a stop or a silent link fault) breaks a collective only if it outlasts the process-
    # group timeout; shorter ones are absorbed by TCP retransmits and waiting.
    outage: bool = False
    # The rank applies its action once more during the in-memory recovery the first one starts (the
    # guard's "recovery" point: new generation built, before its first collective), so that recovery
    # needs a second round. For where == "rank" only; a strategy without in-memory recovery never
    # reaches that point, and the second firing is simply skipped.
    nested: bool = False
    # The parent hosts the control store in a child process (harness.faults.store_host) that its
    # parent_apply can kill, instead of in itself. For where == "parent" only.
    store_in_child: bool = False
    # The fault kills rank processes (a strategy that heals in memory then needs replacements: the parent
    # prepares a replacement template at launch, harness.parent.template).
    kills_ranks: bool = False
    # It kills every rank of the job at once (``kill_all``: a whole-job crash): no rank survives to heal
    # the others in memory, so every rank is relaunched.
    kills_all: bool = False

    def __post_init__(self) -> None:
        if self.where not in _WHERE:
            raise ValueError(f"FaultSpec({self.kind}).where={self.where!r}: choose one of {_WHERE}")
        if self.where == "rank" and not self.rank_action:
            raise ValueError(f"FaultSpec({self.kind}) is applied by the rank: give its rank_action (e.g. 'reset')")
        if self.where in ("parent", "netns") and self.parent_apply is None:
            raise ValueError(f"FaultSpec({self.kind}) is applied by the parent: give its parent_apply function")
        if self.store_in_child and self.where != "parent":
            raise ValueError(
                f"FaultSpec({self.kind}).store_in_child: only a parent-side fault can kill the store "
                "it hosts; use where='parent'"
            )
        if self.kills_all and not self.kills_ranks:
            raise ValueError(
                f"FaultSpec({self.kind}).kills_all: a fault that kills every rank kills ranks; set kills_ranks=True too"
            )
        if self.nested and self.where != "rank":
            raise ValueError(
                f"FaultSpec({self.kind}).nested: only a fault the rank applies itself can fire again "
                "inside the recovery; use where='rank'"
            )

    @property
    def injects(self) -> bool:
        """False only for the fault-free kind."""
        return self.where != "none"

    @property
    def needs_netns(self) -> bool:
        """The ranks must run in network namespaces (root only)."""
        return self.where == "netns"

    @property
    def kills_hosts(self) -> bool:
        """The fault kills every rank of the scheduled rank's host (``host_loss``): a rank kill where the
        ranks run in host namespaces."""
        return self.kills_ranks and self.needs_netns

    @property
    def needs_root(self) -> bool:
        return self.needs_netns
