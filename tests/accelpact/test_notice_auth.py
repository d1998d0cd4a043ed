"""Signed death notices: a notice is read only when it is signed for this job and generation.

Unit checks of accelpact.control.notice_auth, then real TCPStore gathers: a forged, unsigned, replayed
(other job) or stale (older generation) notice under this job's key never ends a gather (it runs to
its deadline, and the forgery is reported once); a properly published one ends it at once.
"""

from __future__ import annotations

import json
import time
import warnings

import pytest

from accelpact.control import ControlChannel, ControlConfig, new_job_token, notice_auth, start_control_server
from accelpact.detection.liveness import DeathNotice, LivenessConfig, PeerJudge, PeerWatch, notice_key, publish_death
from accelpact.errors import RankLostError


def test_sign_verify_roundtrip_and_every_rejection():
    token, other = new_job_token(), new_job_token()
    body = {"rank": 1, "by": "launcher", "reason": "exit -9", "pid": 7, "generation": 3}
    raw = notice_auth.sign(body, token)
    assert notice_auth.verify(raw, token, min_generation=3)["rank"] == 1
    assert token not in raw.decode(), "the token itself must never be stored in a notice"
    tampered = json.loads(raw)
    tampered["rank"] = 0
    cases = {
        "unsigned": json.dumps(body).encode(),
        "bad signature": json.dumps(tampered).encode(),
        "not this one": notice_auth.sign(body, other),
        "older than 4": raw,
        "not JSON": b"\xff{",
    }
    for why, data in cases.items():
        with pytest.raises(notice_auth.NoticeRejected, match=why):
            notice_auth.verify(data, token, min_generation=4)
    # A launcher does not know the generation: its notice (generation None) is accepted.
    launcher = notice_auth.sign({**body, "generation": None}, token)
    assert notice_auth.verify(launcher, token, min_generation=9)["by"] == "launcher"


@pytest.fixture(scope="module")
def server():
    store, port = start_control_server()
    yield store, port
    del store


def _gather(port: int, token: str, deadline_s: float) -> RankLostError:
    chan = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 2, token, deadline_s=deadline_s))
    watch = PeerWatch(token, 0, PeerJudge(LivenessConfig(0.5, 4), connection_dropped=False), generation=2)
    try:
        with pytest.raises(RankLostError) as info:
            chan.gather("report", b"x", 2, watch=watch)
    finally:
        chan.close()
    info.value.rejected = watch.rejected  # type: ignore[attr-defined]
    return info.value


@pytest.mark.parametrize("forgery", ["unsigned", "other_job_key", "older_generation"])
def test_a_forged_or_stale_notice_is_ignored(server, forgery):
    store, port = server
    token = new_job_token()
    body = json.loads(DeathNotice(rank=1, by="attacker", reason="forged", pid=None, generation=2).to_bytes())
    raw = {
        "unsigned": json.dumps(body).encode(),
        "other_job_key": notice_auth.sign(body, new_job_token()),
        "older_generation": notice_auth.sign({**body, "generation": 1}, token),
    }[forgery]
    store.set(notice_key(token, 1), raw)  # under THIS job's key: only the signature stops it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = _gather(port, token, deadline_s=1.5)
    assert err.detected_by == "deadline", f"a {forgery} notice was believed: {err}"
    assert list(err.rejected) == [1]
    assert sum("ignored a death notice about rank 1" in str(w.message) for w in caught) == 1, "reported once"


def test_a_signed_notice_of_this_job_ends_the_gather_at_once(server):
    store, port = server
    token = new_job_token()
    publish_death(store, token, 1, by="launcher", reason="exit -9")
    t = time.monotonic()
    err = _gather(port, token, deadline_s=10.0)
    assert err.detected_by == "notice" and err.ranks == (1,)
    assert time.monotonic() - t < 3.0
