"""RoundClock: every round of a multi-round recovery keeps its own parts, the failed one included."""

from __future__ import annotations

import time

from accelpact.events import ROUND_PARTS, RoundClock


def test_a_failed_round_is_charged_to_the_part_it_failed_in_and_the_next_round_is_separate():
    clock = RoundClock()
    clock.start()
    time.sleep(0.02)
    clock.mark()  # agreement done
    time.sleep(0.03)  # fails during rebuild
    clock.close()
    clock.start()
    for _ in ROUND_PARTS:
        time.sleep(0.01)
        clock.mark()
    clock.close()
    first, second = clock.rounds
    assert first["agreement"] >= 0.02 and first["rebuild"] >= 0.03
    assert first["rebind"] == 0.0 and first["first_collective"] == 0.0
    assert all(second[p] >= 0.01 for p in ROUND_PARTS)
    assert abs(clock.total("agreement") - first["agreement"] - second["agreement"]) < 1e-9


def test_close_is_idempotent():
    clock = RoundClock()
    clock.close()
    clock.start()
    clock.close()
    clock.close()
    assert len(clock.rounds) == 1


def test_rounds_are_back_to_back_from_the_moment_the_fault_was_caught():
    t0 = time.time()
    clock = RoundClock(t0)
    time.sleep(0.02)  # the abort and FSDP reset before the first round
    clock.start()
    clock.mark()
    clock.close()
    time.sleep(0.02)  # the abort between rounds
    clock.start()
    for _ in ROUND_PARTS:
        clock.mark()
    clock.close()
    spent = time.time() - t0
    assert clock.rounds[0]["agreement"] >= 0.02 and clock.rounds[1]["agreement"] >= 0.02
    assert abs(sum(clock.total(p) for p in ROUND_PARTS) - spent) < 0.005
