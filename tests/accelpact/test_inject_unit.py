"""The fault injector's own clock: each injector records its injections, and the guard's
``injection_clock`` (``injector.consume_injection_time``) hands each one out once, never an
injection older than the failed attempt. Pure logic: a 1 ms stall is the injected "fault"."""

from __future__ import annotations

import time

import pytest

from accelpact.testing import FaultInjector


def test_consume_injection_time_returns_each_injection_once_and_only_if_recent():
    inj = FaultInjector()
    assert inj.consume_injection_time(0.0) is None  # nothing fired yet
    t_start = time.time()
    inj.arm(3, "vote", "stall", stall_s=0.001)
    assert inj.maybe_fire("vote", 3)
    fired_at = inj.fired[0].fired_at
    assert fired_at is not None and fired_at >= t_start
    assert inj.consume_injection_time(t_start) == fired_at
    assert inj.consume_injection_time(t_start) is None  # forgotten once consumed


def test_an_injection_before_the_attempt_is_not_counted():
    inj = FaultInjector()
    inj.arm(0, "clip_allreduce", "stall", stall_s=0.001)
    inj.maybe_fire("clip_allreduce", 0)
    later = time.time() + 1.0
    assert inj.consume_injection_time(later) is None
    assert inj.consume_injection_time(0.0) is None  # and it is gone, not kept for a later fault


def test_injectors_do_not_share_a_clock():
    a, b = FaultInjector(), FaultInjector()
    a.arm(1, "vote", "stall", stall_s=0.001)
    a.maybe_fire("vote", 1)
    assert b.consume_injection_time(0.0) is None
    assert a.consume_injection_time(0.0) is not None


def test_disarm_cancels_an_armed_fault_and_the_one_firing_now():
    inj = FaultInjector()
    kept = inj.arm(2, "vote", "stall", stall_s=0.5)
    twin = inj.arm(2, "vote", "stall", stall_s=0.5)  # equal by value: disarm goes by identity
    inj.disarm(kept)
    assert inj.armed == [twin] and inj.armed[0] is twin
    # Disarmed from on_fire: it counts as fired (its time is recorded) but does not act (no 0.5 s stall).
    inj.on_fire = inj.disarm
    t0 = time.monotonic()
    assert inj.maybe_fire("vote", 2)
    assert time.monotonic() - t0 < 0.4 and inj.fired == [twin] and not inj.armed
    inj.disarm(twin)  # already fired: nothing to do


def test_rearm_changes_the_action_of_an_armed_or_firing_fault():
    inj = FaultInjector()
    spec = inj.arm(1, "vote", "stall", stall_s=0.001)
    inj.rearm(spec, "stall", stall_s=0.002)
    assert (spec.action, spec.stall_s) == ("stall", 0.002)
    with pytest.raises(ValueError, match="stall_s > 0"):
        inj.rearm(spec, "stall")
    seen: list[float] = []
    inj.on_fire = lambda s: (seen.append(s.stall_s), inj.rearm(s, "stall", stall_s=0.003))
    inj.maybe_fire("vote", 1)
    assert seen == [0.002] and spec.stall_s == 0.003
    with pytest.raises(ValueError, match="not armed"):
        inj.rearm(spec, "reset")  # fired: nothing left to change
