"""A seeded fault trace drawn from a published failure mix, in the harness's fault kinds.

Pure logic (numpy, no torch): ``draw_trace(mix="llama3", steps=300, faults=10, seed=0)`` gives the same
list of (step, fault kind, rank) for the same arguments, so every strategy and every trial of a long run
can be fed the same trace.

**From a mix to fault kinds.** The rates are the simulator's (``harness.fleet.mixes``: Llama 3's Table 5
mapped to its failure classes by ``harness.fleet.sources.CLASS_CAUSES``). A fault draws a class by the
classes' rates, then a Table 5 cause within the class by its published count, then the harness's fault
kind of that cause (``CAUSE_KINDS``): a GPU, memory or other hardware fault loses the host (a faulty GPU
is drained with its host), a software bug kills the process, an NCCL watchdog timeout is a hang, a
network switch or cable fault is a socket reset, a link flap or a blackhole (one third each: an
assumption, Table 5 does not split them), and a failed dependency is the loss of the control store (an
assumption: the job's external service going away). Planned maintenance is not drawn: it is announced,
and the harness has no fault for it.

**The rate.** A real cluster fails every few hours; a trace of a few hundred steps should see about ten
faults. The trace compresses time: each step fails with probability ``p = faults / (steps - first_step)``
(at most one fault a step), so each trace step stands for ``p x MTTF`` of the cluster's time, and at a
harness step of ``h`` seconds the rate is the cluster's times ``(p / h) / (1 / MTTF)``. ``Trace.scale_text``
and ``Trace.mapping_rows`` print both, for the run's table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from harness.fleet.config import FailureClass, ScaleConfigError
from harness.fleet.mixes import MIXES, mttf_h, named_mix, unexpected_classes
from harness.fleet.sources import CLASS_CAUSES, LLAMA3, LLAMA3_TABLE5, RECURRING_BUG_SHARE

__all__ = ["CAUSE_KINDS", "TraceEvent", "Trace", "draw_trace", "class_kind_shares"]

_HARDWARE = "host_loss"
# Table 5 cause -> {harness fault kind: share}; the shares within a cause sum to 1.
CAUSE_KINDS: dict[str, dict[str, float]] = {
    "Network Switch/Cable": {"socket_reset": 1 / 3, "link_down": 1 / 3, "blackhole": 1 / 3},
    "NCCL Watchdog Timeouts": {"hang": 1.0},
    "Software Bug": {"kill": 1.0},
    "Dependency": {"control_store_loss": 1.0},
    **{
        c: {_HARDWARE: 1.0}
        for c in LLAMA3_TABLE5
        if c not in ("Network Switch/Cable", "NCCL Watchdog Timeouts", "Software Bug", "Dependency")
    },
}
WHY: dict[str, str] = {
    "Network Switch/Cable": "switch or cable: a reset, a flap or a blackhole (1/3 each: assumption)",
    "NCCL Watchdog Timeouts": "a stalled collective: SIGSTOP of one rank",
    "Software Bug": "the process dies (the harness cannot make it recur: optimistic for in-memory retries)",
    "Dependency": "the job's external service fails: the control store is lost (assumption)",
}
_HARDWARE_WHY = "hardware: the GPU's host is drained, its memory lost"


def _cause_count(cls: str, cause: str) -> float:
    n = float(LLAMA3_TABLE5[cause])
    if cause == "Software Bug":  # split between a crash and a recurring bug, as the simulator does
        n *= RECURRING_BUG_SHARE if cls == "software_bug" else 1 - RECURRING_BUG_SHARE
    return n


def _cause_shares(cls: str) -> dict[str, float]:
    counts = {cause: _cause_count(cls, cause) for cause in CLASS_CAUSES[cls]}
    total = sum(counts.values())
    return {cause: n / total for cause, n in counts.items()}


def class_kind_shares(mix: Mapping[str, FailureClass]) -> dict[tuple[str, str, str], float]:
    """{(class, cause, kind): probability that a drawn fault is that one}; sums to 1 over the mix's
    unexpected classes with a nonzero rate."""
    classes = unexpected_classes(mix)
    rates = {c: mix[c].rate_per_hour for c in classes}
    total = sum(rates.values())
    if total <= 0:
        raise ScaleConfigError("the mix has no unexpected failures (every rate is 0): give a rate above 0")
    out: dict[tuple[str, str, str], float] = {}
    for cls in classes:
        if rates[cls] == 0:
            continue
        for cause, share in _cause_shares(cls).items():
            for kind, ks in CAUSE_KINDS[cause].items():
                out[(cls, cause, kind)] = rates[cls] / total * share * ks
    return out


@dataclass(frozen=True)
class TraceEvent:
    step: int  # the fault fires in this step
    kind: str  # the harness's fault kind (conf/fault/<kind>.yaml)
    rank: int  # the rank it strikes
    cls: str  # the simulator's failure class it stands for
    cause: str  # the Table 5 cause it was drawn as


@dataclass(frozen=True)
class Trace:
    mix: str
    seed: int
    steps: int
    first_step: int
    p_per_step: float  # probability that a step (from first_step on) has a fault
    world_size: int  # ranks the faults are drawn over
    gpus: int  # the cluster whose MTTF the trace compresses
    mttf_h: float  # that cluster's MTTF under the mix's unexpected classes
    events: tuple[TraceEvent, ...]
    shares: Mapping[tuple[str, str, str], float] = field(repr=False, default_factory=dict)

    @property
    def expected_faults(self) -> float:
        return self.p_per_step * (self.steps - self.first_step)

    @property
    def hours_per_step(self) -> float:
        """Cluster hours one trace step stands for."""
        return self.p_per_step * self.mttf_h

    def rate_scale(self, harness_step_s: float) -> float:
        """How many times the cluster's failure rate the trace runs at, with steps of ``harness_step_s``."""
        return self.hours_per_step * 3600.0 / harness_step_s

    def scale_text(self, harness_step_s: float | None = None) -> str:
        s = (
            f"{self.mix} at {self.gpus:,} GPUs: MTTF {self.mttf_h:.2f} h; the trace fails a step with p = "
            f"{self.p_per_step:.4f} ({self.expected_faults:.1f} faults expected in steps {self.first_step}-"
            f"{self.steps - 1}), one step standing for {self.hours_per_step * 60:.1f} min of the cluster"
        )
        if harness_step_s:
            s += f"; at {harness_step_s:g} s a step, the rate is x{self.rate_scale(harness_step_s):,.0f} the cluster's"
        return s

    def mapping_rows(self) -> list[tuple[str, str, str, float, int, str]]:
        """(class, Table 5 cause, fault kind, share of faults, faults in this trace, why), for the run's table."""
        drawn: dict[tuple[str, str, str], int] = {}
        for e in self.events:
            drawn[(e.cls, e.cause, e.kind)] = drawn.get((e.cls, e.cause, e.kind), 0) + 1
        return [
            (c, cause, k, share, drawn.get((c, cause, k), 0), WHY.get(cause, _HARDWARE_WHY))
            for (c, cause, k), share in sorted(self.shares.items(), key=lambda kv: -kv[1])
        ]

    def table_md(self, harness_step_s: float | None = None) -> str:
        """The mix's source, the class-to-fault mapping with each share and this trace's count, and the rate
        scale, as markdown for a run's table."""
        lines = [
            f"Fault mix: {self.source()}. Seed {self.seed}: {len(self.events)} faults in {self.steps} steps.",
            f"Rate scale: {self.scale_text(harness_step_s)}.",
            "",
            "| simulator class | Table 5 cause | harness fault | share of faults | in this trace | why |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {c} | {cause} | `{k}` | {share:.1%} | {n} | {why} |"
            for c, cause, k, share, n, why in self.mapping_rows()
        ]
        return "\n".join(lines)

    def source(self) -> str:
        return f"{MIXES[self.mix].description} ({LLAMA3} for the class split)"


def draw_trace(
    mix: str = "llama3",
    *,
    steps: int = 300,
    faults: float = 10.0,
    seed: int = 0,
    world_size: int = 2,
    first_step: int = 1,
    gpus: int = 16384,
) -> Trace:
    """A seeded trace over ``steps`` steps: each step from ``first_step`` on fails with probability
    ``faults / (steps - first_step)``, as a fault kind drawn from ``mix``, on a rank drawn uniformly."""
    if not isinstance(steps, int) or not isinstance(first_step, int) or not 0 <= first_step < steps:
        raise ScaleConfigError(
            f"steps={steps!r}, first_step={first_step!r}: need whole numbers with 0 <= first_step "
            "< steps (e.g. steps=300 first_step=1)"
        )
    span = steps - first_step
    if not 0 < faults <= span:
        raise ScaleConfigError(
            f"faults={faults!r}: expect between 0 and {span} faults in {span} steps "
            "(at most one a step; e.g. faults=10)"
        )
    if world_size < 1:
        raise ScaleConfigError(f"world_size={world_size!r}: need at least 1 rank")
    rates = named_mix(mix)
    shares = class_kind_shares(rates)
    keys = list(shares)
    probs = np.array([shares[k] for k in keys])
    p = faults / span
    rng = np.random.default_rng(seed)
    hit = rng.random(span) < p
    fault_steps = np.flatnonzero(hit) + first_step
    which = rng.choice(len(keys), size=len(fault_steps), p=probs / probs.sum())
    ranks = rng.integers(0, world_size, size=len(fault_steps))
    events = tuple(
        TraceEvent(int(s), keys[w][2], int(r), keys[w][0], keys[w][1]) for s, w, r in zip(fault_steps, which, ranks)
    )
    return Trace(
        mix,
        seed,
        steps,
        first_step,
        p,
        world_size,
        gpus,
        mttf_h(rates, gpus, unexpected_classes(rates)),
        events,
        shares,
    )
