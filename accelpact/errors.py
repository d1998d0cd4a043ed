"""AccelPact's exception hierarchy: recoverable communication faults vs unrecoverable ones.

Modelled on nvidia-resiliency-ext's ``inprocess/exception.py``. The split matters because the two
families have opposite handling rules:

- :class:`CommFault` (and any raw exception :func:`is_comm_fault` accepts) is a data-plane fault that
  AccelPact recovers from in memory: agree, build a fresh process group, rebind, continue.
- :class:`UnrecoverableError` must never be swallowed: a rank is gone or the ranks' states cannot be
  reconciled. The caller falls back to checkpoint restore and the message says why.
- :class:`ControlChannelError` means the out-of-band store itself is unreachable; without it the ranks
  cannot agree, so it is not recoverable in memory either, but it is a distinct diagnosis (fix the store
  host or network, not the training job).
"""

from __future__ import annotations

import sys
from typing import Collection

__all__ = [
    "AccelPactError",
    "CommFault",
    "CollectiveAbandoned",
    "UnrecoverableError",
    "RankLostError",
    "StateDivergedError",
    "RolledBack",
    "ControlChannelError",
    "ControlStoreLostError",
    "is_comm_fault",
    "GENERIC_FAULT_MARKERS",
]


class AccelPactError(RuntimeError):
    """Base class of every error AccelPact raises."""


class CommFault(AccelPactError):
    """A recoverable data-plane communication fault.

    ``phase`` says where in the step it hit (a :class:`accelpact.consensus.Phase` value as a string,
    or a free-form collective name); ``cause`` is the original backend exception, also chained as
    ``__cause__`` so tracebacks show it.
    """

    def __init__(self, message: str, *, phase: str | None = None, cause: BaseException | None = None):
        super().__init__(message)
        self.phase = phase
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause


class CollectiveAbandoned(CommFault):
    """This rank stopped waiting on one of the guard's own collectives because its peers moved on.

    gloo can miss the break of a rank's own connection and leave a collective posted at that moment
    waiting out the whole PG timeout (accelpact/interruptible.py has the measurements). ``work`` is
    the abandoned collective, still pending in the backend: keep it (and its group) alive until the
    PG timeout.
    """

    def __init__(self, message: str, *, work: object = None, phase: str | None = None):
        super().__init__(message, phase=phase)
        self.work = work


class GenerationSuperseded(CollectiveAbandoned):
    """A peer began a newer recovery round while this rank waited on the new generation's first collective.

    gloo can miss the reset of a socket and leave the collective waiting out the whole PG timeout
    (seen with a second fault during recovery); the peers have moved on, so this rank stops waiting
    and joins their round. ``work`` is the abandoned collective, still pending in gloo.
    """

    def __init__(self, message: str, *, work: object = None):
        super().__init__(message, work=work, phase="recovery")


class UnrecoverableError(AccelPactError):
    """Recovery in memory is impossible; the caller must fall back to checkpoint restore.

    ``ranks`` are the ranks the diagnosis is about; ``last_committed_step`` is the newest step known
    to be committed on every surviving rank (None when unknown), i.e. what a restore must reach.
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (), last_committed_step: int | None = None):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.last_committed_step = last_committed_step


class RankLostError(UnrecoverableError):
    """A rank died or missed the control-channel deadline.

    ``generation``: the recovery round in which it was found lost (None if unknown); ``detected_by``:
    how ("notice": someone who saw it die said so; "heartbeat": its connection dropped and it stopped
    beating; "deadline": it did not report before the control deadline).
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (), last_committed_step: int | None = None,
                 generation: int | None = None, detected_by: str | None = None):
        super().__init__(message, ranks=ranks, last_committed_step=last_committed_step)
        self.generation = generation
        self.detected_by = detected_by


class StateDivergedError(UnrecoverableError):
    """The ranks' reports form a combination the commit rule cannot reconcile."""


class RolledBack(AccelPactError):
    """Not a failure: a heal moved this rank back to an earlier step; continue at ``resume_step``.

    Raised by ``Guard.step`` on a survivor of a lost rank that had committed past the newest step every
    rank holds (accelpact.heal): its model and optimizer now hold step ``resume_step - 1`` (loaded from
    its own snapshot slot, RNG included). The training loop catches it and runs ``resume_step`` next,
    with the batch of that step (``extra_state``: what the snapshot's ``extra_state`` callable saved, e.g.
    the data position). A heal that needs no rollback never raises: the step is retried inside.
    """

    def __init__(self, message: str, *, resume_step: int, extra_state: dict | None = None):
        super().__init__(message)
        self.resume_step = resume_step
        self.extra_state = extra_state or {}


class ControlChannelError(AccelPactError):
    """The out-of-band control store is unreachable past its deadline."""


class ControlStoreLostError(UnrecoverableError):
    """The control store was lost during the recovery of a fault (accelpact.store_loss): restore from a
    checkpoint. ``address``: the store's host:port; ``detected_by`` is always "control store"."""

    detected_by = "control store"

    def __init__(self, message: str, *, last_committed_step: int | None = None, generation: int | None = None,
                 address: str = ""):
        super().__init__(message, last_committed_step=last_committed_step)
        self.generation = generation
        self.address = address


# Lower-cased fragments of operating-system socket errors, whatever the backend's transport. The
# backend-specific fragments (gloo's "Connection closed by peer" / "Timed out waiting", NCCL's
# "ncclRemoteError", ...) live with each backend (accelpact.backends, ``Backend.fault_markers``).
GENERIC_FAULT_MARKERS: tuple[str, ...] = (
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "socket timeout",
    "no route to host",
    "network is unreachable",
    "transport endpoint is not connected",
)

# Errors that are never comm faults even if their text happens to contain a marker.
_NEVER_COMM: tuple[type[BaseException], ...] = (MemoryError, KeyboardInterrupt, SystemExit, GeneratorExit)


def _dist_error_types() -> tuple[type[BaseException], ...]:
    """torch.distributed's backend/network/store error classes, or () when it was never imported.

    Read from sys.modules instead of importing: an exception of those classes can only exist once
    torch.distributed is loaded, and pure-logic callers should not pay seconds for importing torch.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return ()
    # DistStoreError counts: raw store errors reach the caller only from the data-plane store (gloo's
    # rendezvous when a peer never joins); the control channel converts its own into ControlChannelError.
    names = ("DistBackendError", "DistNetworkError", "DistStoreError")
    return tuple(cls for cls in (getattr(dist, n, None) for n in names) if isinstance(cls, type))


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError without importing torch
        return True
    return "out of memory" in str(exc).lower()


def is_comm_fault(exc: BaseException, markers: Collection[str] | None = None,
                  never_markers: Collection[str] = ()) -> bool:
    """True when ``exc`` is a recoverable data-plane communication fault.

    Accepts :class:`CommFault`, torch's ``DistBackendError`` / ``DistNetworkError`` / ``DistStoreError``,
    and plain ``RuntimeError`` whose text carries a transport message: an operating-system socket error
    (:data:`GENERIC_FAULT_MARKERS`) or one of ``markers``, the lower-cased fragments a backend's
    transport raises (``None``: every registered backend's, e.g. gloo's "Connection closed by peer" or
    "Timed out waiting"). ``never_markers`` are fragments that make an error NOT a comm fault even if it
    is a ``DistBackendError`` (a backend's usage errors). An exception explicitly wrapping a fault
    (``raise X from fault``) counts too; an unrelated error merely raised while handling one
    (``__context__``) does not. Rejects unrecoverable AccelPact errors, out-of-memory,
    KeyboardInterrupt/SystemExit, and ordinary errors such as shape mismatches.
    """
    if markers is None:
        from accelpact.backends import all_fault_markers  # lazily: the backends import torch

        markers = all_fault_markers()
    fragments = GENERIC_FAULT_MARKERS + tuple(markers)
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, _NEVER_COMM) or isinstance(cur, (UnrecoverableError, ControlChannelError)):
            return False
        if _is_oom(cur):
            return False
        if isinstance(cur, CommFault):
            return True
        if isinstance(cur, RuntimeError):
            text = str(cur).lower()
            if any(marker in text for marker in never_markers):
                return False
            dist_types = _dist_error_types()
            if dist_types and isinstance(cur, dist_types):
                return True
            if any(marker in text for marker in fragments):
                return True
        cur = cur.__cause__
    return False
