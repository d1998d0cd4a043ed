"""The per-step protection a strategy pays whatever the fault rate, for the advisor's projection.

Each function takes (cluster, platform) and returns a fraction of the step; a strategy's ``Simulation``
names its own in ``per_step_tax``. The heal's cadence is not here: its tax depends on the cadence the
advisor chooses (``harness.advise.cadence``).
"""

from __future__ import annotations

from harness.advise.cost import Cadence, Platform, tax
from harness.fleet.config import Cluster

# torchft's per-step quorum, measured here: a median of 8 ms a step in the harness's torchft runs
# (docs/scale.md). The simulator's outcomes do not charge it; the advisor does.
TORCHFT_QUORUM_S = 0.008

# GEMINI (lm-resiliency 0.2.0) as the harness runs it: a capture of every step, replicated to the paired rank
# from a background thread; nothing waits for the replica to land, and nothing is checksummed.
GEMINI_CAPTURE = Cadence(every=1, push_every=1, confirm=False)


def torchft_quorum(cluster: Cluster, platform: Platform) -> float:
    """torchft's quorum before every step."""
    return TORCHFT_QUORUM_S / cluster.step_s


def gemini_capture(cluster: Cluster, platform: Platform) -> float:
    """GEMINI's per-step capture on ``platform``'s cost model: the copy into host memory and the push to the
    paired rank, as the heal's snapshot at every=1, push_every=1 without the checksum or the confirmation."""
    state_bytes = cluster.checkpoint_gb_per_gpu * 1e9
    return tax(platform, state_bytes, cluster.step_s, GEMINI_CAPTURE, checksum=False).fraction
