"""experiments.process_loss_push_every.bound: the replays a host loss may show, per push_every (pure)."""

from experiments.process_loss_push_every import bound


def test_a_kill_past_the_newest_pushed_step_replays_exactly_the_gap():
    # killed in step 8: the survivor committed 7; pushed steps are the multiples of k
    assert bound(8, 1) == (7, {0, 1})  # every step is pushed: c itself, maybe still in flight
    assert bound(8, 2) == (6, {1})
    assert bound(8, 4) == (4, {3})


def test_a_kill_right_after_a_pushed_step_replays_nothing_or_k():
    # committed 8, itself pushed: its replica may still be in flight, then the previous pushed step heals
    assert bound(9, 2) == (8, {0, 2})
    assert bound(9, 4) == (8, {0, 4})
