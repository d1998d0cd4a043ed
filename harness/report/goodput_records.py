"""Parsing of the event records that goodput accounting reads, tolerant of torn, partial and unsorted logs.

Turns the raw records of ``harness.events`` (every rank, every incarnation) into steps, faults and the
labelled intervals ``harness.report.goodput`` sweeps over. The typed events of ``harness.events``
say what a record holds; malformed records are skipped and counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness import events as ev


@dataclass(frozen=True)
class StepRecord:
    rank: int
    step: int
    t_start: float
    t_end: float
    tokens: int
    incarnation: int


@dataclass(frozen=True)
class FaultRecord:
    kind: str
    step: int | None
    phase: str | None
    ranks: tuple[int, ...]
    t: float


@dataclass
class ParsedEvents:
    steps: list[StepRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    # (rank, start, end, label) for labels other than useful/replay/restart
    intervals: list[tuple[int, float, float, str]] = field(default_factory=list)
    restarts: list[tuple[int, float, float]] = field(default_factory=list)  # rank, t_launch, t_ready
    # A replacement process's start (a heal in memory, not a relaunch): rank, t_launch, t_ready.
    replacement_starts: list[tuple[int, float, float]] = field(default_factory=list)
    heal_detections: list[tuple[int, float]] = field(default_factory=list)  # rank, heal's t_detected
    replacement_spawns: list[tuple[int, float]] = field(default_factory=list)  # rank, a launcher's spawn of it
    retries: list[tuple[int, float, float]] = field(default_factory=list)  # rank, start, end of a "retry" recovery
    fallbacks: list[str] = field(default_factory=list)
    skipped: int = 0


def parse_events(events: Iterable[Mapping[str, Any] | ev.Event]) -> ParsedEvents:
    """Steps, faults and labelled intervals of raw records or typed events (``harness.events``)."""
    log = ev.parse_records(events)
    out = ParsedEvents(skipped=log.skipped)
    raw_faults: list[tuple[float, int, FaultRecord]] = []
    for e in log.events:
        if isinstance(e, ev.Step):
            wait = e.snapshot_wait_s
            if wait is not None and 0 < wait <= e.t_end - e.t_start:
                out.intervals.append((e.rank, e.t_end - wait, e.t_end, "snapshot_overhead"))
            out.steps.append(
                StepRecord(
                    rank=e.rank,
                    step=e.step,
                    t_start=e.t_start,
                    t_end=e.t_end,
                    tokens=e.tokens,
                    incarnation=e.incarnation,
                )
            )
        elif isinstance(e, ev.Fault):
            # A rank-side fault records when it was injected; its record is written a few ms later,
            # after the lost attempt's replay interval (step start -> injection) ended.
            fault = FaultRecord(kind=e.fault, step=e.step, phase=e.phase, ranks=e.ranks, t=e.t_injected)
            raw_faults.append((fault.t, e.rank, fault))
        elif isinstance(e, ev.Recovery):
            # Laid back to back, ending when the record was written; the first collective on the
            # new group is charged to rebind.
            parts: tuple[tuple[str, float], ...] = (
                ("detection", e.detection_s),
                ("agreement", e.agreement_s),
                ("rebuild", e.rebuild_s),
                ("rebind", e.rebind_s + e.first_collective_s),
            )
            start = e.t_begin
            if e.decision == "retry":
                out.retries.append((e.rank, start, e.t))
            _lay(out, e.rank, start, parts)
        elif isinstance(e, ev.Heal):
            parts = (("replacement_start", e.replacement_start_s), ("heal_transfer", e.heal_transfer_s))
            start = e.t - e.replacement_start_s - e.heal_transfer_s
            if e.role == "survivor":  # its attempt in flight is re-run: as a retry
                out.retries.append((e.rank, start, e.t))
            if e.t_detected is not None:
                out.heal_detections.append((e.rank, min(e.t_detected, start)))
            _lay(out, e.rank, start, parts)
        elif isinstance(e, ev.Replacement):  # the parent started a replacement process for a lost rank
            out.replacement_spawns.append((e.for_rank, e.t_spawn))
        elif isinstance(e, ev.Restore):
            out.intervals.append((e.rank, e.t_start, e.t_end, "restore"))
        elif isinstance(e, ev.Checkpoint):
            out.intervals.append((e.rank, e.t_start, e.t_end, "checkpoint"))
        elif isinstance(e, ev.Restart):
            if e.t_launch is None:  # an untimed start cannot be charged
                out.skipped += 1
                continue
            # A replacement's start is part of a heal (the lost rank's process), never a relaunch.
            into = out.replacement_starts if e.replacement else out.restarts
            into.append((e.rank, e.t_launch, e.t_ready))
        elif isinstance(e, ev.Fallback):
            out.fallbacks.append(e.reason)
        # Other kinds (relaunch, snapshots, ...) do not enter goodput.
    out.faults = _merge_faults(raw_faults)
    return out


def _lay(out: ParsedEvents, rank: int, start: float, parts: Iterable[tuple[str, float]]) -> None:
    """Intervals of ``parts`` laid back to back from ``start`` (empty parts leave no interval)."""
    for label, d in parts:
        if d > 0:
            out.intervals.append((rank, start, start + d, label))
        start += d


def _merge_faults(raw: list[tuple[float, int, FaultRecord]]) -> list[FaultRecord]:
    """One fault may be recorded by several writers (each injected rank logs it); merge those.

    Records with the same (kind, step, phase) merge into one fault until a writer repeats: a second record
    from the same writer is a new fault. The merged fault's time is the earliest record's."""
    merged: list[FaultRecord] = []
    open_groups: dict[tuple[str, int | None, str | None], tuple[int, set[int]]] = {}
    for _, writer, fault in sorted(raw, key=lambda x: (x[0], x[1])):
        key = (fault.kind, fault.step, fault.phase)
        group = open_groups.get(key)
        if group is not None and writer not in group[1]:
            index, writers = group
            writers.add(writer)
            prev = merged[index]
            ranks = tuple(sorted(set(prev.ranks) | set(fault.ranks)))
            merged[index] = FaultRecord(prev.kind, prev.step, prev.phase, ranks, prev.t)
        else:
            open_groups[key] = (len(merged), {writer})
            merged.append(fault)
    return merged
