"""The backend seam: everything the guard needs that differs between c10d backends (gloo, NCCL).

The guard itself is backend-neutral. Per backend it needs to:

- ``configure``: prepare the environment before the groups it will rebuild are created, and
  ``check`` that the user's groups were created in a way recovery can work with (e.g. NCCL error
  handling that does not kill the process);
- ``track`` / ``abort``: know the live generation's transport and break it, so that peers blocked on
  this rank fail within milliseconds instead of at the PG timeout;
- ``rebuild_groups``: build the next generation on a never-used store prefix under the old names
  (the generic part lives in :mod:`accelpact.backends.generations`) and track its transport;
- ``first_collective``: prove the new generation works, giving up when a peer has moved on;
- ``abandon``: what to do with a generation whose first collective was abandoned;
- ``vote_buffer`` / ``vote``: the commit vote's one-element tensor on the backend's device, and an
  all-reduce of it that returns only once it has really completed on this rank;
- ``is_comm_fault``: classify an exception as a recoverable communication fault, with the
  backend's own message fragments.

Modelled on torchft's per-backend configure/abort split and on NVIDIA resiliency-ext's small
composable abort objects: one small object per concern, no backend branches in the guard.
"""

from __future__ import annotations

import abc
import datetime
from collections.abc import Callable, Collection, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch.distributed as dist

from accelpact.backends import keepalive
from accelpact.backends.faults import matches_comm_fault
from accelpact.backends.vote_buffer import VoteBuffer
from accelpact.errors import AccelPactError

#: how the guard waits for its own collectives: wait(work, what, phase)
Waiter = Callable[[Any, str, str], None]

if TYPE_CHECKING:
    import torch

    from accelpact.backends.generations import GroupSpec
    from accelpact.backends.reconfigure import ReconfigurePath

__all__ = ["Backend", "backend_name"]


def backend_name(pg: dist.ProcessGroup) -> str:
    """The c10d backend name ``pg`` was created with (e.g. "gloo")."""
    import torch.distributed.distributed_c10d as c10d

    entry = c10d._world.pg_map.get(pg)
    if entry is None:
        raise AccelPactError(
            "process group is not registered in c10d (was it destroyed?); attach accelpact after "
            "init_process_group and fully_shard, before any recovery"
        )
    return str(entry[0])


class Backend(abc.ABC):
    """One backend's recovery operations. One instance per guard: it holds the live generation."""

    #: the c10d backend name this class handles (``c10d._world.pg_map[pg][0]``)
    name: ClassVar[str]
    #: the torch device types whose tensors this backend's collectives (FSDP's included) can carry
    devices: ClassVar[tuple[str, ...]] = ()
    #: lower-cased message fragments of this backend's transport failures (recoverable)
    fault_markers: ClassVar[tuple[str, ...]] = ()
    #: lower-cased fragments that make an error NOT recoverable even if it is a DistBackendError
    never_markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.groups: list[dist.ProcessGroup] = []  # the live generation
        self.exclude_ports: set[int] = set()
        # Generations whose collective was abandoned live in accelpact.backends.keepalive (process-wide,
        # so that dropping this backend never destroys one early); this number finds ours there.
        self._keeper = keepalive.new_owner()
        # The reconfigure data-plane path (accelpact.backends.reconfigure), when chosen at attach.
        self.reconfigure: ReconfigurePath | None = None
        # Which path the guard takes and why: set at attach by choose_path, per round by rebuild_groups.
        self.path: dict[str, str] = {"path": "rebuild", "why": "not chosen yet"}
        self.last_path: dict[str, str] = dict(self.path)

    # -- environment ---------------------------------------------------------------------------

    @classmethod
    def configure(cls, environ: MutableMapping[str, str] | None = None) -> None:
        """Set what this backend needs in the environment for groups created from now on.

        Call before ``init_process_group`` for the user's own groups; the guard calls it at attach
        for the groups it rebuilds. ``environ`` defaults to ``os.environ``. Never overrides a value
        the user set. Default: nothing.
        """

    def check(self, pg: dist.ProcessGroup) -> None:
        """Raise :class:`accelpact.errors.AccelPactError` naming the fix if ``pg`` cannot be recovered.

        Base rule: every data-plane group of one guard uses this backend.
        """
        name = backend_name(pg)
        if name != self.name:
            raise AccelPactError(
                f"data-plane group {getattr(pg, 'group_name', pg)!r} uses backend {name!r} but the guard's vote "
                f"group uses {self.name!r}; build every data-plane group with one backend"
            )

    # -- the live generation --------------------------------------------------------------------

    def track(self, groups: Sequence[dist.ProcessGroup], exclude_ports: Collection[int] = ()) -> None:
        """Adopt ``groups`` (built by the user before attach) as the live generation.

        ``exclude_ports`` are the ports of the stores (control store, rendezvous stores): an abort
        must never break them.
        """
        self.groups = list(groups)
        self.exclude_ports = set(exclude_ports)

    def reconfigured(self, reconfigure: Callable[[], list[dist.ProcessGroup]]) -> list[dist.ProcessGroup]:
        """Run ``reconfigure`` (which re-initialises the live groups in place and returns them) and adopt
        its result as the live generation: the same objects over a new transport."""
        self.groups = list(reconfigure())
        return list(self.groups)

    @abc.abstractmethod
    def abort(self) -> int:
        """Break the live generation's transport so peers blocked on this rank fail now.

        Idempotent; never raises for an already broken transport. Returns how many transport
        objects (sockets, communicators) were aborted.
        """

    def choose_path(self, mode: str, groups: Sequence[dist.ProcessGroup], world_ranks: Sequence[int]) -> None:
        """Pick the data-plane path at attach: reconfigure the groups in place (torch >= 2.15, every group
        supports it) or rebuild and rebind them. ``mode``: one of ``reconfigure.PATH_MODES``."""
        from accelpact.backends import reconfigure

        if mode not in reconfigure.PATH_MODES:
            raise AccelPactError(f"data_plane={mode!r}: expected one of {', '.join(reconfigure.PATH_MODES)}")
        why: str | None
        if mode == "rebuild":
            why = "data_plane='rebuild' was asked for"
        else:
            why = reconfigure.unsupported_reason(groups)
            if why is None:
                self.reconfigure = reconfigure.ReconfigurePath(world_ranks)
                self.path = {"path": "reconfigure", "why": "every data-plane group supports reconfigure"}
                self.last_path = dict(self.path)
                return
            if mode == "reconfigure":
                raise AccelPactError(
                    f"data_plane='reconfigure' is not possible: {why}; attach with "
                    "data_plane='auto' to fall back to rebuild-and-rebind"
                )
        self.reconfigure = None
        self.path = {"path": "rebuild", "why": why}
        self.last_path = dict(self.path)

    def rebuild_groups(
        self, olds: Sequence[dist.ProcessGroup | None], specs: Sequence[GroupSpec], store: dist.Store, rank: int
    ) -> list[dist.ProcessGroup]:
        """Build the next generation of every group on ``store`` (never used) and make it the live one."""
        from accelpact.backends import generations

        new = [
            generations.rebuild_group(old, spec, store, rank, device_id=self.rebuild_device(spec))
            for old, spec in zip(olds, specs)
        ]
        self.groups = new
        return new

    def path_plan(self) -> str:
        """The path a heal's replacement must join with: "reconfigure" or "rebuild" (written into the plan)."""
        return "reconfigure" if self.reconfigure is not None else "rebuild"

    def rebuild_device(self, spec: GroupSpec) -> torch.device | None:
        """The ``device_id`` a rebuilt group is bound to (None: unbound, as gloo on CPU)."""
        return spec.device_id

    # -- probes and buffers ----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def device(self) -> torch.device:
        """The device of this backend's collectives (the vote and the first collective)."""

    def vote_buffer(self) -> VoteBuffer:
        """The commit vote's one-element int64 buffer, on :attr:`device`: the count of voters and, folded
        into the same number, each rank's position (accelpact.common.positions)."""
        return VoteBuffer(self.device)

    def vote(self, buf: VoteBuffer, pg: dist.ProcessGroup, wait: Waiter | None = None) -> int:
        """The commit vote: all-reduce ``buf`` and return its sum only once it has COMPLETED on this rank.

        The commit rule reads "the vote completed here" as "every rank entered it and holds reduced
        gradients", so a backend whose collectives run asynchronously to the CPU must wait for the
        device before returning, and raise if the collective failed. ``wait(work, what, phase)`` (the
        guard's :class:`accelpact.backends.interruptible.CollectiveWaiter`) waits for the posted all-reduce and
        may give it up; None: ``work.wait()``.
        """
        work = dist.all_reduce(buf.tensor, group=pg, async_op=True)
        if wait is None:
            work.wait()
        else:
            wait(work, "the commit vote", "vote")
        return buf.get()

    def first_collective(
        self, pg: dist.ProcessGroup, superseded: Callable[[], bool] | None = None, poll_s: float = 0.02
    ) -> None:
        """One tiny all-reduce on the new generation (see :func:`accelpact.backends.generations.first_collective`)."""
        from accelpact.backends import generations

        generations.first_collective(pg, self.device, superseded=superseded, poll_s=poll_s)

    def abandon(self, groups: list[dist.ProcessGroup], work: Any, pg_timeout: datetime.timedelta) -> None:
        """Keep a generation whose first collective was abandoned alive until its PG timeout.

        The abandoned collective may still run in the backend, and a group's destructor can join
        it: dropping the group now would block a later retirement (and every thread) for that long.
        Kept process-wide (accelpact.backends.keepalive), not by this object: a closed guard's backend
        is freed by whichever garbage collection comes next, which would then wait out the collective.
        """
        keepalive.keep(self._keeper, groups, work, pg_timeout.total_seconds())

    def forget_expired(self) -> None:
        """Drop abandoned generations whose collectives have timed out by now.

        Called at every recovery and after every committed step (it returns at once when nothing is
        kept), so an abandoned generation's threads and sockets go within a step of its deadline. Only at
        recoveries, a nested fault's generation stayed until the next fault: measured on 4 gloo ranks,
        +3 threads and +5 fds per rank still held 20 s after the last step of the 10-fault run.
        """
        keepalive.forget_expired()

    @property
    def abandoned_generations(self) -> int:
        """How many generations this backend abandoned are still kept alive until their PG timeout."""
        return len(keepalive.kept_by(self._keeper))

    # -- classification --------------------------------------------------------------------------

    def is_comm_fault(self, exc: BaseException) -> bool:
        """True when ``exc`` is a recoverable communication fault of this backend."""
        return matches_comm_fault(exc, markers=self.fault_markers, never_markers=self.never_markers)
