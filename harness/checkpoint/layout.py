"""On-disk layout of the harness's DCP checkpoints, and the pure decisions made over it.

One checkpoint per directory, ``<root>/step_<N>/`` with N zero-padded so names sort by step. DCP
writes ``__<rank>_<i>.distcp`` files and ``.metadata`` into it. A checkpoint counts as COMPLETE only
when rank 0 has written the ``.complete`` marker, which it does after DCP's save returned on rank 0;
DCP's save returns there only after every rank reported its files written (fsynced) and the
``.metadata`` file was renamed into place. A process killed mid-save therefore leaves a directory
without the marker, and nothing here ever loads such a directory.

No torch in this module: the rules (which step is due, which directory is newest complete, what may
be deleted) are tested in milliseconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = ".complete"
METADATA = ".metadata"
_STEP_DIGITS = 9
_STEP_DIR = re.compile(r"^step_(\d+)$")


def is_due(step: int, interval: int) -> bool:
    """True when a save is due after committing ``step`` (0-based): every ``interval`` steps.

    With interval k the saves land after steps k-1, 2k-1, ...: a checkpoint always holds a whole
    number of intervals of training. ``interval == 0`` means never.
    """
    if interval < 0:
        raise ValueError(f"checkpoint interval must be >= 0 (0 = never), got {interval}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return interval > 0 and (step + 1) % interval == 0


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step_{step:0{_STEP_DIGITS}d}"


def parse_step_dir(name: str) -> int | None:
    """The step of a ``step_<N>`` directory name, or None for anything else."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Listing:
    """What is on disk: the steps that are complete and the ones that are not (both ascending)."""

    complete: tuple[int, ...]
    incomplete: tuple[int, ...]

    @property
    def latest(self) -> int | None:
        return self.complete[-1] if self.complete else None


def plan_prune(listing: Listing, keep: int) -> list[int]:
    """Steps whose directories may be deleted, given that the newest ``keep`` complete ones stay.

    Deleted: complete checkpoints older than the newest ``keep`` complete ones, and incomplete
    directories older than the newest complete one (leftovers of a killed or failed save; a save in
    flight is always newer than every complete checkpoint). Incomplete directories NEWER than the
    newest complete one are left alone: a save may be writing there right now.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the newest complete checkpoint is never deleted), got {keep}")
    doomed = list(listing.complete[:-keep]) if len(listing.complete) > keep else []
    if listing.latest is not None:
        doomed += [s for s in listing.incomplete if s < listing.latest]
    return sorted(doomed)


class CheckpointLayout:
    """The checkpoint root directory: naming, listing, the completion marker and pruning."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def listing(self) -> Listing:
        complete: list[int] = []
        incomplete: list[int] = []
        if self.root.is_dir():
            for entry in self.root.iterdir():
                step = parse_step_dir(entry.name)
                if step is None or not entry.is_dir():
                    continue
                (complete if (entry / MARKER).is_file() else incomplete).append(step)
        return Listing(tuple(sorted(complete)), tuple(sorted(incomplete)))

    def latest(self) -> int | None:
        return self.listing().latest

    def invalidate(self, step: int) -> None:
        """Make ``step``'s directory incomplete before it is written again (a replayed step).

        Only the marker and DCP's metadata go: the data files are overwritten by name, and removing
        them here could race with another rank already writing its own.
        """
        d = self.path(step)
        for name in (MARKER, METADATA):
            try:
                (d / name).unlink()
            except FileNotFoundError:
                pass

    def mark_complete(self, step: int, info: dict[str, object]) -> None:
        """Write the marker atomically (temp file, fsync, rename, fsync the directory)."""
        d = self.path(step)
        tmp = d / (MARKER + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"step": step, "t": time.time(), **info}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / MARKER)
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def prune(self, keep: int) -> list[int]:
        """Delete what ``plan_prune`` allows; returns the deleted steps."""
        doomed = plan_prune(self.listing(), keep)
        for step in doomed:
            shutil.rmtree(self.path(step), ignore_errors=True)
        return doomed

    def bytes_written(self, step: int, rank: int | None = None) -> int:
        """Sum of the DCP file sizes in ``step``'s directory (one rank's data files if ``rank``).

        The marker is ours, not DCP's, and is not counted.
        """
        d = self.path(step)
        total = 0
        for entry in d.iterdir():
            if entry.name.startswith(MARKER):
                continue
            if rank is not None and not entry.name.startswith(f"__{rank}_"):
                continue
            if entry.is_file():
                total += entry.stat().st_size
        return total
