"""What a guard is configured with: the settings :func:`accelpact.attach` turns into a GuardConfig.

Kept apart from the guard itself so that the step and recovery code reads without the settings'
documentation in the way; every field says what it changes and its default.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from accelpact.dataplane.reset import ResetConfig
from accelpact.detection.liveness import LivenessConfig
from accelpact.recovery.context import InjectionClock

__all__ = ["GuardConfig", "InjectionClock"]


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
    # waiting for the PG timeout (accelpact/detection/watchdog.py). None: off. Must be below the PG timeout.
    stall_timeout_s: float | None = None
    # How the next data-plane generation is made after a fault (accelpact.dataplane.DATA_PLANES):
    # "auto" reconfigures the same groups in place where torch (>= 2.15) and every group support it,
    # else rebinds; "reconfigure" refuses at attach when it cannot; "rebind" builds new groups under the
    # old names and rebinds every cached reference (the path of every torch release).
    data_plane: str = "auto"
