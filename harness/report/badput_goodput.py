"""Badput-based goodput: the diagnostic printed beside the verdict's measured goodput. Pure, no I/O.

Whole-run goodput (``GoodputReport.goodput``: useful tokens / wall seconds) moves with how fast the
productive steps happened to run, which on a shared host moves from run to run. Each run's badput is
measured by part and does not depend on that speed, so this module also computes

    badput-based goodput = useful tokens / (useful steps x the reference's productive step time
                                            + the run's measured badput)

with the fault-free reference's useful seconds per step (with trials, the median over the trials'
references: ``reference_step_s``). It cannot see a strategy's own slower step, except where that is
measured as a part (``snapshot_overhead``, ``checkpoint_save``) or side by side (``step_factor``);
``step_drift`` is reported beside it. Badput parts carry ml-goodput-measurement's names where one fits
(``BADPUT_PARTS``). docs/goodput.md says why the verdict reads the measured goodput, with the runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.report.goodput import Badput, GoodputReport


@dataclass(frozen=True)
class BadputPart:
    """One badput part: its name in tables, the ``Badput`` field it reads, and ml-goodput-measurement's bucket."""

    name: str
    field: str  # harness.report.goodput.Badput attribute
    google: str  # ml_goodput_measurement BadputType member that holds the same time ("" if none does)
    what: str


# Order: the stacking order of every badput bar. Names of ml-goodput-measurement's buckets where they fit.
BADPUT_PARTS: tuple[BadputPart, ...] = (
    BadputPart(
        "detection",
        "detection_s",
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
        "fault -> a survivor knows (in-memory recovery; a heal's fault -> caught)",
    ),
    BadputPart(
        "agreement",
        "agreement_s",
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
        "ranks agreeing the recovery decision over the control channel",
    ),
    BadputPart("rebuild", "rebuild_s", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", "building the new communicator"),
    BadputPart(
        "rebind",
        "rebind_s",
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
        "rebinding FSDP to it, with the first collective on it",
    ),
    BadputPart(
        "program_startup",
        "restart_s",
        "PROGRAM_STARTUP",
        "a relaunch: fault -> every new process ready (Python, torch, gloo, model build)",
    ),
    BadputPart(
        "replacement_start",
        "replacement_start_s",
        "PROGRAM_STARTUP",
        "a lost rank's replacement process starting (heal in memory)",
    ),
    BadputPart(
        "heal_transfer",
        "heal_transfer_s",
        "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
        "the heal after the replacement arrived: rendezvous, model build, state load from a snapshot",
    ),
    BadputPart(
        "checkpoint_restore",
        "restore_s",
        "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
        "loading the newest checkpoint after a relaunch or restart",
    ),
    BadputPart(
        "wasted_progress",
        "replay_s",
        "WASTED_PROGRESS_FROM_DISRUPTION",
        "steps run again after a rollback, and an attempt a retry threw away",
    ),
    BadputPart(
        "checkpoint_save", "checkpoint_s", "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", "training stalled on a checkpoint save"
    ),
    BadputPart(
        "snapshot_overhead",
        "snapshot_overhead_s",
        "CUSTOM_BADPUT_EVENTS",
        "a step waiting for the previous in-memory snapshot's copy",
    ),
    BadputPart(
        "other", "other_s", "OTHER", "what no record covers: gaps between steps, the in-flight step a fault destroyed"
    ),
)
PART_NAMES: tuple[str, ...] = tuple(p.name for p in BADPUT_PARTS)


def named_parts(badput: Badput) -> dict[str, float]:
    """``badput`` as {part name: seconds} in ``BADPUT_PARTS`` order (every part, zeros included)."""
    return {p.name: float(getattr(badput, p.field)) for p in BADPUT_PARTS}


def google_buckets(badput: Badput) -> dict[str, float]:
    """``badput`` summed into ml-goodput-measurement's BadputType buckets (seconds)."""
    out: dict[str, float] = {}
    for p in BADPUT_PARTS:
        out[p.google] = out.get(p.google, 0.0) + float(getattr(badput, p.field))
    return out


def productive_step_s(report: GoodputReport) -> float:
    """The run's productive step time: useful seconds (mean over ranks) over its committed steps; NaN
    for a run with none."""
    return report.useful_s / report.steps if report.steps > 0 and report.useful_s > 0 else math.nan


def reference_step_s(references: Sequence[GoodputReport]) -> float:
    """The reference pace of a comparison with trials: the median productive step time of its fault-free
    reference runs (one per trial); NaN with none."""
    steps = sorted(v for v in (productive_step_s(r) for r in references) if not math.isnan(v))
    if not steps:
        return math.nan
    mid = len(steps) // 2
    return steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2


@dataclass(frozen=True)
class BadputGoodput:
    """A run's badput-based goodput and what it was computed from."""

    tokens: int  # useful tokens (each step's final execution, summed over ranks)
    useful_steps: int
    reference_step_s: float  # the reference pace: its productive step time (median over trials)
    step_factor: float  # per-step overhead measured side by side, charged on top (1.0: none)
    badput_s: float  # the run's measured badput, every part (mean over ranks)
    measured_goodput: float  # the run's whole-run goodput, for beside it
    step_drift: float  # the run's productive step / the reference's (load, or a per-step overhead)

    @property
    def goodput(self) -> float:
        """useful tokens / (useful steps x reference step x step_factor + badput); NaN without a reference."""
        denom = self.useful_steps * self.reference_step_s * self.step_factor + self.badput_s
        return self.tokens / denom if denom > 0 and not math.isnan(denom) else math.nan


def badput_goodput(run: GoodputReport, reference: GoodputReport | float, step_factor: float = 1.0) -> BadputGoodput:
    """The badput-based goodput of ``run`` against ``reference`` (its report, or its productive step time
    in seconds). ``step_factor``: a per-step overhead of this run's strategy measured side by side (1.0 when
    none was measured)."""
    ref_step = productive_step_s(reference) if isinstance(reference, GoodputReport) else float(reference)
    own = productive_step_s(run)
    return BadputGoodput(
        tokens=run.tokens,
        useful_steps=run.steps,
        reference_step_s=ref_step,
        step_factor=step_factor,
        badput_s=run.badput.total_s,
        measured_goodput=run.goodput,
        step_drift=own / ref_step if ref_step > 0 and not math.isnan(own) else math.nan,
    )


def badput_goodput_from_row(row: Mapping[str, float], reference_step_s: float, step_factor: float = 1.0) -> float:
    """The same definition from a flat data row (``tokens``, ``steps`` and ``badput_s`` keys), for
    experiments that re-derive from their CSVs."""
    denom = float(row["steps"]) * reference_step_s * step_factor + float(row["badput_s"])
    return float(row["tokens"]) / denom if denom > 0 and not math.isnan(denom) else math.nan
