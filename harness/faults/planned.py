"""The fault kinds a run plans, and what they need from the parent: the union of their specs.

Under every schedule but ``trace`` a run injects one kind, ``fault.kind``. Under ``fault.schedule=trace``
(the preset ``fault=mixed``, ``fault.kind=mixed``) it injects the kinds of a seeded trace drawn from a
published failure mix (``harness.fleet.trace``): one planned fault per event, each of its event's kind.
The parent's set-up (namespaces, a control store in a child process, a replacement template), validation
and the strategies' own checks ask :func:`specs` here for every kind the run plans, and take the union of
what those specs need; they never look a run's kind up by ``run.fault.kind`` themselves. Torch-free.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from harness.faults import registry
from harness.faults.spec import NO_FAULT, FaultSpec
from harness.schema import ConfigError, FaultConfig, FaultSchedule, RunConfig

if TYPE_CHECKING:  # numpy and the simulator's mixes, imported only when a trace is drawn
    from harness.fleet.trace import Trace

__all__ = [
    "TRACE_KIND",
    "is_trace",
    "draw",
    "planned_kinds",
    "specs",
    "injects",
    "needs_netns",
    "describe",
    "check_trace",
]

# fault.kind under fault.schedule=trace: the kinds come from the trace, not from this name.
TRACE_KIND = "mixed"


def is_trace(fault: FaultConfig) -> bool:
    """True when the run's faults come from a trace (``fault=mixed``; its fault-free reference is not)."""
    return fault.schedule == FaultSchedule.trace and fault.kind == TRACE_KIND


@functools.lru_cache(maxsize=32)
def _draw(mix: str, steps: int, faults: float, seed: int, world_size: int) -> Trace:
    from harness.fleet.trace import draw_trace

    return draw_trace(mix, steps=steps, faults=faults, seed=seed, world_size=world_size)


def draw(fault: FaultConfig, steps: int, world_size: int) -> Trace:
    """The run's trace (``harness.fleet.trace.Trace``): ``fault.mix``, ``fault.trace_faults`` faults
    expected over ``steps`` steps, seeded by ``fault.seed``, over ``world_size`` ranks. Raises the
    trace's ``ScaleConfigError`` (one line) for a bad mix or count."""
    return _draw(str(fault.mix), int(steps), float(fault.trace_faults), int(fault.seed), int(world_size))


def planned_kinds(fault: FaultConfig, steps: int, world_size: int) -> tuple[str, ...]:
    """Every fault kind the run injects, sorted and distinct; () for the fault-free run."""
    if fault.kind == NO_FAULT:
        return ()
    if is_trace(fault):
        return tuple(sorted({e.kind for e in draw(fault, steps, world_size).events}))
    if fault.kind == TRACE_KIND:
        return ()  # fault.kind=mixed under another schedule: validation refuses it, naming the fix
    return (fault.kind,)


def specs(run: RunConfig) -> tuple[FaultSpec, ...]:
    """The specs of every kind ``run`` injects (see :func:`planned_kinds`)."""
    if is_trace(run.fault):  # only a trace's kinds depend on the run's length and world
        kinds = planned_kinds(run.fault, run.train.steps, run.cluster.world_size)
    else:
        kinds = planned_kinds(run.fault, 0, 1)
    return tuple(registry.get(k) for k in kinds)


def injects(run: RunConfig) -> bool:
    """Whether the run injects any fault at all."""
    return any(s.injects for s in specs(run))


def needs_netns(run: RunConfig) -> bool:
    """Whether any of the run's kinds needs the ranks in network namespaces (root only)."""
    return any(s.needs_netns for s in specs(run))


def describe(run: RunConfig) -> str:
    """How validation errors name the run's faults: ``fault=kill``, or the trace and the kinds it draws."""
    if is_trace(run.fault):
        kinds = ",".join(planned_kinds(run.fault, run.train.steps, run.cluster.world_size)) or "no fault"
        return f"fault=mixed (fault.mix={run.fault.mix} fault.seed={run.fault.seed}: {kinds})"
    return f"fault={run.fault.kind}"


def check_trace(run: RunConfig) -> None:
    """``fault=mixed``: the schedule is ``trace``, and the trace can be drawn (mix, fault count, steps); else a
    one-line ``ConfigError`` naming the fix (``harness.app.validate.check_names`` calls it)."""
    from harness.fleet.config import ScaleConfigError

    f = run.fault
    if f.schedule != FaultSchedule.trace:
        raise ConfigError(
            f"fault.kind={TRACE_KIND} draws its faults from a trace, and fault.schedule={f.schedule.value}; "
            "set `fault.schedule=trace` (the preset `fault=mixed` does)"
        )
    if f.kind not in (TRACE_KIND, NO_FAULT):
        raise ConfigError(
            f"fault.schedule=trace draws each fault's kind from fault.mix, and fault.kind={f.kind} names one kind; "
            f"use `fault=mixed` (fault.kind={TRACE_KIND}), or another fault.schedule for fault={f.kind}"
        )
    try:
        draw(f, run.train.steps, run.cluster.world_size)
    except ScaleConfigError as exc:
        raise ConfigError(
            f"fault=mixed: {exc}; set fault.mix / fault.trace_faults (e.g. `fault.trace_faults=10`) / train.steps"
        ) from None
