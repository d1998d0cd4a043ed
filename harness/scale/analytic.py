"""Closed forms the engine must agree with, and Young/Daly's checkpoint interval as a cross-check.

All for one Poisson failure class of rate ``lam`` (1/s) whose recovery of fixed length ``d`` can itself be
hit (a hit restarts it), the engine's model:

- Expected time to finish a recovery: (e^{lam d} - 1) / lam.
- Rollback to the step in flight, steps vanishingly short, no checkpoints: each failure costs that time,
  so ETTR = 1 / (1 + lam * (e^{lam d} - 1) / lam) = e^{-lam d}.
- Rollback to the checkpoint, segments of ``tau`` work + ``c`` write: expected wall time of a segment is
  e^{lam d} (e^{lam (tau + c)} - 1) / lam, so ETTR = tau * lam / (e^{lam d} (e^{lam (tau + c)} - 1)).
"""

from __future__ import annotations

import math


def ettr_step_rollback(lam: float, d: float) -> float:
    """ETTR with in-memory recovery (nothing rolled back) and no checkpoints."""
    return math.exp(-lam * d)


def ettr_checkpoint_rollback(lam: float, d: float, tau: float, c: float) -> float:
    """ETTR with rollback to the newest checkpoint every ``tau`` seconds of work (write ``c``)."""
    if lam == 0:
        return tau / (tau + c)
    return tau * lam / (math.exp(lam * d) * math.expm1(lam * (tau + c)))


def young_interval(c: float, mtbf: float) -> float:
    """Young (1974): work between checkpoints = sqrt(2 c M)."""
    return math.sqrt(2.0 * c * mtbf)


def daly_interval(c: float, mtbf: float) -> float:
    """Daly (2006), higher-order estimate: sqrt(2cM)[1 + sqrt(c/2M)/3 + c/(18M)] - c for c < 2M, else M."""
    if c >= 2.0 * mtbf:
        return mtbf
    x = c / (2.0 * mtbf)
    return math.sqrt(2.0 * c * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c
