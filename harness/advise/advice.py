"""The advice as data: per strategy its settings, tax and ETTR with its interval; the command line prints it,
and a long harness run (a seeded fault trace) takes its settings from it.

``advise(cluster, mix, platform)`` is what ``python -m harness.advise`` computes. ``advise_for_trace(trace,
step_s, state_bytes, checkpoint_write_s)`` gives the settings for a run of this harness under a trace from
``harness.fleet.trace`` (``world_size`` ranks, the trace's compressed rate of p faults per step, the
``cpu_here`` cost model): each strategy's disk interval in steps and the heal's cadence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.advise.cadence import Choice, choose, heal_outcomes, job_rates
from harness.advise.calibration import load, platform_from
from harness.advise.cost import CPU_HERE, Cadence, Platform
from harness.fleet.config import CLASSES, ROLLBACK_CHECKPOINT, Cluster, FailureClass
from harness.fleet.mixes import named_mix, unexpected_classes
from harness.scale import analytic
from harness.scale.outcomes import DESIGN_BUILDS, outcome_table
from harness.scale.project import Projection, project
from harness.strategies import simulated
from harness.strategies.spec import resolve

if TYPE_CHECKING:
    from harness.fleet.trace import Trace

__all__ = [
    "AdviceRow",
    "Advice",
    "advise",
    "heal_plan",
    "protection_plan",
    "default_strategies",
    "TraceAdviceRow",
    "advise_for_trace",
]


@dataclass(frozen=True)
class AdviceRow:
    strategy: str
    checkpoint_interval_s: float  # work between disk checkpoints (inf: never)
    checkpoint_every_steps: int | None  # the same in steps (None: never)
    cadence: Cadence | None  # AccelPact's heal only
    tax: float  # per-step protection, fraction of the step
    projection: Projection


@dataclass(frozen=True)
class Advice:
    cluster: Cluster
    rows: tuple[AdviceRow, ...]
    choices: Mapping[str, Choice]
    taxes: Mapping[str, float]

    @property
    def projections(self) -> list[Projection]:
        return [r.projection for r in self.rows]

    def row(self, strategy: str) -> AdviceRow:
        return next(r for r in self.rows if r.strategy == strategy)


def default_strategies() -> tuple[str, ...]:
    """Every strategy the simulator models that is built (no design rows) and is not the fault-free reference."""
    return tuple(n for n, s in simulated().items() if not s.fault_free and s.build not in DESIGN_BUILDS)


def protection_plan(
    cluster: Cluster, mix: Mapping[str, FailureClass], platform: Platform, strategies: Sequence[str]
) -> tuple[dict[str, Choice], dict, dict[str, float]]:
    """``heal_plan``, plus each strategy's fixed per-step protection (its ``Simulation.per_step_tax``: torchft's
    quorum, GEMINI's capture): every per-step cost the projection charges."""
    choices, rows, taxes = heal_plan(cluster, mix, platform, strategies)
    sims = simulated()
    for s in strategies:
        ref = sims[s].per_step_tax
        if ref is not None and s not in taxes:
            taxes[s] = float(resolve(ref)(cluster, platform))
    return choices, rows, taxes


def heal_plan(
    cluster: Cluster, mix: Mapping[str, FailureClass], platform: Platform, strategies: Sequence[str]
) -> tuple[dict[str, Choice], dict, dict[str, float]]:
    """For each heal strategy: its cadence choice, its outcome rows at that cadence, and its tax."""
    from harness.scale.heal_measured import HEAL_BUILDS

    sims = simulated()
    heals = [s for s in strategies if sims[s].build in HEAL_BUILDS]
    choices: dict[str, Choice] = {}
    rows: dict = {}
    taxes: dict[str, float] = {}
    if not heals:
        return choices, rows, taxes
    rates = job_rates(mix, cluster)
    cold = outcome_table(cluster, ("cold_restart",))["cold_restart"]
    state_bytes = cluster.checkpoint_gb_per_gpu * 1e9
    for s in heals:
        base = outcome_table(cluster, (s,))[s]
        lam = sum(rates[c] for c in CLASSES if base[c].rollback == ROLLBACK_CHECKPOINT)
        interval = (
            analytic.daly_interval(max(cluster.checkpoint_write_s, cluster.step_s), 1 / lam)
            if lam
            else cluster.horizon_s
        )
        fallback = {c: cold[c].downtime_s + interval / 2 for c in CLASSES}
        choice = choose(platform, state_bytes, cluster.step_s, rates, fallback)
        choices[s] = choice
        rows[s] = heal_outcomes(base, cold, choice.cadence, platform, state_bytes, cluster.step_s, interval)
        taxes[s] = choice.tax.fraction
    return choices, rows, taxes


def advise(
    cluster: Cluster,
    mix: Mapping[str, FailureClass],
    platform: Platform,
    strategies: Sequence[str] | None = None,
    trials: int = 16,
    seed: int = 0,
) -> Advice:
    strategies = default_strategies() if strategies is None else tuple(strategies)
    choices, rows, taxes = protection_plan(cluster, mix, platform, strategies)
    projections = project(cluster, mix, strategies, trials=trials, seed=seed, outcomes=rows, tax=taxes)
    out = []
    for p in projections:
        every = (
            None
            if not p.feasible or math.isinf(p.best_interval_s)
            else max(1, round(p.best_interval_s / cluster.step_s))
        )
        out.append(
            AdviceRow(
                p.strategy,
                p.best_interval_s,
                every,
                choices[p.strategy].cadence if p.strategy in choices else None,
                taxes.get(p.strategy, 0.0),
                p,
            )
        )
    return Advice(cluster, tuple(out), choices, taxes)


@dataclass(frozen=True)
class TraceAdviceRow:
    strategy: str
    checkpoint_every_steps: int | None  # None: no fault of the trace rolls this strategy back to disk
    cadence: Cadence | None  # AccelPact's heal only
    tax: float  # predicted per-step protection (cost model), fraction of the step
    mtbf_steps: float  # steps between the trace's faults that roll this strategy back to its checkpoint


def advise_for_trace(
    trace: Trace,
    step_s: float,
    state_bytes: float,
    checkpoint_write_s: float,
    platform: Platform | None = None,
    strategies: Sequence[str] | None = None,
) -> list[TraceAdviceRow]:
    """Settings for a harness run under ``trace`` (``harness.fleet.trace.Trace``): ``trace.world_size`` ranks,
    one per host, steps of ``step_s``, ``state_bytes`` of snapshot per rank, a disk checkpoint that blocks
    ``checkpoint_write_s``; on the ``cpu_here`` cost model (the committed calibration) unless given.

    A trace strikes per step (p per step), never during a recovery, unlike the simulator's wall-clock
    failures, which at a trace's compressed rate would strike most recoveries. So the settings come from the
    closed forms in work time: each strategy's disk interval is Daly's for the trace's faults that roll it
    back to its checkpoint (mean work between them: step_s / (p x their share)), and the heal's cadence is
    ``harness.advise.cadence.choose`` at the trace's rates per second of work. No ETTR: the run measures it.
    """
    if platform is None:
        try:
            platform = platform_from(load())
        except FileNotFoundError:
            platform = CPU_HERE
    world = int(trace.world_size)
    p = float(trace.p_per_step)
    mix = named_mix(trace.mix)
    unexpected = unexpected_classes(mix)
    total = sum(mix[c].rate_per_hour for c in unexpected)
    share = {c: (mix[c].rate_per_hour / total if c in unexpected else 0.0) for c in CLASSES}
    rates = {c: p / step_s * share[c] for c in CLASSES}  # per second of work
    gb = state_bytes / 1e9
    bw = world * gb / checkpoint_write_s if checkpoint_write_s > 0 else 1e12
    cluster = Cluster(gpus=world, gpus_per_host=1, step_s=step_s, checkpoint_gb_per_gpu=gb, write_gbps=bw, read_gbps=bw)
    names = default_strategies() if strategies is None else tuple(strategies)
    table = outcome_table(cluster, names)
    choices, _, taxes = protection_plan(
        cluster,
        {c: replace(mix[c], rate_per_hour=rates[c] * 3600 / (world if mix[c].scope == "gpu" else 1)) for c in CLASSES},
        platform,
        names,
    )
    out = []
    for s in names:
        lam = sum(rates[c] for c in CLASSES if table[s][c].rollback == ROLLBACK_CHECKPOINT)
        every = None
        if lam > 0:
            tau = analytic.daly_interval(max(checkpoint_write_s, step_s), 1.0 / lam)
            every = max(1, round(tau / step_s))
        out.append(
            TraceAdviceRow(
                s,
                every,
                choices[s].cadence if s in choices else None,
                taxes.get(s, 0.0),
                math.inf if lam == 0 else 1.0 / lam / step_s,
            )
        )
    return out
