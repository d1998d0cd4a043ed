"""Named published failure mixes: a name -> per-class rates (``FailureClass``), each with its source.

The simulator's one failure model is ``harness.fleet.sources``: Llama 3's Table 5 causes mapped to the
simulator's classes. This module only names it and adds the variants a user asks for by name; it never
restates a count. Used by the protection advisor (``python -m harness.advise --mix NAME``) and by the
fault-trace generator (``harness.fleet.trace``).

- ``llama3``: Table 5 as published (16,384 H100s, 54 days; MTTF 3.1 h at 16,384 GPUs).
- ``rsc_1k`` / ``rsc_16k``: Meta's research clusters (HPCA'25): Table 5's class proportions, with the
  total rate set so that the MTTF is the study's 7.9 h at 1,024 GPUs or 1.8 h at 16,384. The study's own
  class split was not checked here, so the proportions are Llama 3's: an assumption, stated in the source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from harness.fleet.config import CLASSES, FailureClass, ScaleConfigError, check_number
from harness.fleet.sources import RSC_MTTF_H, RSC_SOURCE, llama3_mix

__all__ = ["NamedMix", "MIXES", "named_mix", "mix_from_rates", "unexpected_classes", "mttf_h"]


@dataclass(frozen=True)
class NamedMix:
    name: str
    description: str
    build: Callable[[], dict[str, FailureClass]]


def _rsc(gpus: int) -> Callable[[], dict[str, FailureClass]]:
    def build() -> dict[str, FailureClass]:
        base = llama3_mix()
        # The study's MTTF covers unexpected failures; planned stops keep Llama 3's job rate.
        unexpected = [c for c in CLASSES if base[c].scope == "gpu"]
        total = sum(base[c].rate_per_hour for c in unexpected) * gpus  # per job-hour at Llama 3's rates
        factor = (1.0 / RSC_MTTF_H[gpus]) / total
        out = dict(base)
        for c in unexpected:
            out[c] = replace(
                base[c],
                rate_per_hour=base[c].rate_per_hour * factor,
                source=f"{RSC_SOURCE}: MTTF {RSC_MTTF_H[gpus]} h at {gpus:,} GPUs, split in Llama 3's "
                f"Table 5 proportions (assumption: the study's own split not checked here)",
            )
        return out

    return build


MIXES: dict[str, NamedMix] = {
    m.name: m
    for m in (
        NamedMix(
            "llama3",
            "Llama 3 405B, Table 5: 419 unexpected + 47 planned interruptions, 16,384 H100s, 54 days",
            llama3_mix,
        ),
        NamedMix(
            "rsc_1k", "Meta research clusters (HPCA'25): MTTF 7.9 h at 1,024 GPUs, Llama 3's class split", _rsc(1024)
        ),
        NamedMix(
            "rsc_16k", "Meta research clusters (HPCA'25): MTTF 1.8 h at 16,384 GPUs, Llama 3's class split", _rsc(16384)
        ),
    )
}


def named_mix(name: str) -> dict[str, FailureClass]:
    """The per-class rates of a named mix; ``ScaleConfigError`` naming the known ones otherwise."""
    if name not in MIXES:
        raise ScaleConfigError(
            f"mix {name!r} is unknown: use one of {', '.join(MIXES)}, "
            "or give rates (e.g. --rate process_crash=1e-5, per GPU-hour)"
        )
    return MIXES[name].build()


def mix_from_rates(rates: Mapping[str, float], base: str | None = None) -> dict[str, FailureClass]:
    """A mix from per-class rates (per GPU-hour; planned_maintenance per job-hour). Classes not given are 0,
    or the named ``base`` mix's rate."""
    out = (
        named_mix(base)
        if base
        else {c: FailureClass(c, 0.0, "job" if c == "planned_maintenance" else "gpu", "not given: 0") for c in CLASSES}
    )
    for cls, rate in rates.items():
        if cls not in CLASSES:
            raise ScaleConfigError(f"rate for {cls!r}: that class is unknown, use one of {', '.join(CLASSES)}")
        out[cls] = replace(
            out[cls], rate_per_hour=check_number(f"rate {cls}", rate), source="given on the command line"
        )
    return out


def unexpected_classes(mix: Mapping[str, FailureClass]) -> tuple[str, ...]:
    """The classes that strike unannounced (every class scoped per GPU; planned stops are per job)."""
    return tuple(c for c in CLASSES if mix[c].scope == "gpu")


def mttf_h(mix: Mapping[str, FailureClass], gpus: int, classes: tuple[str, ...] | None = None) -> float:
    """Mean time between failures of ``classes`` (default: every class) for a job on ``gpus`` GPUs, in hours."""
    rate = sum(mix[c].job_rate_per_s(gpus) for c in (classes or CLASSES)) * 3600.0
    return float("inf") if rate == 0 else 1.0 / rate
