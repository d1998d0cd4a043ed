"""The survivors' waits of a heal on a real TCPStore: a replacement lost before the rendezvous, one that
keeps dying, and a launcher that will start no replacement each end the wait within a poll, with the rank,
the count and the fix; an ack written before the death still lets every survivor enter the rendezvous."""

from __future__ import annotations

import threading
import time

import pytest

from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.detection.liveness import publish_death
from accelpact.errors import RankLostError
from accelpact.recovery.heal_wait import ReplacementWatch, joining_key, publish_no_replacement


@pytest.fixture(scope="module")
def server():
    store, port = start_control_server()
    yield store, port
    del store


def _setup(server, lost_pid: int = 100) -> tuple:
    store, port = server
    token = new_job_token()
    chan = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 2, token, deadline_s=4.0))
    # Written through the reader's own connection: a TCPStore set is not acknowledged, so a read on another
    # connection right after it may still see the old value (the waits poll; these checks read once).
    publish_death(chan, token, 1, by="launcher", reason="rank 1 exited with code -9 (SIGKILL)", pid=lost_pid)
    watch = ReplacementWatch(chan, 0, max_losses=3)
    watch.scan({1}, "lost")
    return store, token, chan, watch


def test_a_replacement_lost_before_taking_its_plan_ends_the_wait_at_once(server):
    store, token, chan, watch = _setup(server)
    threading.Timer(0.3, lambda: publish_death(store, token, 1, by="launcher", reason="exit -9", pid=201)).start()
    t0 = time.monotonic()
    assert watch.wait_joining({1: 201}, deadline_s=30) == {1}
    assert time.monotonic() - t0 < 5  # the deadline is 30 s; measured ~0.3 s
    [lost] = watch.lost
    assert (lost["rank"], lost["pid"], lost["stage"]) == (1, 201, "after arriving, before the rendezvous")
    assert 0 <= lost["seen_after_s"] < 5


def test_an_ack_written_before_the_death_still_enters_the_rendezvous(server):
    store, token, chan, watch = _setup(server)
    chan.set(joining_key(chan, 1, 202), b"3")
    publish_death(chan, token, 1, by="launcher", reason="exit -9", pid=202)
    # Every survivor sees the ack once it sees the notice: all of them enter (and fail) the rendezvous alike.
    assert watch.wait_joining({1: 202}, deadline_s=30) == set()


def test_a_replacement_that_never_takes_its_plan_is_named_at_the_deadline(server):
    _, _, _, watch = _setup(server)
    with pytest.raises(RankLostError, match=r"\{1: 203\} \(rank: pid\) arrived but did not take the heal plan"):
        watch.wait_joining({1: 203}, deadline_s=0.5)


def test_replacements_that_keep_dying_stop_with_the_rank_count_and_fix(server):
    _, token, chan, watch = _setup(server)
    publish_death(chan, token, 1, by="launcher", reason="rank 1 exited with code -9 (SIGKILL)", pid=301)
    assert watch.scan({1}, "before arriving") == {1}
    publish_death(chan, token, 1, by="launcher", reason="rank 1 exited with code -9 (SIGKILL)", pid=302)
    watch.scan({1}, "before arriving")
    publish_death(chan, token, 1, by="launcher", reason="rank 1 exited with code -9 (SIGKILL)", pid=303)
    with pytest.raises(RankLostError) as info:
        watch.scan({1}, "before arriving")
    text = str(info.value)
    assert "replacement of lost rank 1 was itself lost 3 times in a row (pids [301, 302, 303]" in text
    assert "SIGKILL" in text and "raise HealPolicy.max_rounds" in text
    assert info.value.ranks == (1,) and info.value.detected_by == "heal"


def test_a_launcher_that_starts_no_replacement_is_heard_only_for_a_death_this_heal_saw(server):
    _, token, chan, watch = _setup(server, lost_pid=100)
    publish_no_replacement(chan, token, 1, pid=99, reason="about an earlier process")
    watch.check_abandoned({1})  # pid 99 is not a death this heal saw: ignored
    publish_no_replacement(chan, token, 1, pid=100, reason="strategy.max_restarts=2 allows no more")
    with pytest.raises(RankLostError, match="no replacement will come for lost rank 1: strategy.max_restarts=2"):
        watch.check_abandoned({1})


def test_a_rank_whose_death_notice_comes_after_the_first_replacement_arrived_is_healed_in_the_same_round(server):
    """Ranks 1 and 2 killed at once; the launcher reaps rank 2 first, and its (template-forked) replacement
    arrives before the survivor's periodic scan. The survivor must not plan without rank 1: a rendezvous
    with a dead member waits out the store timeout (measured: 60 s, then a fallback to disk)."""
    import json
    from types import SimpleNamespace

    from accelpact.recovery.heal import Healer, HealPolicy
    from accelpact.recovery.heal_wait import arrived_key

    store, port = server
    token = new_job_token()
    chan = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 4, token, deadline_s=4.0))
    publish_death(chan, token, 2, by="launcher", reason="rank 2 exited with code -9 (SIGKILL)", pid=102)
    publish_death(chan, token, 1, by="launcher", reason="rank 1 exited with code -9 (SIGKILL)", pid=101)
    chan.set(arrived_key(chan, 2), json.dumps({"pid": 202, "t": time.time()}).encode())
    healer = object.__new__(Healer)  # the waits only: no data plane, model or snapshots needed
    healer.ctx = SimpleNamespace(rank=0, world_size=4, state=SimpleNamespace(committed_step=4))
    healer.control = chan
    healer.policy = HealPolicy(replacement_timeout_s=20.0)
    watch = ReplacementWatch(chan, 0, max_losses=3)
    watch.scan({2}, "lost")
    threading.Timer(0.5, lambda: store.set(arrived_key(chan, 1), json.dumps({"pid": 201, "t": 0}).encode())).start()
    lost = {2}
    t0 = time.monotonic()
    assert healer._wait_arrivals(lost, 5, watch) == {1: 201, 2: 202}
    assert lost == {1, 2} and time.monotonic() - t0 >= 0.4  # it waited for rank 1's replacement


def test_a_replacement_that_died_before_arriving_is_labelled_so_when_the_next_one_arrived_first(server):
    # Template-forked replacements arrive within ~0.1 s: the next one can arrive before the wait for
    # arrivals reads the notice of the first, which never arrived.
    store, token, chan, watch = _setup(server)
    publish_death(chan, token, 1, by="launcher", reason="exit -9", pid=201)  # died during its start
    chan.set(joining_key(chan, 1, 202), b"3")  # the next one arrived and took its plan
    assert watch.wait_joining({1: 202}, deadline_s=30) == set()
    [lost] = watch.lost
    assert (lost["rank"], lost["pid"], lost["stage"]) == (1, 201, "before arriving")


def test_a_replacement_arriving_after_every_other_rank_ended_the_run_stops_at_once(server):
    from accelpact.recovery.heal_wait import closed_key
    from accelpact.recovery.rejoin import rejoin

    _, port = server
    token = new_job_token()
    survivor = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 2, token, deadline_s=4.0))
    late = ControlChannel.connect(ControlConfig("127.0.0.1", port, 1, 2, token, deadline_s=4.0))
    survivor.set(closed_key(survivor, 0), b"7")  # what rank 0's guard.close() writes after guard.finish()
    t0 = time.monotonic()
    with pytest.raises(RankLostError, match="every other rank ended the run"):
        rejoin(late, timeout_s=60, liveness=None)
    assert time.monotonic() - t0 < 20  # the wait's bound is 60 s; a poll is 0.01 s


def test_a_replacement_with_a_live_survivor_still_waits_for_its_plan(server):
    from accelpact.recovery.rejoin import rejoin

    _, port = server
    token = new_job_token()
    late = ControlChannel.connect(ControlConfig("127.0.0.1", port, 1, 2, token, deadline_s=4.0))
    with pytest.raises(RankLostError, match="no survivor sent a heal plan within 0.5 s"):
        rejoin(late, timeout_s=0.5, liveness=None)
