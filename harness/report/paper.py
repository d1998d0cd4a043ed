"""Every figure the paper publishes that this project measures against, defined once.

Pure data (standard library and the strategy registry only), so that the harness, the experiments and
their tests can all import it without pulling in torch. The gains over a baseline are that baseline's
``StrategySpec.paper_gain`` (the registry is the one place strategy names live); this module collects them. Each figure carries the setup it was measured on, because a
figure without its setup cannot be compared fairly: the paper ran Mistral-7B / a 1.216B decoder on
16 GPUs with NCCL, this project runs tiny decoders on gloo over 2 CPU cores.
"""

from __future__ import annotations

from harness import strategies

__all__ = [
    "PAPER_GAIN",
    "paper_label",
    "PAPER_GAIN_SETUP",
    "PAPER_REBIND_MS",
    "PAPER_REBIND_WORLDS",
    "PAPER_CKPT",
    "PAPER_BIT_IDENTITY_RANKS",
    "PAPER_BIT_IDENTITY_FAULTS",
    "PAPER_RANKS",
]


def _paper_gains() -> dict[tuple[str, int], float]:
    """Every strategy's ``paper_gain``, keyed (strategy, age), by age then table order."""
    pairs = [(age, spec.order, spec.name, gain) for spec in strategies.specs() for age, gain in spec.paper_gain.items()]
    return {(name, age): gain for age, _, name, gain in sorted(pairs)}


# Whole-run goodput gain of AccelPact over a baseline strategy, keyed (baseline strategy, checkpoint
# age in steps): 1.197x over a cold restart and 1.194x over NVRx checkpoint restoration at age 5,
# 1.698x over a cold restart at age 18 (each on its strategy's spec).
PAPER_GAIN: dict[tuple[str, int], float] = _paper_gains()
PAPER_GAIN_SETUP = "Mistral-7B, 16 GPUs"

# Reference-rebinding time (ms), lowest and highest, "constant from 4 to 16 GPUs" (RTX 5880, NCCL).
PAPER_REBIND_MS: tuple[float, float] = (0.493, 0.518)
PAPER_REBIND_WORLDS: tuple[int, int] = (4, 16)

# Per-update async checkpointing of a 1.216B-parameter decoder: step latency overhead (%), host
# memory (GiB), storage traffic (TB/hour), and the parameter count they were measured at.
PAPER_CKPT: dict[str, float] = {"overhead_pct": 656.7, "host_mem_gib": 32.5, "tb_per_hour": 3.39, "params": 1.216e9}

# "Parameter state bit-identical on all 16 ranks after 10 successive fault injections".
PAPER_BIT_IDENTITY_RANKS = 16
PAPER_BIT_IDENTITY_FAULTS = 10

PAPER_RANKS = 16  # the GPU count of every experiment in the paper


def paper_label(strategy: str) -> str:
    """What the paper calls ``strategy`` where it quotes its gain over it (else the strategy's label)."""
    spec = strategies.get(strategy)
    return spec.paper_label or spec.label
