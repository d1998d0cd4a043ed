"""Loss of the control store: what a rank says when the process hosting it (the harness parent,
torchrun's agent) dies or restarts.

Between faults the store is only used by each rank's heartbeat: training goes on over the data plane.
The heartbeat thread notices first; :class:`StoreLossReporter` turns that into ONE line on stderr
when the store stops answering, and one more if it answers again (a store restarted at the same
address: the ranks re-register simply by beating and, at the next fault, by posting that
generation's reports; nothing older than the current generation is ever read, so an empty store
loses nothing recovery needs). A run with no further fault finishes normally.

At a fault the store is indispensable (the ranks agree on what to do through it). If it is gone,
the guard raises :class:`accelpact.errors.ControlStoreLostError` within the control deadline,
naming the store's address and this rank's last committed step: the caller restores from a
checkpoint (:func:`store_lost_error` builds it).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from accelpact.errors import ControlChannelError, ControlStoreLostError

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient

__all__ = ["StoreLossReporter", "store_lost_error"]


class StoreLossReporter:
    """Reports, once per transition, that the control store stopped (or resumed) answering a rank."""

    def __init__(self, rank: int, host: str, port: int, stream: TextIO | None = None) -> None:
        self.rank, self.address = rank, f"{host}:{port}"
        self.stream = stream
        self.lost_since: float | None = None
        self.losses = 0  # transitions to "lost" so far (a test reads it)

    def failed(self, exc: BaseException) -> None:
        if self.lost_since is not None:
            return
        self.lost_since = time.time()
        self.losses += 1
        print(
            f"accelpact: rank {self.rank}: the control store at {self.address} stopped answering the "
            f"heartbeat ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); training "
            "continues, but a fault now cannot be recovered in memory (restore from a checkpoint)",
            file=self.stream or sys.stderr,
            flush=True,
        )

    def answered(self) -> None:
        if self.lost_since is None:
            return
        print(
            f"accelpact: rank {self.rank}: the control store at {self.address} answers again after "
            f"{time.time() - self.lost_since:.1f} s; this rank re-registered its heartbeat",
            file=self.stream or sys.stderr,
            flush=True,
        )
        self.lost_since = None


def store_lost_error(
    err: ControlChannelError, *, control: ControlClient, step: int, committed_step: int
) -> ControlStoreLostError:
    """The error a rank raises when the control store is lost during the recovery of a fault."""
    cfg = getattr(control, "config", None)
    where = f"{cfg.host}:{cfg.port}" if cfg is not None else "its address"
    generation = getattr(control, "generation", None)
    return ControlStoreLostError(
        f"the control store at {where} is lost (its host process died or is unreachable): after a fault at "
        f"step {step}, recovery generation {generation}; this rank's last committed step is {committed_step}. "
        f"In-memory recovery is impossible: restore from a checkpoint. ({err})",
        last_committed_step=committed_step,
        generation=generation,
        address=where,
    )
