"""What a guard is configured with: the settings :func:`accelpact.attach` turns into a GuardConfig.

Kept apart from the guard itself so that the step and recovery code reads without the settings'
documentation in the way; every field says what it changes and its default.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Callable

from accelpact.liveness import LivenessConfig
from accelpact.reset import ResetConfig

__all__ = ["GuardConfig", "InjectionClock"]

# Given the start time of the failed attempt, the wall time of a fault injected at or after it (and
# forgotten from then on), or None: e.g. accelpact.testing.FaultInjector.consume_injection_time.
InjectionClock = Callable[[float], "float | None"]


@dataclass(frozen=True)
class GuardConfig:
    """A guard's settings (built by :func:`accelpact.attach` from its keyword arguments)."""

    max_grad_norm: float | None = None  # None: no clipping (a script that never clipped trains unchanged)
    pg_timeout: datetime.timedelta | None = None  # timeout of rebuilt groups; None: 30 min (c10d default)
    verify_rebind: bool = False  # run the gc completeness check after every rebind (slow: ~100 ms)
    reset: ResetConfig = ResetConfig()
    # Heartbeat on the control store, and how many missed beats make a peer whose connection dropped
    # dead (docs/detection.md); None: no heartbeat, a dead peer is found by notices or the deadline.
    liveness: LivenessConfig | None = LivenessConfig()
    # A data-plane collective that has not completed for this long (and longer than 3x the median
    # step) while a peer stopped beating or the link retransmits is aborted and recovered, instead of
    # waiting for the PG timeout (accelpact/watchdog.py). None: off. Must be below the PG timeout.
    stall_timeout_s: float | None = None
    # The data-plane path (accelpact/backends/reconfigure.py): "auto" reconfigures the live groups in
    # place when torch (>= 2.15) and every group support it, else rebuilds and rebinds; "reconfigure"
    # refuses at attach when it cannot; "rebuild" always rebuilds and rebinds (the 2.13 path).
    data_plane: str = "auto"


