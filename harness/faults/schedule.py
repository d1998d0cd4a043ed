"""When faults fire: a pure plan from the fault config, plus the once-per-run markers.

``plan_faults(fault, steps, checkpoint_interval)`` turns a ``FaultConfig`` into the list of
``PlannedFault`` (index, step, kind, phase, ranks) a run injects. Schedules:

- ``at_step``: one fault during step ``at_step``.
- ``at_age``: during step ``c + a + 1`` where ``c`` is a checkpoint step (saves land after steps
  ``interval-1, 2*interval-1, ...``, see ``harness.checkpoint.layout.is_due``), so exactly ``a`` steps
  have committed since the newest checkpoint and a restore-based strategy replays exactly ``a`` steps.
  ``count`` faults use the first ``count`` checkpoints that leave room before the end of the run.
- ``every``: during steps ``every, 2*every, ...`` below ``steps`` (at most ``count`` when ``count > 1``).
- ``random``: ``count`` distinct steps in ``1 .. steps-1`` drawn from ``random.Random(seed)``.
- ``trace`` (``fault=mixed``): one fault per event of the seeded trace ``harness.faults.planned.draw``
  gives (``fault.mix``, ``fault.trace_faults``, ``fault.seed``, over ``world_size`` ranks), each of its
  event's kind, at its step, on its rank, at ``fault.phase`` (every kind fires there; the default, the
  backward reduce-scatter, is inside the step for all of them).

A fault fires once per run even across cold restarts: the rank that injects it first creates
``<run_dir>/faults/fired_<index>_rank<R>`` (``O_EXCL``), and relaunched or in-process-restarted ranks
skip every fault whose marker exists (``FiredMarkers``). No torch, no torch.distributed.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.faults import planned, registry
from harness.schema import FaultConfig, FaultSchedule

FAULTS_DIR = "faults"


class ScheduleError(ValueError):
    """The fault schedule cannot be realised in this run; the message names the override to change."""


@dataclass(frozen=True)
class PlannedFault:
    index: int  # position in the plan: the key of its once-per-run marker
    step: int  # the step during which it fires (0-based)
    kind: str
    phase: str
    ranks: tuple[int, ...]
    age: int | None = None  # steps committed since the newest checkpoint when it fires (None: no checkpoints)


def checkpoint_age(step: int, interval: int) -> int | None:
    """Steps committed since the newest checkpoint when a fault hits during ``step``; None without checkpoints."""
    if interval <= 0:
        return None
    return step % interval


def _at_age_steps(age: int, count: int, steps: int, interval: int) -> list[int]:
    if interval <= 0:
        raise ScheduleError(
            "fault.schedule=at_age needs checkpoints: set checkpoint.interval > 0 (e.g. checkpoint=sync)"
        )
    if not 0 <= age < interval:
        raise ScheduleError(
            f"fault.at_age={age} must be in 0..{interval - 1} (checkpoint.interval={interval}): a newer checkpoint "
            f"would exist by then; raise checkpoint.interval above {age}"
        )
    out: list[int] = []
    c = interval - 1
    while len(out) < count:
        step = c + age + 1
        if step >= steps:
            break
        out.append(step)
        c += interval
    if len(out) < count:
        need = (interval - 1) + (count - 1) * interval + age + 2
        raise ScheduleError(
            f"fault.at_age={age} with checkpoint.interval={interval} and fault.count={count} needs at least "
            f"{need} steps; set train.steps={need} or more"
        )
    return out


def fault_steps(fault: FaultConfig, steps: int, checkpoint_interval: int, world_size: int = 1) -> list[int]:
    """The steps (sorted, distinct) during which the faults of ``fault`` fire; [] for kind none."""
    if planned.is_trace(fault):
        return [p.step for p in _trace_plan(fault, steps, checkpoint_interval, world_size)]
    if not registry.get(fault.kind).injects:
        return []
    count = max(1, int(fault.count))
    sched = fault.schedule
    if sched == FaultSchedule.at_step:
        if fault.at_step is None:
            raise ScheduleError("fault.schedule=at_step needs fault.at_step=<step>; e.g. `fault.at_step=10`")
        result = [int(fault.at_step)]
    elif sched == FaultSchedule.at_age:
        if fault.at_age is None:
            raise ScheduleError(
                "fault.schedule=at_age needs fault.at_age=<steps since the newest checkpoint>; e.g. `fault.at_age=5`"
            )
        result = _at_age_steps(int(fault.at_age), count, steps, checkpoint_interval)
    elif sched == FaultSchedule.every:
        if not fault.every or fault.every <= 0:
            raise ScheduleError("fault.schedule=every needs fault.every=<n> with n > 0; e.g. `fault.every=10`")
        result = list(range(fault.every, steps, fault.every))
        if fault.count > 1:
            result = result[:count]
    elif sched == FaultSchedule.trace:
        raise ScheduleError(
            f"fault.schedule=trace draws each fault's kind from fault.mix, and fault.kind={fault.kind} names one "
            "kind; use `fault=mixed` (fault.kind=mixed)"
        )
    elif sched == FaultSchedule.random:
        if steps < 2 or count > steps - 1:
            raise ScheduleError(f"fault.count={count} random faults need train.steps > {count}")
        result = sorted(random.Random(fault.seed).sample(range(1, steps), count))
    else:  # pragma: no cover - the enum is closed
        raise ScheduleError(f"unknown fault.schedule={sched}")
    bad = [s for s in result if not 0 <= s < steps]
    if bad:
        raise ScheduleError(
            f"fault step(s) {bad} are outside the run (train.steps={steps}); set fault.at_step < {steps}"
        )
    return sorted(set(result))


def _trace_plan(fault: FaultConfig, steps: int, checkpoint_interval: int, world_size: int) -> list[PlannedFault]:
    from harness.fleet.config import ScaleConfigError

    try:
        trace = planned.draw(fault, steps, world_size)
    except ScaleConfigError as exc:
        raise ScheduleError(f"fault.schedule=trace: {exc} (fault.trace_faults, fault.mix, train.steps)") from None
    return [
        PlannedFault(
            index=i,
            step=e.step,
            kind=e.kind,
            phase=fault.phase.value,
            ranks=(e.rank,),
            age=checkpoint_age(e.step, checkpoint_interval),
        )
        for i, e in enumerate(trace.events)
    ]


def plan_faults(fault: FaultConfig, steps: int, checkpoint_interval: int, world_size: int = 1) -> list[PlannedFault]:
    """Every fault of the run, in firing order. ``world_size``: the ranks a trace draws over
    (``fault.schedule=trace``; the other schedules strike ``fault.ranks``)."""
    if planned.is_trace(fault):
        return _trace_plan(fault, steps, checkpoint_interval, world_size)
    if fault.kind == planned.TRACE_KIND:
        raise ScheduleError(
            f"fault.kind={planned.TRACE_KIND} draws its faults from a trace: set `fault.schedule=trace` "
            "(the preset `fault=mixed` does)"
        )
    return [
        PlannedFault(
            index=i,
            step=s,
            kind=fault.kind,
            phase=fault.phase.value,
            ranks=tuple(int(r) for r in fault.ranks),
            age=checkpoint_age(s, checkpoint_interval),
        )
        for i, s in enumerate(fault_steps(fault, steps, checkpoint_interval))
    ]


def targeted_age(fault: FaultConfig, checkpoint_interval: int) -> int | None:
    """The checkpoint age the schedule aims at (for result rows); None when it has no single age."""
    if planned.is_trace(fault) or fault.kind == planned.TRACE_KIND or not registry.get(fault.kind).injects:
        return None
    if fault.schedule == FaultSchedule.at_age:
        return fault.at_age
    if fault.schedule == FaultSchedule.at_step and fault.at_step is not None:
        return checkpoint_age(int(fault.at_step), checkpoint_interval)
    return None


class FiredMarkers:
    """Once-per-run bookkeeping on disk, shared by every incarnation of every rank of one run."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(run_dir) / FAULTS_DIR

    def path(self, index: int, rank: int) -> Path:
        return self.dir / f"fired_{index}_rank{rank}"

    def fired(self, index: int, rank: int) -> bool:
        return self.path(index, rank).exists()

    def claim(self, index: int, rank: int, **info: Any) -> bool:
        """Mark fault ``index`` as fired on ``rank``; False if it already was (then do not fire it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path(index, rank), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **info}))
        return True

    def pending(self, plan: list[PlannedFault], rank: int) -> list[PlannedFault]:
        """The faults of ``plan`` this rank still has to inject."""
        return [f for f in plan if rank in f.ranks and not self.fired(f.index, rank)]
