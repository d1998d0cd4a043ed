"""The kinds of event record: one frozen dataclass per kind, and ``KINDS``, the only list of them.

Each class declares its fields with the types the parser checks (``harness.events.parse``); a field's
``metadata`` says how a reader treats it (``strict``: a wrong type is an error, not None; ``nonfinite``:
NaN and inf are values). The package docstring (``harness.events``) says who writes each kind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


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
    # The tax budget's cadence (strategy.snapshot.max_tax): "every,push_every,from_step,warm_every,warm_push_every",
    # and what the rank measured and chose ({} without a budget, or before its decision step)
    cadence: str = ""
    cadence_decision: Mapping[str, Any] = field(default_factory=dict)


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
