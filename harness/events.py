"""Per-rank event log: the one contract between training ranks, the parent, goodput and plots.

Every rank appends JSON lines to ``<run_dir>/events/rank<R>.jsonl`` and the parent appends its own
to ``<run_dir>/events/parent.jsonl``. Timestamps are ``time.time()`` seconds: all processes share one
host clock, so events from different processes can be put on one timeline.

Kinds (every record has ``kind``, ``t`` (when it was written) and ``rank``; -1 is the parent):

- ``step``: one optimizer step that committed on this rank.
  ``step`` (0-based index), ``t_start``, ``t_end``, ``loss``, ``tokens``, ``incarnation``
  (0 for the first launch, +1 for every cold restart / in-process restart), ``replay`` (True when
  this step index had already committed once and was thrown away by a rollback).
- ``fault``: a fault was injected. ``fault`` (kind), ``step``, ``phase``, ``ranks``.
- ``recovery``: an in-memory recovery (accelpact). ``step``, ``decision``, ``phase``, and durations
  in seconds: ``detection_s``, ``agreement_s``, ``rebuild_s``, ``rebind_s``, ``first_collective_s``.
- ``restart``: a process (re)start, written by the rank once it is ready to train.
  ``t_launch`` (when the parent launched it), ``t_ready``, ``incarnation``.
- ``restore``: a checkpoint load. ``from_step`` (the checkpoint's step), ``t_start``, ``t_end``.
- ``checkpoint``: a checkpoint save. ``step``, ``t_start``, ``t_end`` (training stalled between them),
  ``bytes``, ``mode``.
- ``fallback``: accelpact could not recover in memory and the run fell back to checkpoint restore.
  ``reason``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

EVENTS_DIR = "events"


def events_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` (``-1`` for the parent) writes its events."""
    name = "parent.jsonl" if rank < 0 else f"rank{rank}.jsonl"
    return Path(run_dir) / EVENTS_DIR / name


class EventLog:
    """Append-only JSONL writer; each record is flushed so a killed process loses nothing written."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        path = events_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8")

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, "t": time.time(), "rank": self.rank, **fields}
        self._file.write(json.dumps(record) + "\n")
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a run, every process, sorted by time. A torn last line (killed writer) is skipped."""
    records: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / EVENTS_DIR).glob("*.jsonl")):
        records.extend(_read_lines(path))
    records.sort(key=lambda r: r["t"])
    return records


def _read_lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
