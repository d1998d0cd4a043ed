"""Per-rank event log: the one contract between training ranks, the parent, goodput and plots.

Every rank appends JSON lines to ``<run_dir>/events/rank<R>.jsonl`` and the parent appends its own
to ``<run_dir>/events/parent.jsonl``. Timestamps are ``time.time()`` seconds: all processes share one
host clock, so events from different processes can be put on one timeline.

Each kind of record is one frozen dataclass below. Writers call ``EventLog.emit(Step, step=..., ...)``
(the class, so a misspelt field fails where it is written); readers call :func:`load_events` (a run
directory) or :func:`parse_records` (raw records) and select with :func:`of_type`. Nothing outside
this module compares a record's ``kind`` string: this module is the only list of kinds.

Every record has ``kind``, ``t`` (when it was written, unless the writer gives it) and ``rank``
(``-1`` is the parent). Fields a writer adds beyond a class's own are kept, in ``extra``, and
written back flat: a newer writer's fields survive an older reader. A record of a kind this module
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

import json
import math
import os
import time
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

EVENTS_DIR = "events"

E = TypeVar("E", bound="Event")


class MalformedEvent(ValueError):
    """A record of a known kind that cannot be read (torn write, wrong type, impossible interval)."""


# --- the kinds -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Event:
    """Fields every record has. ``extra``: the writer's fields this class does not declare."""

    KIND: ClassVar[str] = ""
    t: float  # when the record was written (or the time the writer gave)
    rank: int  # -1: the parent
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def check(self) -> None:
        """Kind-specific rules beyond the field types; raise MalformedEvent."""

    def to_record(self) -> dict[str, Any]:
        """The flat JSON record (the inverse of :func:`parse_record`)."""
        out: dict[str, Any] = {"kind": self.KIND}
        for f in fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        out.update(self.extra)
        return json.loads(json.dumps(out))  # tuples -> lists, exactly as the file holds it


def _span_ok(ev: Event, start: str, end: str) -> None:
    if getattr(ev, end) < getattr(ev, start):
        raise MalformedEvent(f"{ev.KIND}: {end} < {start}")


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """One optimizer step that committed on this rank; training ran from ``t_start`` to ``t_end``."""

    KIND: ClassVar[str] = "step"
    step: int  # 0-based index
    t_start: float
    t_end: float
    loss: float | None = field(default=None, metadata={"nonfinite": True})  # a diverged loss is still a step
    tokens: int = 0
    incarnation: int = 0  # 0 for the first launch, +1 for every cold restart / in-process restart
    replay: bool = False  # this index had committed once and was thrown away by a rollback
    # accelpact with snapshots: seconds at the end of the step spent waiting for the snapshot's copy
    snapshot_wait_s: float | None = None

    def check(self) -> None:
        _span_ok(self, "t_start", "t_end")


@dataclass(frozen=True, kw_only=True)
class Fault(Event):
    """A fault was injected. Each injected rank that injects it itself writes one (they merge in goodput);
    a parent-side fault is written by the parent when it acted (``by``)."""

    KIND: ClassVar[str] = "fault"
    fault: str = "unknown"  # the fault kind (harness.faults.registry)
    step: int | None = None  # None: the schedule gave no step (an age- or time-based fault)
    phase: str | None = None
    ranks: tuple[int, ...] = ()
    index: int | None = None  # the schedule's fault index
    age: int | None = None  # steps committed since the newest checkpoint, when the schedule knew it
    by: str | None = None  # "rank" | "parent"
    t_inject: float | None = field(
        default=None, metadata={"strict": True}
    )  # a rank-side fault: when it was injected (the record comes a few ms later)
    outage_s: float | None = None  # an outage's length (hang, blackhole, link_down)
    link: str | None = None  # a namespace fault's link ("data" | "control")

    @property
    def t_injected(self) -> float:
        """When the fault acted: the injection time when the rank recorded one, else the record's time."""
        return self.t if self.t_inject is None else self.t_inject


@dataclass(frozen=True, kw_only=True)
class Recovery(Event):
    """One in-memory recovery (accelpact's ``RecoveryEvent``); ``t`` is when it ended (ready again).

    The durations are laid back to back, ending at ``t``: detection, agreement, rebuild, rebind and the
    first collective on the new generation."""

    KIND: ClassVar[str] = "recovery"
    decision: str | None = None  # "retry" | "roll_forward"
    decision_detail: Mapping[str, Any] = field(default_factory=dict)
    step: int | None = None
    generation: int = 0
    phase: str | None = None
    detection_s: float = 0.0
    agreement_s: float = 0.0
    rebuild_s: float = 0.0
    rebind_s: float = 0.0
    first_collective_s: float = 0.0
    total_s: float | None = None
    rounds: int = 1
    detected_by: str | None = None  # "exception" | "watchdog" | "interrupt"
    t_detected: float | None = None
    written: float | None = None  # when the record was written (after the retried step)

    def check(self) -> None:
        for name in ("detection_s", "agreement_s", "rebuild_s", "rebind_s", "first_collective_s"):
            if getattr(self, name) < 0:
                raise MalformedEvent(f"recovery: negative {name}")

    @property
    def t_begin(self) -> float:
        return self.t - self.detection_s - self.agreement_s - self.rebuild_s - self.rebind_s - self.first_collective_s


@dataclass(frozen=True, kw_only=True)
class Heal(Event):
    """One heal after a lost rank as one rank saw it (accelpact's ``HealEvent``); ``t``: when it ended.

    ``replacement_start_s`` then ``heal_transfer_s`` end at ``t`` (see ``accelpact.events.HealEvent``)."""

    KIND: ClassVar[str] = "heal"
    role: str  # "survivor" | "replacement"
    generation: int = 0
    source: str | None = None  # where the lost ranks' state came from: "own" | "buddy"
    own_source: str | None = None
    lost_ranks: tuple[int, ...] = ()
    step: int | None = None
    resume_step: int | None = None
    replayed_steps: int = 0
    replacement_start_s: float = 0.0
    heal_transfer_s: float = 0.0
    total_s: float = 0.0
    t_detected: float | None = field(default=None, metadata={"strict": True})
    rounds: int = 1
    load_s: float = 0.0
    bytes_read_from_disk: int = 0
    written: float | None = None

    def check(self) -> None:
        if self.replacement_start_s < 0 or self.heal_transfer_s < 0:
            raise MalformedEvent("heal: negative duration")


@dataclass(frozen=True, kw_only=True)
class Replacement(Event):
    """The parent started a replacement process (or took a hot spare) for dead rank ``for_rank``."""

    KIND: ClassVar[str] = "replacement"
    for_rank: int
    t_spawn: float
    replacement: int = 0  # 1 for the run's first replacement, +1 for each later one
    start: str | None = None  # "template" | "spawn" | "hot_spare"
    hot_spare: bool = False
    template_fallback: str | None = None  # why the template was not used where one was wanted
    template_import_s: float | None = None
    exit_code: int | None = None
    dead_pid: int | None = None
    pid: int | None = None
    t_death_seen: float | None = None
    incarnation: int = 0

    @property
    def how_started(self) -> str:
        return self.start or ("hot_spare" if self.hot_spare else "spawn")


@dataclass(frozen=True, kw_only=True)
class Relaunch(Event):
    """The parent relaunched every rank (the strategy's relaunch policy said why)."""

    KIND: ClassVar[str] = "relaunch"
    reason: str
    incarnation: int  # the incarnation it starts
    exit_codes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Restart(Event):
    """A process (re)start, written once the rank is ready to train: ``t_launch`` -> ``t_ready``."""

    KIND: ClassVar[str] = "restart"
    t_launch: float | None = field(
        metadata={"strict": True}
    )  # when the parent launched it (None: unknown; the start is not timed)
    t_ready: float
    incarnation: int = 0
    replacement: bool = False  # a replacement of a lost rank (part of a heal, not a relaunch)
    in_process: bool = False  # an in-process restart (NVRx)
    pid: int | None = None  # the rank's process (a rank forked from a template has the template's command line)

    def check(self) -> None:
        if self.t_launch is not None:
            _span_ok(self, "t_launch", "t_ready")


@dataclass(frozen=True, kw_only=True)
class Restore(Event):
    """A checkpoint load of step ``from_step``, from ``t_start`` to ``t_end``."""

    KIND: ClassVar[str] = "restore"
    t_start: float
    t_end: float
    from_step: int | None = None
    bytes: int | None = None

    def check(self) -> None:
        _span_ok(self, "t_start", "t_end")


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Event):
    """A checkpoint save of ``step``: training stalled from ``t_start`` to ``t_end`` (the rest of the
    measurements, ``harness.checkpoint.records.SaveRecord``, are in ``extra``)."""

    KIND: ClassVar[str] = "checkpoint"
    t_start: float
    t_end: float
    step: int | None = None
    mode: str | None = None
    bytes: int | None = None

    def check(self) -> None:
        _span_ok(self, "t_start", "t_end")


@dataclass(frozen=True, kw_only=True)
class Eval(Event):
    """An evaluation after step ``step`` committed: the mean over the ranks of a held-out batch's loss.
    An evaluation run again (after a recovery or a heal) writes one more record; the last one counts."""

    KIND: ClassVar[str] = "eval"
    step: int
    loss: float


@dataclass(frozen=True, kw_only=True)
class Fallback(Event):
    """accelpact could not recover in memory; the rank exits and the run falls back to checkpoint restore."""

    KIND: ClassVar[str] = "fallback"
    reason: str = ""
    step: int | None = None
    error: str | None = None  # the exception's type
    detected_by: str | None = None  # how a lost rank was found: "notice" | "heartbeat" | "deadline" | "heal"
    generation: int | None = None


@dataclass(frozen=True, kw_only=True)
class Snapshots(Event):
    """What accelpact's in-memory snapshots cost this rank, written once when it closes."""

    KIND: ClassVar[str] = "snapshots"
    slot_bytes: int = 0  # shared-memory bytes of one snapshot slot
    count: int = 0  # snapshots taken
    wait_s: float = 0.0  # training blocked on snapshots
    own_shm_bytes: int = 0
    replica_shm_bytes: int = 0  # the replicas this rank's host held for others
    replication: Mapping[str, Any] = field(default_factory=dict)


KINDS: dict[str, type[Event]] = {
    cls.KIND: cls
    for cls in (
        Step,
        Fault,
        Recovery,
        Heal,
        Replacement,
        Relaunch,
        Restart,
        Restore,
        Checkpoint,
        Eval,
        Fallback,
        Snapshots,
    )
}


# --- the parser ------------------------------------------------------------------------------------


def _check_value(name: str, value: Any, hint: Any, nonfinite: bool) -> Any:
    """``value`` as type ``hint`` wants it, or MalformedEvent. Only the hints used above are handled."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        [inner] = [a for a in args if a is not type(None)]
        return _check_value(name, value, inner, nonfinite)
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedEvent(f"{name}: {value!r} is not a number")
        if not nonfinite and not math.isfinite(value):
            raise MalformedEvent(f"{name}: {value!r} is not finite")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MalformedEvent(f"{name}: {value!r} is not an integer")
        return value
    if hint is bool:
        return bool(value)
    if hint is str:
        return str(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise MalformedEvent(f"{name}: {value!r} is not a list")
        try:
            return tuple(int(v) for v in value)
        except (TypeError, ValueError) as exc:
            raise MalformedEvent(f"{name}: {value!r} is not a list of integers") from exc
    if origin is typing.get_origin(Mapping[str, Any]) or hint is Mapping:
        if not isinstance(value, Mapping):
            raise MalformedEvent(f"{name}: {value!r} is not a mapping")
        return dict(value)
    raise TypeError(f"harness.events: no rule for field {name}: {hint!r}")  # a bug in this module


_HINTS: dict[type[Event], dict[str, Any]] = {}


def _hints(cls: type[Event]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def parse_record(record: Mapping[str, Any]) -> Event | None:
    """The typed event of one raw record; None for a kind this module does not know.

    Raises MalformedEvent for a record without a kind, or a known kind that cannot be read. An optional
    field of the wrong type reads as None (unless marked ``strict``: its readers need it right), and a
    field written as null reads as its default."""
    if not isinstance(record, Mapping) or "kind" not in record:
        raise MalformedEvent("a record without a kind")
    cls = KINDS.get(record["kind"]) if isinstance(record["kind"], str) else None
    if cls is None:
        return None
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "extra" or f.name not in record:
            continue  # a default, or (a required field) the TypeError below
        value, hint = record[f.name], hints[f.name]
        optional = type(None) in typing.get_args(hint)
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if value is None and not optional and has_default:
            continue  # written as null: its default (a duration of None is 0)
        try:
            values[f.name] = _check_value(f.name, value, hint, f.metadata.get("nonfinite", False))
        except MalformedEvent:
            # An optional field of the wrong type reads as None, unless the readers need it to be right.
            if not optional or f.metadata.get("strict"):
                raise
            values[f.name] = None
    values["extra"] = {k: v for k, v in record.items() if k != "kind" and not _declared(cls, k)}
    try:
        event = cls(**values)
    except TypeError as exc:  # a required field is missing
        raise MalformedEvent(f"{cls.KIND}: {exc}") from exc
    event.check()
    return event


def _declared(cls: type[Event], name: str) -> bool:
    return name in _hints(cls) and name != "extra"


@dataclass
class ParsedLog:
    """The typed events of a log, in the records' order, and how many known-kind records were unreadable."""

    events: list[Event] = field(default_factory=list)
    skipped: int = 0


def parse_records(records: Iterable[Mapping[str, Any] | Event]) -> ParsedLog:
    """Type every record (an Event passes through); torn or malformed ones are counted, unknown kinds dropped."""
    out = ParsedLog()
    for record in records:
        if isinstance(record, Event):
            out.events.append(record)
            continue
        try:
            event = parse_record(record)
        except MalformedEvent:
            out.skipped += 1
            continue
        if event is not None:
            out.events.append(event)
    return out


def typed(records: Iterable[Mapping[str, Any] | Event]) -> list[Event]:
    """The readable typed events of ``records`` (raw records or events), malformed ones dropped."""
    return parse_records(records).events


def of_type(events: Iterable[Event], cls: type[E]) -> list[E]:
    """The events of one kind, in order."""
    return [e for e in events if isinstance(e, cls)]


# --- files -----------------------------------------------------------------------------------------


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
