"""RecoveryLog (guard.events): bounded to the newest ``keep`` events, with a total that keeps counting."""

from __future__ import annotations

import pytest

from accelpact.events import RecoveryEvent, RecoveryLog


def _event(step: int) -> RecoveryEvent:
    return RecoveryEvent(
        step=step,
        generation=step + 1,
        phase="before_vote",
        fault={"type": "RuntimeError"},
        ranks=[0, 1],
        decision={"action": "retry"},
        t_detected=0.0,
        detection_s=0.0,
        agreement_s=0.0,
        rebuild_s=0.0,
        rebind_s=0.0,
        first_collective_s=0.0,
        total_s=0.0,
    )


def test_keeps_the_newest_and_counts_every_event():
    log = RecoveryLog(keep=3)
    for step in range(10):
        log.append(_event(step))
    assert [e.step for e in log] == [7, 8, 9]
    assert log.total == 10


def test_since_forwards_each_event_once_even_after_old_ones_were_dropped():
    log, seen, forwarded = RecoveryLog(keep=4), 0, []
    for step in range(11):
        log.append(_event(step))
        if step % 3 == 0:  # a consumer that reads every few recoveries
            forwarded += [e.step for e in log.since(seen)]
            seen = log.total
    forwarded += [e.step for e in log.since(seen)]
    assert forwarded == list(range(11))
    assert log.since(log.total) == []


def test_since_returns_only_what_is_still_kept():
    log = RecoveryLog(keep=2)
    for step in range(5):
        log.append(_event(step))
    assert [e.step for e in log.since(0)] == [3, 4]


def test_keep_must_be_positive():
    with pytest.raises(ValueError, match="keep"):
        RecoveryLog(keep=0)
