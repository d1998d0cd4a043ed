"""The pure liveness rules (accelpact.detection.liveness.PeerJudge): when a silent peer counts as dead, which
death notices are trusted. No store, no torch: the values are what the control store would hold."""

from __future__ import annotations

import pytest

from accelpact.detection.liveness import (
    JOINING,
    Beat,
    DeathNotice,
    LivenessConfig,
    PeerJudge,
    heartbeat_key,
    is_connection_drop,
    notice_key,
)

CFG = LivenessConfig(interval_s=0.5, missed_beats=4)  # stale after 2 s


def beat(pid: int, progress: int, t: float = 1.0) -> bytes:
    return f"{t} {pid} {progress}".encode()


def test_dropped_connection_and_silent_peer_is_dead_only_after_the_missed_beats():
    judge = PeerJudge(CFG, connection_dropped=True)
    b = beat(100, 7)
    assert judge.observe(1, b, None, now=10.0) is None
    assert judge.observe(1, b, None, now=11.9) is None
    verdict = judge.observe(1, b, None, now=12.0)
    assert verdict is not None and verdict.detected_by == "heartbeat" and verdict.ranks == (1,)


def test_a_changing_beat_restarts_the_clock():
    judge = PeerJudge(CFG, connection_dropped=True)
    assert judge.observe(1, beat(100, 1), None, now=10.0) is None
    assert judge.observe(1, beat(100, 2), None, now=11.9) is None
    assert judge.observe(1, beat(100, 2), None, now=13.0) is None  # 1.1 s since it changed
    assert judge.observe(1, beat(100, 2), None, now=13.9) is not None


def test_a_silent_peer_without_a_dropped_connection_is_a_stall_not_a_death():
    # A SIGSTOPped rank stops beating but keeps its sockets: peers time out, they see no drop.
    judge = PeerJudge(CFG, connection_dropped=False)
    b = beat(100, 7)
    judge.observe(1, b, None, now=0.0)
    assert judge.observe(1, b, None, now=1000.0) is None


def test_a_notice_is_trusted_at_once_when_its_pid_matches_the_beat():
    judge = PeerJudge(CFG, connection_dropped=False)
    notice = DeathNotice(rank=1, by="launcher", reason="exit -9", pid=100).to_bytes()
    verdict = judge.observe(1, beat(100, 7), notice, now=0.0)
    assert verdict is not None and verdict.detected_by == "notice" and "launcher" in verdict.reason


def test_a_notice_about_an_earlier_process_of_the_rank_is_ignored():
    judge = PeerJudge(CFG, connection_dropped=False)
    notice = DeathNotice(rank=1, by="launcher", reason="exit -9", pid=99).to_bytes()
    assert judge.observe(1, beat(100, 7), notice, now=0.0) is None


def test_a_notice_counts_when_the_rank_beats_as_a_replacement_that_has_not_joined():
    # The template-forked replacement beat before the survivor's first look: its pid is not the notice's, but
    # the process the survivor trained with (pid 99) is the dead one. Once joined (progress >= 0) it is not.
    notice = DeathNotice(rank=1, by="launcher", reason="exit -9", pid=99).to_bytes()
    verdict = PeerJudge(CFG, connection_dropped=False).observe(1, beat(100, JOINING), notice, now=0.0)
    assert verdict is not None and verdict.detected_by == "notice"
    assert PeerJudge(CFG, connection_dropped=False).observe(1, beat(100, 0), notice, now=0.0) is None


def test_a_heal_waiting_for_the_replacement_does_not_count_its_predecessors_notice_against_it():
    judge = PeerJudge(CFG, connection_dropped=False, joining_is_dead=False)
    notice = DeathNotice(rank=1, by="launcher", reason="exit -9", pid=99).to_bytes()
    assert judge.observe(1, beat(100, JOINING), notice, now=0.0) is None
    assert judge.observe(1, beat(100, JOINING), notice, now=100.0) is None


def test_a_notice_without_pid_or_without_a_beat_is_trusted():
    assert (
        PeerJudge(CFG, connection_dropped=False).observe(
            1, None, DeathNotice(rank=1, by="parent", reason="x", pid=5).to_bytes(), now=0.0
        )
        is not None
    )
    assert (
        PeerJudge(CFG, connection_dropped=False).observe(
            1, beat(100, 7), DeathNotice(rank=1, by="parent", reason="x").to_bytes(), now=0.0
        )
        is not None
    )


def test_garbage_values_are_ignored_not_fatal():
    judge = PeerJudge(CFG, connection_dropped=False)
    assert judge.observe(1, b"not a beat", b"not json", now=0.0) is None


def test_keys_carry_the_job_token():
    assert heartbeat_key("tokA", 3) == "tokA/hb/3" and notice_key("tokA", 3) == "tokA/dead/3"
    assert notice_key("tokA", 3) != notice_key("tokB", 3)


def test_beat_round_trip_and_connection_drop_markers():
    b = Beat.parse(Beat.format(1234, 5))
    assert b.pid == 1234 and b.progress == 5
    assert is_connection_drop("[../gloo/transport/tcp/pair.cc:538] Connection closed by peer [127.0.0.1]:1")
    assert is_connection_drop("Connection reset by peer")
    assert not is_connection_drop("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms")


def test_bad_config_names_the_fix():
    with pytest.raises(ValueError, match="LivenessConfig"):
        LivenessConfig(interval_s=0, missed_beats=4)
