"""What the heal's protection costs per training step: a cost model of the snapshot copy, its checksum and the
buddy push, with how much of each hides under compute.

Pure arithmetic (no torch). For one rank with ``state_bytes`` of shard (parameters + optimizer state), a step of
``step_s`` with protection off, and a cadence (``every`` = e, ``push_every`` = k, ``confirm``):

- per snapshot (every e-th step): a copy of ``state_bytes / copy_gbps`` and a checksum of
  ``state_bytes / checksum_gbps``;
- per pushed snapshot (every (e k)-th step): a push of ``state_bytes / push_gbps`` on each of ``push_sides``
  processes (on one host, the sender's and the receiving ward's kernel copies both take CPU);
- each part's ``overlap`` is the fraction that hides under compute; the rest is added to the step;
  ``block_s_per_gb`` is a part that never hides (a GPU capture's blocking launch);
- the snapshot (and, with ``confirm``, its push) must be complete before the next step's vote; what is
  longer than the step it runs beside is a wait.

The tax is the added time over ``step_s``. Two presets say where the numbers come from: ``cpu_here``
(this project's 2-core host, every core training, so nothing hides: overlap 0; the rates are measured, see
``experiments/heal_tax.py``), and ``gpu_node`` (a GPU node, where the copy is a device-to-host DMA beside
compute; every figure an assumption, each with its source, see docs/advisor.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["Platform", "Cadence", "Tax", "tax", "CPU_HERE", "GPU_NODE", "PLATFORMS", "push_time_s"]

GB = 1e9


@dataclass(frozen=True)
class Platform:
    """Rates and overlaps of one kind of node. Bandwidths in GB/s per rank."""

    name: str
    copy_gbps: float
    checksum_gbps: float
    push_gbps: float
    copy_overlap: float = 0.0
    checksum_overlap: float = 0.0
    push_overlap: float = 0.0
    push_sides: int = 1
    block_s_per_gb: float = 0.0
    fixed_s: float = 0.0  # per snapshot, independent of its size (marker, metadata, slot choice)
    source: str = ""

    def __post_init__(self) -> None:
        for key in ("copy_gbps", "checksum_gbps", "push_gbps"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{self.name}.{key}={v!r}: give a bandwidth in GB/s above 0")
        for key in ("copy_overlap", "checksum_overlap", "push_overlap"):
            v = getattr(self, key)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{self.name}.{key}={v!r}: an overlap is a fraction between 0 and 1")
        if self.block_s_per_gb < 0 or self.fixed_s < 0 or self.push_sides < 1:
            raise ValueError(f"{self.name}: block_s_per_gb and fixed_s must be >= 0, push_sides >= 1")

    def with_(self, **kw: float) -> Platform:
        return replace(self, **kw)  # type: ignore[arg-type]  # replace() is typed per field


@dataclass(frozen=True, order=True)
class Cadence:
    """AccelPact's snapshot settings: ``snapshot.every``, ``snapshot.push_every``, ``snapshot.confirm_push``."""

    every: int = 1
    push_every: int = 1
    confirm: bool = True

    @property
    def replay_bound(self) -> int:
        """Steps a heal from the buddy replays at most (accelpact.snapshot.push_rule.replay_bound)."""
        from accelpact.snapshot import replay_bound  # lazy: torch

        return replay_bound(self.every, self.push_every)

    def text(self) -> str:
        return f"every={self.every} push_every={self.push_every} confirm_push={str(self.confirm).lower()}"


@dataclass(frozen=True)
class Tax:
    """Per-step cost of one cadence, in seconds and as a fraction of the unprotected step."""

    copy_s: float  # per step, exposed
    checksum_s: float
    push_s: float
    block_s: float
    wait_s: float
    step_s: float

    @property
    def added_s(self) -> float:
        return self.copy_s + self.checksum_s + self.push_s + self.block_s + self.wait_s

    @property
    def fraction(self) -> float:
        return self.added_s / self.step_s

    def parts(self) -> dict[str, float]:
        """Each part as a fraction of the step."""
        return {k: getattr(self, f"{k}_s") / self.step_s for k in ("copy", "checksum", "push", "block", "wait")}


def push_time_s(platform: Platform, state_bytes: float) -> float:
    """Wall time of one push on the wire (one side)."""
    return state_bytes / GB / platform.push_gbps


def tax(platform: Platform, state_bytes: float, step_s: float, cadence: Cadence, checksum: bool = True) -> Tax:
    """The per-step tax of ``cadence`` for a rank with ``state_bytes`` of state and an unprotected step of ``step_s``.

    ``checksum=False``: a capture that is not checksummed (GEMINI's)."""
    if state_bytes < 0 or step_s <= 0:
        raise ValueError(f"state_bytes={state_bytes!r} must be >= 0 and step_s={step_s!r} > 0")
    e, k = cadence.every, cadence.push_every
    if e < 1 or k < 1:
        raise ValueError(f"{cadence.text()}: every and push_every must be at least 1")
    gb = state_bytes / GB
    copy = gb / platform.copy_gbps
    crc = gb / platform.checksum_gbps if checksum else 0.0
    push = push_time_s(platform, state_bytes)
    per_snap_exposed = (1 - platform.copy_overlap) * copy + (1 - platform.checksum_overlap) * crc + platform.fixed_s
    push_exposed = (1 - platform.push_overlap) * push * platform.push_sides
    block = platform.block_s_per_gb * gb
    # The next vote waits for the snapshot (and a confirmed push) beyond the step it ran beside; the step it
    # runs beside is already longer by the exposed part of the work.
    beside = step_s + per_snap_exposed + block
    pipe = copy + crc + platform.fixed_s
    wait_plain = max(0.0, pipe - beside)
    wait_pushed = max(0.0, pipe + (push if cadence.confirm else 0.0) - beside - push_exposed)
    wait = ((k - 1) * wait_plain + wait_pushed) / (k * e)
    return Tax(
        copy_s=(1 - platform.copy_overlap) * copy / e + platform.fixed_s / e,
        checksum_s=(1 - platform.checksum_overlap) * crc / e,
        push_s=push_exposed / (e * k),
        block_s=block / e,
        wait_s=wait,
        step_s=step_s,
    )


# This host (2 cores, every core a training rank): nothing hides. The rates are replaced by the committed
# calibration's measured ones (experiments/heal_tax.py writes them; harness.advise.calibration reads them);
# these defaults are the docs' earlier single measurements (docs/snapshots.md: 7.5 GB/s into a reused
# mapping; accelpact/snapshot/checksum.py: ISA-L CRC-32 10.3 GB/s).
CPU_HERE = Platform(
    "cpu_here",
    copy_gbps=7.5,
    checksum_gbps=10.3,
    push_gbps=3.0,
    push_sides=2,
    source="this 2-core host; every core trains, so overlap 0 (rates: results/heal_tax)",
)

# A GPU node. Assumptions, each stated (docs/advisor.md):
# - the copy is a device-to-host DMA on a side stream into pinned memory (accelpact's GPU path, not run on a
#   GPU here), overlapping compute; what blocks is the capture's launch: GEMINI (Wang et al., SOSP 2023)
#   reports 7.7 ms of blocking per 12 GB capture (figure as quoted in this project's December 2026 audit,
#   not checked against the paper here) -> 0.64 ms per GB;
# - the DMA runs at PCIe Gen5 x16 speed, ~50 GB/s per GPU (assumption);
# - the checksum runs on host cores that mostly wait on the GPU: it hides (overlap 1), at ISA-L's 10.3 GB/s
#   measured here on one core;
# - the push goes over the GPU's NIC, 50 GB/s (Llama 3: 400 Gbps per GPU), beside training traffic: 90%
#   hidden (assumption; GEMINI schedules its traffic into the gaps of training's).
GPU_NODE = Platform(
    "gpu_node",
    copy_gbps=50.0,
    checksum_gbps=10.3,
    push_gbps=50.0,
    copy_overlap=1.0,
    checksum_overlap=1.0,
    push_overlap=0.9,
    push_sides=1,
    block_s_per_gb=7.7e-3 / 12,
    source="assumptions: DMA copy beside compute (GEMINI's 7.7 ms per 12 GB capture), PCIe Gen5 "
    "50 GB/s, ISA-L CRC on idle host cores, NIC 50 GB/s (Llama 3) 90% hidden",
)

PLATFORMS: dict[str, Platform] = {p.name: p for p in (CPU_HERE, GPU_NODE)}
