"""Per-rank event log: the one contract between training ranks, the parent, goodput and plots.

Every rank appends JSON lines to ``<run_dir>/events/rank<R>.jsonl`` and the parent appends its own
to ``<run_dir>/events/parent.jsonl``. Timestamps are ``time.time()`` seconds: all processes share one
host clock, so events from different processes can be put on one timeline.

Each kind of record is one frozen dataclass (``harness.events.kinds``). Writers call
``EventLog.emit(Step, step=..., ...)`` (the class, so a misspelt field fails where it is written);
readers call :func:`load_events` (a run directory) or :func:`parse_records` (raw records) and select
with :func:`of_type`. Nothing outside this package compares a record's ``kind`` string: it is the only
list of kinds. Import the names from ``harness.events``; the package is split into the kinds, the parser
(``parse``) and the files (``log``: the writer and the readers).

Every record has ``kind``, ``t`` (when it was written, unless the writer gives it) and ``rank``
(``-1`` is the parent). Fields a writer adds beyond a class's own are kept, in ``extra``, and
written back flat: a newer writer's fields survive an older reader. A record of a kind this package
does not know (a plugin's own, e.g. ``toy_step``) is not an error: the parser skips it silently. A
record of a known kind that is torn or malformed (a missing field, a wrong type, a non-finite time, an
interval that ends before it starts) is counted in ``ParsedLog.skipped``, never used.

The kinds (and who writes them):

- :class:`Step` (``step``, each rank): one optimizer step that committed on this rank.
- :class:`Fault` (``fault``, the rank or the parent, whoever injected it): a fault was injected.
- :class:`Recovery` (``recovery``, each rank, accelpact): one in-memory recovery and its parts.
- :class:`Heal` (``heal``, each rank, accelpact with snapshots): one heal after a lost rank.
- :class:`Replacement` (``replacement``, the parent): it started a replacement process for a dead rank.
- :class:`Relaunch` (``relaunch``, the parent): it relaunched every rank (a cold restart).
- :class:`Restart` (``restart``, each rank): a process (re)start, once the rank is ready to train.
- :class:`Restore` (``restore``, each rank): a checkpoint load.
- :class:`Checkpoint` (``checkpoint``, each rank): a checkpoint save.
- :class:`Eval` (``eval``, each rank, ``train.eval_every``): an evaluation between steps.
- :class:`Fallback` (``fallback``, each rank, accelpact): no in-memory recovery was possible; the run
  falls back to checkpoint restore.
- :class:`Snapshots` (``snapshots``, each rank, accelpact with snapshots): what the in-memory
  snapshots cost this rank, written when it closes.
"""

from __future__ import annotations

from harness.events.kinds import (
    KINDS,
    Checkpoint,
    Eval,
    Event,
    Fallback,
    Fault,
    Heal,
    MalformedEvent,
    Recovery,
    Relaunch,
    Replacement,
    Restart,
    Restore,
    Snapshots,
    Step,
)
from harness.events.log import EventLog, events_path, load_events, read_events, read_file_events
from harness.events.parse import ParsedLog, of_type, parse_record, parse_records, typed

__all__ = [
    "Event",
    "Step",
    "Fault",
    "Recovery",
    "Heal",
    "Replacement",
    "Relaunch",
    "Restart",
    "Restore",
    "Checkpoint",
    "Eval",
    "Fallback",
    "Snapshots",
    "KINDS",
    "MalformedEvent",
    "ParsedLog",
    "parse_record",
    "parse_records",
    "typed",
    "of_type",
    "EventLog",
    "events_path",
    "read_events",
    "load_events",
    "read_file_events",
]
