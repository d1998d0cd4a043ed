"""Whole-run goodput and the badput breakdown: pure functions over the event log.

Input is the list of records described in ``harness/events/`` (any order, any mix of ranks, torn or
malformed records skipped and counted). Output is a frozen ``GoodputReport``. No torch, no I/O except
``load_report``, so every rule here is unit-tested in milliseconds against hand-computed timelines.

Goodput = useful tokens (each (rank, step index)'s final execution, counted once) / wall time (earliest
step start to latest step end, every incarnation included). Each rank's wall time is cut so that every
instant gets exactly one label, the highest-priority interval covering it:

    detection > agreement > rebuild > rebind > replacement_start > heal_transfer > restore > checkpoint
        > snapshot_overhead > restart > replay > useful > other

so per rank useful + badput == wall exactly, and the report (the mean over ranks) keeps it
(``check_invariant``). docs/goodput.md, "Time accounting", says where each interval comes from and which
fault each is charged to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from harness.report.goodput_records import StepRecord, parse_events

if TYPE_CHECKING:
    from harness import events as ev
import json
import os
from pathlib import Path

from harness.events import read_events
from harness.report.goodput_sweep import _FAULT_LABELS, _NO_FAULT, _PRIORITY, _rank_pieces


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
    replacement_start_s: float = 0.0  # a lost rank's replacement process starting (heal in memory)
    heal_transfer_s: float = 0.0  # the heal after it arrived: rendezvous, model build, state load
    snapshot_overhead_s: float = 0.0  # steps waiting for the previous snapshot's copy

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


def _accumulate(into: dict[str, float], label: str, seconds: float) -> None:
    into[label] = into.get(label, 0.0) + seconds


def _badput(seconds: Mapping[str, float], n: int) -> Badput:
    return Badput(**{f"{label}_s": seconds.get(label, 0.0) / n for label in _PRIORITY[:-1] + ("other",)})


def compute_goodput(events: Iterable[Mapping[str, Any] | ev.Event]) -> GoodputReport:
    """Whole-run goodput and badput breakdown from a run's events (see the module docstring)."""
    parsed = parse_events(events)
    steps_by_rank: dict[int, list[StepRecord]] = {}
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
        final: dict[int, StepRecord] = {}
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
            FaultBadput(f.kind, f.step, f.phase, f.ranks, f.t, _badput(per_fault[i], n)) for i, f in enumerate(faults)
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
# goodput.json: each run's report, computed once when the run ends and read by every table and plot.

REPORT_FILE = "goodput.json"


def report_to_dict(report: GoodputReport) -> dict[str, Any]:
    return {
        "timeline": {"t0": report.timeline.t0, "t1": report.timeline.t1},
        "tokens": report.tokens,
        "steps": report.steps,
        "n_ranks": report.n_ranks,
        "useful_s": report.useful_s,
        "badput": report.badput.as_dict(),
        "faults": [
            {
                "kind": f.kind,
                "step": f.step,
                "phase": f.phase,
                "ranks": list(f.ranks),
                "t": f.t,
                "badput": f.badput.as_dict(),
            }
            for f in report.faults
        ],
        "replayed_steps": report.replayed_steps,
        "fallbacks": list(report.fallbacks),
        "skipped": report.skipped,
        "goodput": report.goodput,  # derived; stored so a reader of the file needs no code
    }


def report_from_dict(d: Mapping[str, Any]) -> GoodputReport:
    return GoodputReport(
        timeline=Timeline(float(d["timeline"]["t0"]), float(d["timeline"]["t1"])),
        tokens=int(d["tokens"]),
        steps=int(d["steps"]),
        n_ranks=int(d["n_ranks"]),
        useful_s=float(d["useful_s"]),
        badput=Badput(**d["badput"]),
        faults=tuple(
            FaultBadput(f["kind"], f["step"], f["phase"], tuple(f["ranks"]), float(f["t"]), Badput(**f["badput"]))
            for f in d["faults"]
        ),
        replayed_steps=int(d["replayed_steps"]),
        fallbacks=tuple(d["fallbacks"]),
        skipped=int(d["skipped"]),
    )


def save_report(run_dir: str, report: GoodputReport) -> None:
    """Write ``<run_dir>/goodput.json`` atomically."""
    path = Path(run_dir) / REPORT_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report_to_dict(report), indent=1))
    os.replace(tmp, path)


def load_report(run_dir: str) -> GoodputReport:
    """The run's saved ``goodput.json``; a run without one (killed before it ended) is computed from its
    event logs and saved, so each run's events are parsed once."""
    path = Path(run_dir) / REPORT_FILE
    if path.exists():
        return report_from_dict(json.loads(path.read_text()))
    report = compute_goodput(read_events(run_dir))
    save_report(run_dir, report)
    return report


def fault_badput_parts(run_dir: str) -> dict[str, float]:
    """The badput a run's faults cost, summed over its faults, per part (``detection``, ``replay`` ...,
    without the ``_s`` suffix) in seconds."""
    parts: dict[str, float] = {}
    for fault in load_report(run_dir).faults:
        for key, seconds in fault.badput.as_dict().items():
            part = key.removesuffix("_s")
            parts[part] = parts.get(part, 0.0) + seconds
    return parts
