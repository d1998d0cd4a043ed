"""What a checkpoint save or load reports, and the errors a save can raise. No torch here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class CheckpointError(RuntimeError):
    """Base class of the checkpointer's own errors."""


class CheckpointSaveError(CheckpointError):
    """A save failed on this rank or on another rank. For an async save it is raised by the next
    ``save``/``wait``/``poll``; the step's directory is left incomplete and is never loaded."""

    def __init__(self, step: int, cause: BaseException) -> None:
        super().__init__(
            f"checkpoint save of step {step} failed: {type(cause).__name__}: {cause}. "
            "Its directory has no .complete marker, so it will never be loaded; the previous complete "
            "checkpoint is intact."
        )
        self.step = step
        self.cause = cause


class CheckpointModeUnavailable(CheckpointError):
    """The requested save mode cannot run on this machine (the message names the one that can)."""


@dataclass
class SaveRecord:
    """One save as the training loop saw it.

    ``t_start``..``t_end`` (``time.time()`` seconds) is the stall: the loop was blocked for that long.
    For sync saves that is the whole write; for async saves it is the wait for the previous save (if
    any, ``wait_s`` of it) plus state-dict collection and staging into host memory. The write itself
    ends at ``t_complete``; ``bytes_rank`` / ``bytes_total`` (sum of file sizes) and the memory
    figures are filled in then. ``complete`` is True once the ``.complete`` marker exists (it is
    written by rank 0; other ranks set it when their own write returned successfully, which DCP only
    allows after every rank's files and the metadata are on disk).
    """

    step: int
    mode: str
    t_start: float
    t_end: float
    staging: str  # "none" (sync), "fresh" (new buffers each save), "cached", "pinned"
    wait_s: float = 0.0
    t_complete: float | None = None
    bytes_rank: int | None = None
    bytes_total: int | None = None
    rss_before: int | None = None
    rss_peak_delta: int | None = None
    complete: bool = False

    @property
    def stall_s(self) -> float:
        return self.t_end - self.t_start

    @property
    def bytes(self) -> int | None:
        return self.bytes_total

    def event_fields(self) -> dict[str, Any]:
        """Fields for the ``checkpoint`` event (harness.events) plus the measurements."""
        fields = asdict(self)
        fields["bytes"] = self.bytes_total
        return fields


@dataclass
class LoadRecord:
    """One restore: ``from_step`` is the checkpoint's step; ``bytes`` is the checkpoint's size on disk."""

    from_step: int
    t_start: float
    t_end: float
    bytes: int

    def event_fields(self) -> dict[str, Any]:
        return asdict(self)
