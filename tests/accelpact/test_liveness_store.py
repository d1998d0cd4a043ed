"""Death notices and heartbeats on a real TCPStore: a gather that watches stops at a notice of this
job at once, ignores one of another job, and a Heartbeat thread really beats and stops."""

from __future__ import annotations

import threading
import time

import pytest

from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.detection.liveness import (
    Beat,
    Heartbeat,
    LivenessConfig,
    PeerJudge,
    PeerWatch,
    heartbeat_key,
    publish_death,
)
from accelpact.errors import RankLostError


@pytest.fixture(scope="module")
def server():
    store, port = start_control_server()
    yield store, port
    del store


def channel(port: int, token: str, rank: int = 0, deadline_s: float = 4.0) -> ControlChannel:
    return ControlChannel.connect(ControlConfig("127.0.0.1", port, rank, 2, token, deadline_s=deadline_s))


def watch(token: str, dropped: bool = False) -> PeerWatch:
    return PeerWatch(token, 0, PeerJudge(LivenessConfig(0.5, 4), connection_dropped=dropped), generation=1)


def test_notice_of_this_job_ends_the_gather_at_once(server):
    store, port = server
    token = new_job_token()
    chan = channel(port, token)
    t_notice = time.monotonic() + 0.3
    threading.Timer(0.3, lambda: publish_death(store, token, 1, by="launcher", reason="exit -9")).start()
    with pytest.raises(RankLostError) as info:
        chan.gather("report", b"x", 1, watch=watch(token))
    late = time.monotonic() - t_notice
    assert info.value.ranks == (1,) and info.value.detected_by == "notice" and info.value.generation == 1
    assert late < 1.0, f"notice seen {late:.2f} s after it was written"
    chan.close()


def test_notice_of_another_job_is_never_read(server):
    store, port = server
    token, other = new_job_token(), new_job_token()
    publish_death(store, other, 1, by="stray", reason="another job's rank 1")
    chan = channel(port, token, deadline_s=1.5)
    with pytest.raises(RankLostError) as info:
        chan.gather("report", b"x", 1, watch=watch(token))
    assert info.value.detected_by == "deadline"
    chan.close()


def test_dropped_connection_and_stale_beat_publish_a_notice_for_everyone(server):
    store, port = server
    token = new_job_token()
    store.set(heartbeat_key(token, 1), Beat.format(4242, 3))  # a beat that never changes again
    chan = channel(port, token, deadline_s=10.0)
    t0 = time.monotonic()
    with pytest.raises(RankLostError) as info:
        chan.gather("report", b"x", 1, watch=watch(token, dropped=True))
    assert info.value.detected_by == "heartbeat"
    assert 2.0 <= time.monotonic() - t0 < 6.0
    assert b'"by": "rank0"' in store.get(f"{token}/dead/1") and b"4242" in store.get(f"{token}/dead/1")
    chan.close()


def test_heartbeat_thread_beats_is_daemon_and_stops(server):
    store, port = server
    token = new_job_token()
    counter = [0]
    hb = Heartbeat("127.0.0.1", port, token, 0, config=LivenessConfig(0.05, 4), progress=lambda: counter[0]).start()
    assert hb._thread.daemon
    deadline = time.monotonic() + 10
    while hb.beats < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    counter[0] = 9
    time.sleep(0.2)
    assert Beat.parse(store.get(heartbeat_key(token, 0))).progress == 9
    hb.stop()
    hb._thread.join(timeout=5)
    assert not hb.alive
