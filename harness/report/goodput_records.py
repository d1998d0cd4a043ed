"""Parsing of the event records that goodput accounting reads, tolerant of torn, partial and unsorted logs.

Turns the raw records of ``harness.events`` (every rank, every incarnation) into steps, faults and the
labelled intervals ``harness.report.goodput`` sweeps over. Malformed records are skipped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

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


def _num(record: Mapping[str, Any], key: str) -> float:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(key)
    return float(value)


def _int(record: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(key)
    return value


def _span(record: Mapping[str, Any], start: str, end: str) -> tuple[float, float]:
    a, b = _num(record, start), _num(record, end)
    if b < a:
        raise ValueError(f"{end} < {start}")
    return a, b


def parse_events(events: Iterable[Mapping[str, Any]]) -> ParsedEvents:
    out = ParsedEvents()
    raw_faults: list[tuple[float, int, FaultRecord]] = []
    for record in events:
        try:
            kind = record["kind"]
            rank = _int(record, "rank")
            if kind == "step":
                t_start, t_end = _span(record, "t_start", "t_end")
                wait = record.get("snapshot_wait_s")
                if isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0 < wait <= t_end - t_start:
                    out.intervals.append((rank, t_end - wait, t_end, "snapshot_overhead"))
                out.steps.append(
                    StepRecord(
                        rank=rank,
                        step=_int(record, "step"),
                        t_start=t_start,
                        t_end=t_end,
                        tokens=_int(record, "tokens", 0),
                        incarnation=_int(record, "incarnation", 0),
                    )
                )
            elif kind == "fault":
                ranks = record.get("ranks") or ()
                step = record.get("step")
                fault = FaultRecord(
                    kind=str(record.get("fault", "unknown")),
                    step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                    phase=None if record.get("phase") is None else str(record["phase"]),
                    ranks=tuple(int(r) for r in ranks),
                    # A rank-side fault records when it was injected; its record is written a few ms
                    # later, after the lost attempt's replay interval (step start -> injection) ended.
                    t=_num(record, "t_inject") if "t_inject" in record else _num(record, "t"),
                )
                raw_faults.append((fault.t, rank, fault))
            elif kind == "recovery":
                end = _num(record, "t")
                # Laid back to back, ending when the record was written; the first collective on the
                # new group is charged to rebind.
                parts = (
                    ("detection", record.get("detection_s", 0.0)),
                    ("agreement", record.get("agreement_s", 0.0)),
                    ("rebuild", record.get("rebuild_s", 0.0)),
                    ("rebind", (record.get("rebind_s") or 0.0) + (record.get("first_collective_s") or 0.0)),
                )
                durations = [(label, float(d or 0.0)) for label, d in parts]
                if any(d < 0 or not math.isfinite(d) for _, d in durations):
                    raise ValueError("negative duration")
                start = end - sum(d for _, d in durations)
                if record.get("decision") == "retry":
                    out.retries.append((rank, start, end))
                for label, d in durations:
                    if d > 0:
                        out.intervals.append((rank, start, start + d, label))
                    start += d
            elif kind == "heal":
                end = _num(record, "t")
                parts = [("replacement_start", float(record.get("replacement_start_s") or 0.0)),
                         ("heal_transfer", float(record.get("heal_transfer_s") or 0.0))]
                if any(d < 0 or not math.isfinite(d) for _, d in parts):
                    raise ValueError("negative duration")
                start = end - sum(d for _, d in parts)
                if record.get("role") == "survivor":  # its attempt in flight is re-run: as a retry
                    out.retries.append((rank, start, end))
                if "t_detected" in record:
                    out.heal_detections.append((rank, min(_num(record, "t_detected"), start)))
                for label, d in parts:
                    if d > 0:
                        out.intervals.append((rank, start, start + d, label))
                    start += d
            elif kind == "replacement":  # the parent started a replacement process for a lost rank
                out.replacement_spawns.append((_int(record, "for_rank"), _num(record, "t_spawn")))
            elif kind == "restore":
                out.intervals.append((rank, *_span(record, "t_start", "t_end"), "restore"))
            elif kind == "checkpoint":
                out.intervals.append((rank, *_span(record, "t_start", "t_end"), "checkpoint"))
            elif kind == "restart":
                # A replacement's start is part of a heal (the lost rank's process), never a relaunch.
                into = out.replacement_starts if record.get("replacement") else out.restarts
                into.append((rank, *_span(record, "t_launch", "t_ready")))
            elif kind == "fallback":
                out.fallbacks.append(str(record.get("reason", "")))
            # Unknown kinds are someone else's records: ignored, not "skipped".
        except (KeyError, TypeError, ValueError):
            out.skipped += 1
    out.faults = _merge_faults(raw_faults)
    return out


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


