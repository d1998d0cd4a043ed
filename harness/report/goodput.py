"""Whole-run goodput and the badput breakdown: pure functions over the event log.

Input is the list of records described in ``harness/events.py`` (any order, any mix of ranks, torn or
malformed records skipped and counted). Output is a frozen ``GoodputReport``. No torch, no I/O except
``load_report``, so every rule here is unit-tested in milliseconds against hand-computed timelines.

Definitions
-----------
- Wall time: from the earliest ``step.t_start`` to the latest ``step.t_end`` over every rank and every
  incarnation (cold restarts and in-process restarts included).
- Useful tokens: for each (rank, step index) the tokens of its FINAL execution, counted once; summed over
  ranks. A step that committed, was rolled back and replayed is counted once.
- Goodput = useful tokens / wall time (tokens per second).

Time accounting (the invariant)
-------------------------------
Each rank's copy of the wall-clock window [t0, t1] is cut into labelled pieces; every instant gets exactly
one label, the highest-priority interval covering it on that rank:

    detection > agreement > rebuild > rebind > restore > checkpoint > restart > replay > useful > other

- detection/agreement/rebuild/rebind: a ``recovery`` record's durations, laid back to back so they END at
  the record's ``t`` (the record is written when recovery completes). ``rebind`` includes the first
  collective on the new group. Recovery outranks steps because a step record's interval may include the
  failed attempt and the in-memory recovery inside it.
- restore: ``restore`` records, t_start -> t_end.
- checkpoint: ``checkpoint`` records (stalls), whole run.
- restart: ``restart`` records, from the fault that preceded the relaunch (not earlier than the rank's last
  committed step) to ``t_ready``; so the gap fault -> relaunch is restart time too.
- replay: the second and later executions of a (rank, step index). The first execution is the useful one
  (its work was done once; redoing it is the waste), so a replay is charged to the fault that caused it.
  Also, inside a step that an in-memory recovery with decision "retry" re-ran, the attempt thrown away:
  step start -> recovery start. (A "roll_forward" recovery loses no work.)
- useful: first executions of each (rank, step index), minus anything above that overlaps them.
- other: whatever no record covers (inter-step gaps, the in-flight step a fault destroyed, ...).

Per rank, useful + sum(badput parts) == wall exactly; the run's figures are the mean over ranks, so
``report.useful_s + report.badput.total_s == report.timeline.wall_s`` (``check_invariant``).

Per fault: every labelled interval except checkpoint/useful is charged to the latest fault at or before the
interval's end. ``other`` is charged to a fault only inside its span on that rank: from the end of the
rank's last step before the fault (the lost in-flight step) to the start of the rank's next first-time step
after it. What no fault claims stays in the run total only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

# Labels from highest to lowest priority; "other" is the implicit bottom.
_PRIORITY: tuple[str, ...] = (
    "detection",
    "agreement",
    "rebuild",
    "rebind",
    "restore",
    "checkpoint",
    "restart",
    "replay",
    "useful",
)
_RANK_OF = {label: i for i, label in enumerate(_PRIORITY)}
# Labels that a fault can be blamed for (checkpoint stalls are a whole-run cost, useful is not a cost).
_FAULT_LABELS = frozenset(("detection", "agreement", "rebuild", "rebind", "restore", "restart", "replay"))
_NO_FAULT = -1


@dataclass(frozen=True)
class Timeline:
    """The window goodput is measured over: first step start to last step end."""

    t0: float
    t1: float

    @property
    def wall_s(self) -> float:
        return self.t1 - self.t0


@dataclass(frozen=True)
class Badput:
    """Seconds of wall time not spent on useful steps, by cause (mean over ranks)."""

    detection_s: float = 0.0
    agreement_s: float = 0.0
    rebuild_s: float = 0.0
    rebind_s: float = 0.0
    restart_s: float = 0.0
    restore_s: float = 0.0
    replay_s: float = 0.0
    checkpoint_s: float = 0.0
    other_s: float = 0.0

    @property
    def recovery_s(self) -> float:
        """In-memory recovery: detection + agreement + rebuild + rebind (with first collective)."""
        return self.detection_s + self.agreement_s + self.rebuild_s + self.rebind_s

    @property
    def total_s(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class FaultBadput:
    """One injected fault and the badput charged to it (mean over ranks; checkpoint_s is always 0)."""

    kind: str
    step: int | None
    phase: str | None
    ranks: tuple[int, ...]
    t: float
    badput: Badput


@dataclass(frozen=True)
class GoodputReport:
    timeline: Timeline
    tokens: int  # useful tokens, summed over ranks
    steps: int  # distinct step indices that committed
    n_ranks: int
    useful_s: float  # mean over ranks
    badput: Badput  # whole run, mean over ranks
    faults: tuple[FaultBadput, ...] = ()
    replayed_steps: int = 0  # re-executions on the rank that replayed most
    fallbacks: tuple[str, ...] = ()  # reasons accelpact fell back to checkpoint restore
    skipped: int = 0  # malformed records ignored

    @property
    def goodput(self) -> float:
        """Useful tokens per second of wall time; 0.0 when there is no wall time (no or instant steps)."""
        wall = self.timeline.wall_s
        return self.tokens / wall if wall > 0 else 0.0


# --------------------------------------------------------------------------------------------------
# Parsing: tolerant of torn, partial and unsorted logs.


@dataclass(frozen=True)
class _Step:
    rank: int
    step: int
    t_start: float
    t_end: float
    tokens: int
    incarnation: int


@dataclass(frozen=True)
class _Fault:
    kind: str
    step: int | None
    phase: str | None
    ranks: tuple[int, ...]
    t: float


@dataclass
class _Parsed:
    steps: list[_Step] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    # (rank, start, end, label) for labels other than useful/replay/restart
    intervals: list[tuple[int, float, float, str]] = field(default_factory=list)
    restarts: list[tuple[int, float, float]] = field(default_factory=list)  # rank, t_launch, t_ready
    retries: list[tuple[int, float]] = field(default_factory=list)  # rank, start of a "retry" recovery
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


def _parse(events: Iterable[Mapping[str, Any]]) -> _Parsed:
    out = _Parsed()
    raw_faults: list[tuple[float, int, _Fault]] = []
    for record in events:
        try:
            kind = record["kind"]
            rank = _int(record, "rank")
            if kind == "step":
                t_start, t_end = _span(record, "t_start", "t_end")
                out.steps.append(
                    _Step(
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
                fault = _Fault(
                    kind=str(record.get("fault", "unknown")),
                    step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                    phase=None if record.get("phase") is None else str(record["phase"]),
                    ranks=tuple(int(r) for r in ranks),
                    t=_num(record, "t"),
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
                    out.retries.append((rank, start))
                for label, d in durations:
                    if d > 0:
                        out.intervals.append((rank, start, start + d, label))
                    start += d
            elif kind == "restore":
                out.intervals.append((rank, *_span(record, "t_start", "t_end"), "restore"))
            elif kind == "checkpoint":
                out.intervals.append((rank, *_span(record, "t_start", "t_end"), "checkpoint"))
            elif kind == "restart":
                out.restarts.append((rank, *_span(record, "t_launch", "t_ready")))
            elif kind == "fallback":
                out.fallbacks.append(str(record.get("reason", "")))
            # Unknown kinds are someone else's records: ignored, not "skipped".
        except (KeyError, TypeError, ValueError):
            out.skipped += 1
    out.faults = _merge_faults(raw_faults)
    return out


def _merge_faults(raw: list[tuple[float, int, _Fault]]) -> list[_Fault]:
    """One fault may be recorded by several writers (each injected rank logs it); merge those.

    Records with the same (kind, step, phase) merge into one fault until a writer repeats: a second record
    from the same writer is a new fault. The merged fault's time is the earliest record's."""
    merged: list[_Fault] = []
    open_groups: dict[tuple[str, int | None, str | None], tuple[int, set[int]]] = {}
    for _, writer, fault in sorted(raw, key=lambda x: (x[0], x[1])):
        key = (fault.kind, fault.step, fault.phase)
        group = open_groups.get(key)
        if group is not None and writer not in group[1]:
            index, writers = group
            writers.add(writer)
            prev = merged[index]
            ranks = tuple(sorted(set(prev.ranks) | set(fault.ranks)))
            merged[index] = _Fault(prev.kind, prev.step, prev.phase, ranks, prev.t)
        else:
            open_groups[key] = (len(merged), {writer})
            merged.append(fault)
    return merged


# --------------------------------------------------------------------------------------------------
# The sweep.


def _sweep(
    intervals: list[tuple[float, float, str, int]], t0: float, t1: float
) -> list[tuple[float, float, str, int]]:
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
    rank: int, parsed: _Parsed, steps: list[_Step], timeline: Timeline, fault_times: list[float]
) -> tuple[list[tuple[float, float, str, int]], list[tuple[float, float]], int]:
    """This rank's labelled pieces, the span of each fault on this rank, and its number of replays."""
    intervals: list[tuple[float, float, str, int]] = []
    first_runs: list[_Step] = []
    replays = 0
    by_index: dict[int, list[_Step]] = {}
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
            fault = _NO_FAULT if label == "checkpoint" else _fault_before(fault_times, end)
            intervals.append((start, end, label, fault))

    # A "retry" recovery inside a step threw away the attempt in flight: from the step's start to the
    # recovery's start the work was done again, so it is replay, not useful. ("roll_forward" keeps it.)
    for r, rec_start in parsed.retries:
        if r != rank:
            continue
        for s in first_runs:
            if s.t_start < rec_start < s.t_end:
                intervals.append((s.t_start, rec_start, "replay", _fault_before(fault_times, rec_start)))

    ends = sorted(s.t_end for s in steps)
    for r, t_launch, t_ready in parsed.restarts:
        if r != rank:
            continue
        start = t_launch
        cause = _fault_before(fault_times, t_launch)
        if cause != _NO_FAULT:
            # The gap from the fault to the relaunch is restart time, but never reach back before this
            # rank's last committed step (that step was useful).
            last_end = max((e for e in ends if e <= t_launch), default=-math.inf)
            start = max(fault_times[cause], last_end)
        intervals.append((start, t_ready, "restart", _fault_before(fault_times, t_ready)))

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


def _accumulate(into: dict[str, float], label: str, seconds: float) -> None:
    into[label] = into.get(label, 0.0) + seconds


def _badput(seconds: Mapping[str, float], n: int) -> Badput:
    return Badput(**{f"{label}_s": seconds.get(label, 0.0) / n for label in _PRIORITY[:-1] + ("other",)})


def compute_goodput(events: Iterable[Mapping[str, Any]]) -> GoodputReport:
    """Whole-run goodput and badput breakdown from a run's events (see the module docstring)."""
    parsed = _parse(events)
    steps_by_rank: dict[int, list[_Step]] = {}
    for s in parsed.steps:
        steps_by_rank.setdefault(s.rank, []).append(s)
    faults = sorted(parsed.faults, key=lambda f: f.t)
    if not parsed.steps:
        return GoodputReport(
            timeline=Timeline(0.0, 0.0),
            tokens=0,
            steps=0,
            n_ranks=0,
            useful_s=0.0,
            badput=Badput(),
            faults=tuple(FaultBadput(f.kind, f.step, f.phase, f.ranks, f.t, Badput()) for f in faults),
            fallbacks=tuple(parsed.fallbacks),
            skipped=parsed.skipped,
        )

    timeline = Timeline(min(s.t_start for s in parsed.steps), max(s.t_end for s in parsed.steps))
    fault_times = [f.t for f in faults]
    totals: dict[str, float] = {}
    per_fault: list[dict[str, float]] = [{} for _ in faults]
    tokens = 0
    replayed = 0
    for rank, steps in steps_by_rank.items():
        # Tokens of each step index's final execution, counted once.
        final: dict[int, _Step] = {}
        for s in steps:
            best = final.get(s.step)
            if best is None or (s.incarnation, s.t_start) > (best.incarnation, best.t_start):
                final[s.step] = s
        tokens += sum(s.tokens for s in final.values())

        pieces, spans, replays = _rank_pieces(rank, parsed, steps, timeline, fault_times)
        replayed = max(replayed, replays)
        for start, end, label, fault in pieces:
            seconds = end - start
            _accumulate(totals, label, seconds)
            if label in _FAULT_LABELS and fault != _NO_FAULT:
                _accumulate(per_fault[fault], label, seconds)
            elif label == "other":
                # Charge the part of this gap inside a fault's span to that fault.
                for i, (lo, hi) in enumerate(spans):
                    overlap = min(end, hi) - max(start, lo)
                    if overlap > 0:
                        _accumulate(per_fault[i], "other", overlap)

    n = len(steps_by_rank)
    return GoodputReport(
        timeline=timeline,
        tokens=tokens,
        steps=len({s.step for s in parsed.steps}),
        n_ranks=n,
        useful_s=totals.get("useful", 0.0) / n,
        badput=_badput(totals, n),
        faults=tuple(
            FaultBadput(f.kind, f.step, f.phase, f.ranks, f.t, _badput(per_fault[i], n))
            for i, f in enumerate(faults)
        ),
        replayed_steps=replayed,
        fallbacks=tuple(parsed.fallbacks),
        skipped=parsed.skipped,
    )


def check_invariant(report: GoodputReport, tol: float = 1e-9) -> None:
    """Raise AssertionError unless useful + every badput part == wall time (and no part is negative)."""
    parts = report.badput.as_dict()
    negative = {k: v for k, v in parts.items() if v < -tol}
    if negative:
        raise AssertionError(f"negative badput parts: {negative}")
    gap = report.useful_s + report.badput.total_s - report.timeline.wall_s
    if abs(gap) > tol * max(1.0, report.timeline.wall_s):
        raise AssertionError(
            f"useful {report.useful_s} + badput {report.badput.total_s} != wall {report.timeline.wall_s}"
        )


def goodput_ratio(run: GoodputReport, reference: GoodputReport) -> float:
    """This run's goodput over the fault-free reference's (same sweep); NaN if the reference has none."""
    return run.goodput / reference.goodput if reference.goodput > 0 else math.nan


# --------------------------------------------------------------------------------------------------
# The comparison table.

REFERENCE_STRATEGY = "none"
ACCELPACT_STRATEGY = "accelpact"
_STRATEGY_ORDER = {"none": 0, "accelpact": 1, "cold_restart": 2, "checkpoint_restore": 3}
BREAKDOWN_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Badput))
TABLE_COLUMNS: tuple[str, ...] = (
    "strategy",
    "age",
    "fault",
    "goodput",
    "ratio_to_reference",
    "accelpact_gain",
    "wall_s",
    "tokens",
    "faults",
    "replayed_steps",
    *BREAKDOWN_COLUMNS,
    "fallback",
    "bit_identical",
)


@dataclass(frozen=True)
class RunSummary:
    """What the comparison table needs from one run."""

    strategy: str
    report: GoodputReport
    age: int | None = None  # checkpoint age the fault schedule targeted
    fault: str | None = None  # fault kind of the schedule, None for the reference
    bit_identical: bool | None = None  # final state equal to the fault-free reference's; None = not checked


def _find(runs: Sequence[RunSummary], strategy: str, age: int | None, fault: str | None) -> RunSummary | None:
    """The run of ``strategy`` that matches ``age`` (and ``fault`` where both have one), else any of it."""
    same = [r for r in runs if r.strategy == strategy]
    for pick in (
        lambda r: r.age == age and (r.fault is None or fault is None or r.fault == fault),
        lambda r: r.age is None,
        lambda r: True,
    ):
        hits = [r for r in same if pick(r)]
        if hits:
            return hits[0]
    return None


def comparison_table(runs: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """One row per run, columns ``TABLE_COLUMNS``, sorted by age then strategy.

    - ``ratio_to_reference``: goodput / the fault-free ("none") run's goodput at the same age (else any
      reference in the list); NaN when the list has no reference.
    - ``accelpact_gain``: the AccelPact run's goodput (same age and fault) / this row's goodput. This is the
      paper's figure: 1.197x on the cold_restart row at age 5. NaN when there is no AccelPact run.
    - breakdown columns: whole-run badput in seconds (mean over ranks), summing to wall_s minus useful time.
    - ``fallback``: "; "-joined reasons accelpact fell back to checkpoint restore ("" when it did not).
    """
    rows: list[dict[str, Any]] = []
    for run in runs:
        ref = _find(runs, REFERENCE_STRATEGY, run.age, run.fault)
        ours = _find(runs, ACCELPACT_STRATEGY, run.age, run.fault)
        rep = run.report
        row: dict[str, Any] = {
            "strategy": run.strategy,
            "age": run.age,
            "fault": run.fault,
            "goodput": rep.goodput,
            "ratio_to_reference": goodput_ratio(rep, ref.report) if ref else math.nan,
            "accelpact_gain": (
                ours.report.goodput / rep.goodput if ours is not None and rep.goodput > 0 else math.nan
            ),
            "wall_s": rep.timeline.wall_s,
            "tokens": rep.tokens,
            "faults": len(rep.faults),
            "replayed_steps": rep.replayed_steps,
            **rep.badput.as_dict(),
            "fallback": "; ".join(rep.fallbacks),
            "bit_identical": run.bit_identical,
        }
        rows.append(row)
    rows.sort(
        key=lambda r: (
            r["age"] is None,
            r["age"] if r["age"] is not None else 0,
            _STRATEGY_ORDER.get(r["strategy"], len(_STRATEGY_ORDER)),
            r["strategy"],
        )
    )
    return rows


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text rendering of ``comparison_table`` rows (what ``python -m harness`` prints)."""
    columns = list(columns or TABLE_COLUMNS)

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            if math.isnan(value):
                return "-"
            return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
        return str(value) if value != "" else "-"

    body = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in body)
    return "\n".join(lines)


def load_report(run_dir: str) -> GoodputReport:
    """Read a run directory's event logs (``harness.events``) and compute its report."""
    from harness.events import read_events  # the only I/O in this module

    return compute_goodput(read_events(run_dir))
