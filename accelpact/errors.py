"""AccelPact's exception hierarchy: recoverable communication faults vs unrecoverable ones.

Modelled on nvidia-resiliency-ext's ``inprocess/exception.py``. A leaf: it imports nothing of accelpact
(which raw exceptions count as communication faults is the backends' call: accelpact.backends.faults).
The split matters because the two families have opposite handling rules:

- :class:`CommFault` (and any raw exception ``accelpact.backends.is_comm_fault`` accepts) is a data-plane
  fault that AccelPact recovers from in memory: agree, build a fresh process group, rebind, continue.
- :class:`UnrecoverableError` must never be swallowed: a rank is gone or the ranks' states cannot be
  reconciled. The caller falls back to checkpoint restore and the message says why.
- :class:`ControlChannelError` means the out-of-band store itself is unreachable; without it the ranks
  cannot agree, so it is not recoverable in memory either, but it is a distinct diagnosis (fix the store
  host or network, not the training job).
"""

from __future__ import annotations

from typing import Any

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
]


class AccelPactError(RuntimeError):
    """Base class of every error AccelPact raises."""


class CommFault(AccelPactError):
    """A recoverable data-plane communication fault.

    ``phase`` says where in the step it hit (a :class:`accelpact.recovery.consensus.Phase` value as a string,
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
    waiting out the whole PG timeout (accelpact/backends/interruptible.py has the measurements). ``work`` is
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

    def __init__(
        self,
        message: str,
        *,
        ranks: tuple[int, ...] = (),
        last_committed_step: int | None = None,
        generation: int | None = None,
        detected_by: str | None = None,
    ):
        super().__init__(message, ranks=ranks, last_committed_step=last_committed_step)
        self.generation = generation
        self.detected_by = detected_by


class StateDivergedError(UnrecoverableError):
    """The ranks' reports form a combination the commit rule cannot reconcile."""


class RolledBack(AccelPactError):
    """Not a failure: a heal moved this rank back to an earlier step; continue at ``resume_step``.

    Raised by ``Guard.step`` on a survivor of a lost rank that had committed past the newest step every
    rank holds (accelpact.recovery.heal): its model and optimizer now hold step ``resume_step - 1`` (loaded from
    its own snapshot slot, RNG included). The training loop catches it and runs ``resume_step`` next,
    with the batch of that step (``extra_state``: what the snapshot's ``extra_state`` callable saved, e.g.
    the data position). A heal that needs no rollback never raises: the step is retried inside.
    """

    def __init__(self, message: str, *, resume_step: int, extra_state: dict[str, Any] | None = None):
        super().__init__(message)
        self.resume_step = resume_step
        self.extra_state = extra_state or {}


class ControlChannelError(AccelPactError):
    """The out-of-band control store is unreachable past its deadline."""


class ControlStoreLostError(UnrecoverableError):
    """The control store was lost during the recovery of a fault (accelpact.control.store_loss): restore from a
    checkpoint. ``address``: the store's host:port; ``detected_by`` is always "control store"."""

    detected_by = "control store"

    def __init__(
        self, message: str, *, last_committed_step: int | None = None, generation: int | None = None, address: str = ""
    ):
        super().__init__(message, last_committed_step=last_committed_step)
        self.generation = generation
        self.address = address
