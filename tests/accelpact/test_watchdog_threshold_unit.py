"""The watchdog's slow-step rule as pure logic (a fake clock and a fake store; the thread never starts):
it never fires before max(stall_timeout_s, 3 x the median completed step), even with a peer stale.

The real-process counterpart is tests/accelpact/test_detection_stall.py (a rank sleeping 5x its
median step inside step_fn fires nothing).
"""

from __future__ import annotations

import pytest

from accelpact.detection import watchdog as wd
from accelpact.detection.liveness import LivenessConfig


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FrozenPeerStore:
    """Rank 1's beat never changes (it is stale once stale_after_s has passed); nobody posted."""

    def check(self, keys):
        return all(k.endswith("/hb/1") for k in keys)

    def get(self, key):
        return b"1000.0 4242 7"


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(wd.time, "monotonic", c)
    return c


def _dog(stall_timeout_s: float) -> wd.StallWatchdog:
    return wd.StallWatchdog(
        "127.0.0.1",
        1,
        "tok",
        0,
        2,
        stall_timeout_s=stall_timeout_s,
        liveness=LivenessConfig(0.5, 4),
        abort=lambda: None,
        inodes=lambda: set(),
    )


def _complete_steps(dog: wd.StallWatchdog, clock: Clock, seconds: list[float]) -> None:
    for s in seconds:
        dog.begin_attempt(0)
        clock.t += s
        assert dog.end_attempt(completed=True) is None


def test_threshold_is_three_times_the_median_step_once_known(clock):
    dog = _dog(0.2)
    assert dog.threshold_s() == 0.2  # no history yet: the configured timeout
    _complete_steps(dog, clock, [1.0, 0.9])
    assert dog.threshold_s() == 0.2  # two steps are not a median to trust
    with pytest.warns(
        RuntimeWarning, match=r"stall_timeout_s=0.2 is below 3x the median step \(3.00 s\).*stall_timeout_s=3 or more"
    ):
        _complete_steps(dog, clock, [1.1])
    assert dog.threshold_s() == pytest.approx(3.0)
    _complete_steps(dog, clock, [0.1])  # one fast step barely moves the median
    assert dog.threshold_s() == pytest.approx(3 * 0.95)
    big = _dog(10.0)
    _complete_steps(big, clock, [1.0, 1.0, 1.0])
    assert big.threshold_s() == 10.0  # the configured timeout when it is the larger


def _tick_until(dog: wd.StallWatchdog, store, clock: Clock, t0: float, until: float) -> str | None:
    """The watchdog thread's looks, every tick_s from ``clock.t`` to ``t0 + until``: the last one's answer."""
    why = None
    while clock.t < t0 + until - 1e-9:
        clock.t = min(clock.t + dog.tick_s, t0 + until)
        why = dog._why(store, t0, 0)
    return why


@pytest.mark.filterwarnings("ignore:accelpact. stall_timeout_s")
def test_a_stale_peer_fires_only_past_three_times_the_median(clock):
    dog = _dog(0.2)
    _complete_steps(dog, clock, [1.0, 1.0, 1.0])
    store = FrozenPeerStore()
    dog.begin_attempt(0)
    t0 = clock.t
    assert dog._why(store, t0, 0) is None
    # the beat is stale (2 s) by 2.9 s, but the attempt is below 3x the 1 s median
    assert _tick_until(dog, store, clock, t0, 2.9) is None
    why = _tick_until(dog, store, clock, t0, 3.05)
    assert why is not None and "rank(s) [1] stopped beating" in why


class CountingStore(FrozenPeerStore):
    def __init__(self) -> None:
        self.reads = 0

    def get(self, key):
        self.reads += 1
        return super().get(key)


def test_far_from_the_threshold_no_evidence_is_gathered(clock):
    """A normal step never pays for the stall evidence (a /proc scan, a store read per peer): only the last
    lookback_s before the threshold does, which is long enough for a stale beat to show by then."""
    scans = []
    dog = wd.StallWatchdog(
        "127.0.0.1",
        1,
        "tok",
        0,
        2,
        stall_timeout_s=10.0,
        liveness=LivenessConfig(0.5, 4),
        abort=lambda: None,
        inodes=lambda: scans.append(1) or set(),
    )
    _complete_steps(dog, clock, [0.2, 0.2, 0.2])
    store = CountingStore()
    dog.begin_attempt(0)
    t0 = clock.t
    assert _tick_until(dog, store, clock, t0, 10.0 - dog.lookback_s() - 0.01) is None
    assert store.reads == 0 and scans == []
    assert dog.lookback_s() >= dog.liveness.stale_after_s
    why = _tick_until(dog, store, clock, t0, 10.05)
    assert why is not None and "stopped beating" in why and store.reads > 0 and scans
