"""The sweep of goodput accounting: each rank's labelled intervals, cut into pieces by label priority.

Pure functions over parsed events (harness.report.goodput_records); harness.report.goodput turns the
pieces into the report and documents what each label means. ``timeline`` is a goodput ``Timeline``
(anything with ``t0`` and ``t1``).
"""

from __future__ import annotations

import math
from typing import Any

from harness.report.goodput_records import ParsedEvents, StepRecord

# Labels from highest to lowest priority; "other" is the implicit bottom.
_PRIORITY: tuple[str, ...] = (
    "detection",
    "agreement",
    "rebuild",
    "rebind",
    "replacement_start",
    "heal_transfer",
    "restore",
    "checkpoint",
    "snapshot_overhead",
    "restart",
    "replay",
    "useful",
)
_RANK_OF = {label: i for i, label in enumerate(_PRIORITY)}
# Labels that a fault can be blamed for (checkpoint stalls are a whole-run cost, useful is not a cost).
_FAULT_LABELS = frozenset(
    (
        "detection",
        "agreement",
        "rebuild",
        "rebind",
        "replacement_start",
        "heal_transfer",
        "restore",
        "restart",
        "replay",
    )
)
_NO_FAULT = -1


def _sweep(intervals: list[tuple[float, float, str, int]], t0: float, t1: float) -> list[tuple[float, float, str, int]]:
    """Cut [t0, t1] into pieces, each labelled by the highest-priority interval covering it.

    ``intervals`` are (start, end, label, fault_index). Returns (start, end, label, fault_index) pieces
    covering [t0, t1] exactly, with label "other" (fault -1) where nothing covers."""
    points: list[tuple[float, int, str, int]] = []
    for start, end, label, fault in intervals:
        start, end = max(start, t0), min(end, t1)
        if end > start:
            points.append((start, 1, label, fault))
            points.append((end, -1, label, fault))
    points.sort(key=lambda p: p[0])
    active: dict[tuple[str, int], int] = {}
    pieces: list[tuple[float, float, str, int]] = []
    cursor = t0
    i = 0
    while True:
        nxt = points[i][0] if i < len(points) else t1
        if nxt > cursor:
            live = [key for key, n in active.items() if n > 0]
            if live:
                # Highest-priority label; for ties the latest fault claims it.
                label, fault = min(live, key=lambda k: (_RANK_OF[k[0]], -k[1]))
            else:
                label, fault = "other", _NO_FAULT
            pieces.append((cursor, nxt, label, fault))
            cursor = nxt
        if i >= len(points):
            break
        while i < len(points) and points[i][0] == nxt:
            _, delta, label, fault = points[i]
            active[(label, fault)] = active.get((label, fault), 0) + delta
            i += 1
    return pieces


def _fault_before(fault_times: list[float], t: float) -> int:
    """Index of the latest fault at or before ``t``; -1 if none."""
    index = _NO_FAULT
    for i, ft in enumerate(fault_times):
        if ft <= t:
            index = i
        else:
            break
    return index


def _rank_pieces(
    rank: int, parsed: ParsedEvents, steps: list[StepRecord], timeline: Any, fault_times: list[float]
) -> tuple[list[tuple[float, float, str, int]], list[tuple[float, float]], int]:
    """This rank's labelled pieces, the span of each fault on this rank, and its number of replays."""
    intervals: list[tuple[float, float, str, int]] = []
    first_runs: list[StepRecord] = []
    replays = 0
    by_index: dict[int, list[StepRecord]] = {}
    for s in steps:
        by_index.setdefault(s.step, []).append(s)
    for runs in by_index.values():
        runs.sort(key=lambda s: (s.incarnation, s.t_start))
        first_runs.append(runs[0])
        intervals.append((runs[0].t_start, runs[0].t_end, "useful", _NO_FAULT))
        for again in runs[1:]:
            replays += 1
            intervals.append((again.t_start, again.t_end, "replay", _fault_before(fault_times, again.t_end)))

    for r, start, end, label in parsed.intervals:
        if r == rank:
            fault = _NO_FAULT if label in ("checkpoint", "snapshot_overhead") else _fault_before(fault_times, end)
            intervals.append((start, end, label, fault))

    # A "retry" recovery inside a step threw away the attempt in flight: from the step's start to the
    # recovery's start the work was done again, so it is replay, not useful. ("roll_forward" keeps it.)
    # Charged to the fault that caused the recovery (the latest before its end): the recovery starts at
    # the injection, the very instant of the fault's time, where rounding may put it a hair before.
    for r, rec_start, rec_end in parsed.retries:
        if r != rank:
            continue
        for s in first_runs:
            if s.t_start < rec_start < s.t_end:
                intervals.append((s.t_start, rec_start, "replay", _fault_before(fault_times, rec_end)))

    ends = sorted(s.t_end for s in steps)
    # A heal's detection: the fault -> this rank learned of the loss (else it fell into replay / restart).
    # Detection ends at the first replacement the launcher spawned for this rank; from there to this
    # heal's start, earlier replacements lost on their way in: replacement_start.
    for r, t_detected in parsed.heal_detections:
        cause = _fault_before(fault_times, t_detected)
        if r != rank or cause == _NO_FAULT:
            continue
        start = _since_fault(fault_times[cause], ends, t_detected)
        seen = min([t for q, t in parsed.replacement_spawns if q == rank and start <= t < t_detected] + [t_detected])
        intervals.append((start, seen, "detection", cause))
        intervals.append((seen, t_detected, "replacement_start", cause))
    # A relaunch is restart; a replacement's start is a heal: its tail after the heal record is heal_transfer.
    for label, records in (("restart", parsed.restarts), ("heal_transfer", parsed.replacement_starts)):
        for r, t_launch, t_ready in records:
            if r != rank:
                continue
            start = t_launch
            cause = _fault_before(fault_times, t_launch)
            if cause != _NO_FAULT:
                # The gap from the fault to the relaunch is restart time, but never reach back before
                # this rank's last committed step (that step was useful).
                start = _since_fault(fault_times[cause], ends, t_launch)
            intervals.append((start, t_ready, label, _fault_before(fault_times, t_ready)))

    pieces = _sweep(intervals, timeline.t0, timeline.t1)

    # Spans for charging "other" to a fault: last step end before the fault -> next first-time step start.
    starts = sorted(s.t_start for s in first_runs)
    spans: list[tuple[float, float]] = []
    floor = timeline.t0
    for i, ft in enumerate(fault_times):
        nxt_fault = fault_times[i + 1] if i + 1 < len(fault_times) else timeline.t1
        lo = max(floor, max((e for e in ends if e <= ft), default=timeline.t0))
        hi = min(nxt_fault, min((s for s in starts if s >= ft), default=timeline.t1))
        hi = max(hi, lo)
        spans.append((lo, hi))
        floor = max(floor, hi)
    return pieces, spans, replays


def _since_fault(t_fault: float, ends: list[float], t: float) -> float:
    """The fault's time, or the end of this rank's last step before ``t`` if later (that step was useful)."""
    return max(t_fault, max((e for e in ends if e <= t), default=-math.inf))
