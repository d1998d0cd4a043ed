"""Where the control channel connects, and how it fails when it cannot: the torchrun fallback, a refused
address, a store that does not answer, and a job-token mismatch caught at join (attach) time.

Real TCPStore servers and sockets; the torchrun case sets the variables torchrun exports (the real
torchrun run is tests/accelpact/test_torchrun.py). Each test failed before this branch: from_env had
no torchrun fallback; a refused address took connect_timeout_s (30 s) and printed a C++ stack trace;
the timeout message advised ``deadline_s``; there was no join, so a token mismatch passed silently.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.errors import AccelPactError, ControlChannelError

TORCHRUN_VARS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")
ACCELPACT_VARS = ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN")


@pytest.fixture(scope="module")
def port():
    store, port = start_control_server()
    yield port
    del store


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*TORCHRUN_VARS, *ACCELPACT_VARS, "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_from_env_under_torchrun_uses_its_store_and_run_id(port, clean_env):
    env = clean_env
    env.setenv("RANK", "0")
    env.setenv("WORLD_SIZE", "1")
    with pytest.raises(AccelPactError, match="not started by torchrun"):
        ControlChannel.from_torchrun()
    env.setenv("TORCHELASTIC_RUN_ID", "job/42")
    env.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    env.setenv("MASTER_ADDR", "127.0.0.1")
    env.setenv("MASTER_PORT", str(port))
    chan = ControlChannel.from_env()
    assert chan.job_token == "torchrun-job_42-attempt3"  # '/' is the key separator; restarts get their own
    assert (chan.config.port, chan.config.token_source) == (port, "TORCHELASTIC_RUN_ID")
    chan.close()
    # An explicit ACCELPACT_* variable wins in from_env; from_torchrun always takes torchrun's.
    env.setenv("ACCELPACT_JOB_TOKEN", "mine")
    env.setenv("ACCELPACT_CONTROL_ADDR", f"127.0.0.1:{port}")
    chan = ControlChannel.from_env()
    assert (chan.job_token, chan.config.token_source) == ("mine", "ACCELPACT_JOB_TOKEN")
    chan.close()
    chan = ControlChannel.from_torchrun()
    assert chan.job_token == "torchrun-job_42-attempt3"
    chan.close()


def test_a_refused_connection_fails_at_once_in_one_line(capfd):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(ControlChannelError) as info:
        ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 2, "tok", connect_timeout_s=30.0))
    # Before: the TCPStore client retried until connect_timeout_s (30 s). 10 s is a generous bound.
    assert time.monotonic() - t0 < 10.0
    message = str(info.value)
    assert "\n" not in message and "refused" in message, message
    assert f"127.0.0.1:{port}" in message and "connect_timeout_s" in message, message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained C++ error either
    err = capfd.readouterr().err  # fd-level: what c10d's C++ code would have written to stderr
    assert "frame #" not in err and "Exception raised from" not in err and "TCPStore" not in err, err[-2000:]


def test_an_address_that_does_not_resolve_fails_at_once():
    t0 = time.monotonic()
    with pytest.raises(ControlChannelError, match="no-such-host.invalid:29500 does not resolve") as info:
        ControlChannel.connect(ControlConfig("no-such-host.invalid", 29500, 0, 1, "tok", connect_timeout_s=30.0))
    assert time.monotonic() - t0 < 10.0 and "connect_timeout_s" in str(info.value)


def test_a_store_that_never_answers_names_connect_timeout_s():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # handshakes complete, nobody ever replies
    try:
        cfg = ControlConfig("127.0.0.1", listener.getsockname()[1], 0, 1, new_job_token(), connect_timeout_s=1.0)
        with pytest.raises(ControlChannelError) as info:
            ControlChannel.connect(cfg)
        assert "connect_timeout_s=1" in str(info.value) and "raise deadline_s" not in str(info.value)
    finally:
        listener.close()


def join_all(chans: list[ControlChannel]) -> list[BaseException | None]:
    errors: list[BaseException | None] = [None] * len(chans)

    def run(i: int) -> None:
        try:
            chans[i].join()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(chans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_join_names_the_missing_ranks_and_the_token_variable(port):
    def channel(rank: int, token: str, world: int = 2, source: str = "ACCELPACT_JOB_TOKEN") -> ControlChannel:
        return ControlChannel.connect(
            ControlConfig("127.0.0.1", port, rank, world, token, connect_timeout_s=1.5, token_source=source)
        )

    good = new_job_token()
    assert join_all([channel(0, good), channel(1, good)]) == [None, None]
    # Rank 1 got another token: both fail within connect_timeout_s, each naming the other rank.
    t0 = time.monotonic()
    errors = join_all([channel(0, new_job_token()), channel(1, new_job_token(), source="TORCHELASTIC_RUN_ID")])
    assert time.monotonic() - t0 < 30.0  # generous: the bound is connect_timeout_s=1.5 plus store round trips
    assert isinstance(errors[0], ControlChannelError) and "rank(s) [1] of 2" in str(errors[0]), errors
    assert "ACCELPACT_JOB_TOKEN" in str(errors[0]) and "connect_timeout_s=1.5" in str(errors[0])
    assert isinstance(errors[1], ControlChannelError) and "rank(s) [0] of 2" in str(errors[1])
    assert "TORCHELASTIC_RUN_ID" in str(errors[1])
    # Same token, another world size: named too.
    token = new_job_token()
    errors = join_all([channel(0, token), channel(1, token, world=3), channel(2, token, world=3)])
    assert isinstance(errors[0], ControlChannelError) and "world size" in str(errors[0]), errors
