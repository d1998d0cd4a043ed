"""The event files of a run: where each process writes (``events/``), the writer, and the readers.

A writer flushes every record, so a killed process loses nothing it wrote; a reader skips a torn last
line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from harness.events.kinds import KINDS, Event
from harness.events.parse import typed

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

    def emit(self, kind: type[Event] | str, **fields_: Any) -> dict[str, Any]:
        """Write one record: ``kind`` is an Event class or its ``KIND`` (its fields are checked by name
        here; the record's ``t`` is now unless given), or a plugin's own kind name (written as given)."""
        t = fields_.pop("t", None)
        t = time.time() if t is None else t
        kind = KINDS.get(kind, kind) if isinstance(kind, str) else kind
        if isinstance(kind, str):
            record = {"kind": kind, "t": t, "rank": self.rank, **fields_}
        else:
            declared = {f.name for f in fields(kind)} - {"extra"}
            extra = {k: v for k, v in fields_.items() if k not in declared}
            own = {k: v for k, v in fields_.items() if k in declared}
            record = kind(t=t, rank=self.rank, extra=extra, **own).to_record()
        self._file.write(json.dumps(record) + "\n")
        return record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All raw records of a run, every process, sorted by time. A torn last line (killed writer) is skipped."""
    records: list[dict[str, Any]] = []
    for path in sorted((Path(run_dir) / EVENTS_DIR).glob("*.jsonl")):
        records.extend(_read_lines(path))
    records.sort(key=lambda r: r["t"])
    return records


def load_events(run_dir: str | os.PathLike[str]) -> list[Event]:
    """All readable typed events of a run, sorted by time (``[]`` when the run wrote none)."""
    if not (Path(run_dir) / EVENTS_DIR).exists():
        return []
    return typed(read_events(run_dir))


def read_file_events(path: str | os.PathLike[str]) -> list[Event]:
    """The readable typed events of one events file, in file order (``[]`` when it does not exist)."""
    path = Path(path)
    return typed(_read_lines(path)) if path.exists() else []


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
