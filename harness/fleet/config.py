"""The simulator's inputs as narrow frozen dataclasses, and the one check every number goes through.

A bad input raises ``ScaleConfigError`` naming the key and the fix: a rate or cost that is negative, not
finite or missing, or a (strategy, failure class) pair with no recovery outcome.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# The failure classes, in the order used by every array in the engine.
CLASSES: tuple[str, ...] = (
    "transient_network",  # link flap or reset: every process and its state survive
    "hang",  # a collective stalls (NCCL watchdog): found only by a timeout
    "process_crash",  # one process dies, its host is fine
    "gpu_host_loss",  # a GPU or the whole host is gone: a replacement host is needed
    "software_bug",  # a bug that recurs at the same step: in-memory retry cannot help
    "planned_maintenance",  # announced: a checkpoint can be taken first
)


# What a failure takes away besides the downtime.
ROLLBACK_STEP = "step"  # only the step in flight (state kept in memory)
ROLLBACK_CHECKPOINT = "checkpoint"  # everything since the newest durable checkpoint
ROLLBACK_NONE = "none"  # nothing (a planned stop checkpoints first; the cost is in the downtime)
ROLLBACKS: tuple[str, ...] = (ROLLBACK_STEP, ROLLBACK_CHECKPOINT, ROLLBACK_NONE)


class ScaleConfigError(ValueError):
    """A simulator input is wrong; the message names the key and how to fix it."""


def check_number(key: str, value: object, *, positive: bool = False) -> float:
    """``value`` as a float, or ``ScaleConfigError`` naming ``key`` when it is missing, not a finite
    number, negative (or zero where ``positive``)."""
    if value is None:
        raise ScaleConfigError(f"{key} is missing: give it a finite number >= 0")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScaleConfigError(f"{key}={value!r} is not a number: give a finite number >= 0")
    v = float(value)
    if not math.isfinite(v):
        raise ScaleConfigError(f"{key}={value!r} is not finite: give a finite number >= 0")
    if v < 0 or (positive and v == 0):
        need = "> 0" if positive else ">= 0"
        raise ScaleConfigError(
            f"{key}={value!r} is negative or zero: it must be {need}"
            if positive
            else f"{key}={value!r} is negative: it must be {need}"
        )
    return v


@dataclass(frozen=True)
class Cluster:
    """The job: its size, its step, its checkpoint, and the site's recovery facilities.

    Defaults are an example job (Llama 3-like storage figures, see ``sources``), not a measurement."""

    gpus: int = 16384
    gpus_per_host: int = 8
    step_s: float = 5.0  # one training step (example value; give your own)
    checkpoint_gb_per_gpu: float = 4.0  # Llama 3: "1MB to 4GB per GPU" (upper end)
    write_gbps: float = 2000.0  # aggregate storage GB/s: Llama 3's Tectonic, 2 TB/s sustained
    read_gbps: float = 2000.0  # no separate read figure published: assumed equal to write
    hang_timeout_s: float = 600.0  # PyTorch's default process-group timeout (10 min)
    spare_available: bool = True  # a warm spare host is at hand for a lost host
    spare_swap_s: float = 60.0  # bring a warm spare into the job (assumption, unverified)
    host_repair_s: float = 4 * 3600.0  # without a spare: drain, repair, return (assumption, unverified)
    bug_fix_s: float = 1800.0  # a recurring bug: time to skip the batch or patch (assumption, unverified)
    replica_gpus: int = 1024  # torchft/FT-HSDP replica group size (assumption, unverified)
    days: float = 30.0  # simulated wall time

    def __post_init__(self) -> None:
        for key in ("gpus", "gpus_per_host", "replica_gpus"):
            value = getattr(self, key)
            check_number(f"cluster.{key}", value, positive=True)
            if int(value) != value:
                raise ScaleConfigError(f"cluster.{key}={value!r} must be a whole number")
        for key in ("step_s", "write_gbps", "read_gbps", "days"):
            check_number(f"cluster.{key}", getattr(self, key), positive=True)
        for key in ("checkpoint_gb_per_gpu", "hang_timeout_s", "spare_swap_s", "host_repair_s", "bug_fix_s"):
            check_number(f"cluster.{key}", getattr(self, key))
        if not isinstance(self.spare_available, bool):
            raise ScaleConfigError(f"cluster.spare_available={self.spare_available!r}: give true or false")
        if self.gpus % self.gpus_per_host:
            raise ScaleConfigError(
                f"cluster.gpus={self.gpus} is not a multiple of cluster.gpus_per_host={self.gpus_per_host}"
            )

    @property
    def hosts(self) -> int:
        return self.gpus // self.gpus_per_host

    @property
    def checkpoint_write_s(self) -> float:
        """Blocking write of one checkpoint: every GPU's state over the aggregate storage bandwidth."""
        return self.gpus * self.checkpoint_gb_per_gpu / self.write_gbps

    @property
    def checkpoint_read_s(self) -> float:
        return self.gpus * self.checkpoint_gb_per_gpu / self.read_gbps

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0


@dataclass(frozen=True)
class FailureClass:
    """One class of interruption: its rate, whether it scales with the GPUs, and where the rate comes from."""

    name: str
    rate_per_hour: float  # per GPU-hour when scope == "gpu", per job-hour when scope == "job"
    scope: str  # "gpu": grows with the GPU count; "job": one rate for the whole job
    source: str

    def __post_init__(self) -> None:
        if self.name not in CLASSES:
            raise ScaleConfigError(f"failure class {self.name!r} is unknown: use one of {', '.join(CLASSES)}")
        check_number(f"failure_mix.{self.name}.rate_per_hour", self.rate_per_hour)
        if self.scope not in ("gpu", "job"):
            raise ScaleConfigError(f"failure_mix.{self.name}.scope={self.scope!r}: use 'gpu' or 'job'")

    def job_rate_per_s(self, gpus: int) -> float:
        per_hour = self.rate_per_hour * (gpus if self.scope == "gpu" else 1)
        return per_hour / 3600.0


@dataclass(frozen=True)
class Outcome:
    """What one strategy does about one failure class: the job-wide downtime, by part, and the rollback."""

    rollback: str
    parts: Mapping[str, float] = field(default_factory=dict)  # seconds of job-wide stop, by named part
    note: str = ""

    def __post_init__(self) -> None:
        if self.rollback not in ROLLBACKS:
            raise ScaleConfigError(f"rollback={self.rollback!r}: use one of {', '.join(ROLLBACKS)}")

    @property
    def downtime_s(self) -> float:
        return float(sum(self.parts.values()))


def check_outcomes(table: Mapping[str, Mapping[str, Outcome]], strategies: tuple[str, ...]) -> None:
    """Every (strategy, class) pair has an outcome whose every part is a finite number >= 0."""
    for strategy in strategies:
        per_class = table.get(strategy)
        if per_class is None:
            raise ScaleConfigError(f"outcomes.{strategy} is missing: give an outcome for every failure class")
        for cls in CLASSES:
            outcome = per_class.get(cls)
            if outcome is None:
                raise ScaleConfigError(f"outcomes.{strategy}.{cls} is missing: say what {strategy} does about {cls}")
            for part, seconds in outcome.parts.items():
                check_number(f"outcomes.{strategy}.{cls}.{part}", seconds)


def check_mix(mix: Mapping[str, FailureClass]) -> None:
    """Every class has a rate (0 is allowed: that class never happens)."""
    for cls in CLASSES:
        if cls not in mix:
            raise ScaleConfigError(f"failure_mix.{cls} is missing: give its rate_per_hour (0 if it never happens)")
        check_number(f"failure_mix.{cls}.rate_per_hour", mix[cls].rate_per_hour)
