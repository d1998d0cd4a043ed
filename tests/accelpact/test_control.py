"""Tests of the out-of-band control channel (accelpact.control) and of fault classification (accelpact.errors).

Everything runs against a real TCPStore server: hosted in the pytest process, or in a subprocess
when the test must freeze it (SIGSTOP). Faults are real: shutdown(SHUT_RDWR) on this process's own
sockets, a stopped server, a listener that never answers, gloo groups that really time out.
No assertion is about speed beyond "finished before a generous outer timeout".
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from accelpact.backends import is_comm_fault
from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.errors import (
    AccelPactError,
    CommFault,
    ControlChannelError,
    RankLostError,
    StateDivergedError,
)

OUTER_TIMEOUT_S = 60.0  # generous bound for "did not hang"; never a performance threshold


@pytest.fixture(scope="module")
def server():
    store, port = start_control_server()
    yield store, port
    del store


@pytest.fixture
def port(server) -> int:
    return server[1]


def open_channels(port: int, n: int, token: str | None = None, deadline_s: float = 20.0) -> list[ControlChannel]:
    token = token or new_job_token()
    return [
        ControlChannel.connect(ControlConfig("127.0.0.1", port, r, n, token, deadline_s=deadline_s)) for r in range(n)
    ]


def run_all(fns: list[Callable[[], object]], timeout: float = OUTER_TIMEOUT_S) -> list[object]:
    """Run fns in threads; return each result or the exception it raised. Fails if any hangs."""
    results: list[object] = [None] * len(fns)

    def body(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # collected for the assertions
            results[i] = exc

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(end - time.monotonic(), 0.0))
    assert not any(t.is_alive() for t in threads), "a call hung past the outer timeout: its own deadline failed"
    return results


def tcp_fds(match: Callable[[tuple, tuple], bool]) -> set[int]:
    """This process's TCP socket fds whose (local, peer) addresses satisfy match."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                try:
                    if match(s.getsockname(), s.getpeername()):
                        out.add(fd)
                except OSError:
                    pass  # listening or unconnected
        finally:
            s.detach()  # never close an fd we do not own
    return out


def reset(fds: set[int]) -> None:
    """shutdown(SHUT_RDWR) on our own sockets: the portable connection-reset fault (recovery-facts s.2)."""
    for fd in fds:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue  # already closed by its owner after a sibling reset
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.detach()


def store_client_fds(port: int) -> set[int]:
    return tcp_fds(lambda local, peer: peer[1] == port)


# ---------------------------------------------------------------- gather / barrier


def test_gather_and_barrier_across_four_ranks(port):
    chans = open_channels(port, 4)
    for generation in (1, 2):
        results = run_all([lambda c=c, g=generation: c.gather("reports", f"r{c.rank}g{g}".encode(), g) for c in chans])
        for res in results:
            assert res == {r: f"r{r}g{generation}".encode() for r in range(4)}
    assert run_all([lambda c=c: c.barrier("rebuilt", 2) for c in chans]) == [None] * 4
    for c in chans:
        c.close()


def test_missing_rank_raises_rank_lost_naming_it(port):
    chans = open_channels(port, 4, deadline_s=1.0)
    results = run_all([lambda c=c: c.gather("reports", b"x", 1) for c in chans if c.rank != 2])
    for res in results:
        assert isinstance(res, RankLostError), res
        assert res.ranks == (2,)
        assert "[2]" in str(res) and "generation 1" in str(res)
    barrier = run_all([lambda c=c: c.barrier("b", 1) for c in chans if c.rank not in (0, 3)])
    assert all(isinstance(r, RankLostError) and r.ranks == (0, 3) for r in barrier), barrier


def test_straggler_sees_generation_superseded(port):
    a, b = open_channels(port, 2, deadline_s=1.0)
    assert not b.generation_superseded()
    a.advance_generation()
    with pytest.raises(RankLostError):
        a.gather("reports", b"a", a.generation)  # b has not come yet
    assert b.generation == 0 and b.generation_superseded()
    b.advance_generation()
    assert b.gather("reports", b"b", b.generation) == {0: b"a", 1: b"b"}


# ---------------------------------------------------------------- real faults


def test_raw_tcpstore_client_does_not_survive_a_reset(port):
    """The fault is real: a plain client is dead after it (what the channel must work around)."""
    before = store_client_fds(port)
    raw = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=10))
    raw.set("raw/k", b"v")
    reset(store_client_fds(port) - before)
    with pytest.raises(dist.DistNetworkError):
        raw.get("raw/k")


def test_reset_client_socket_reconnects_transparently(port):
    (writer,) = open_channels(port, 1)
    before = store_client_fds(port)
    chan = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 1, writer.job_token, deadline_s=10.0))
    own = store_client_fds(port) - before
    assert own, "could not find the channel's own store socket"
    writer.set(writer.key("k"), b"before")
    reset(own)
    assert chan.get(chan.key("k")) == b"before"
    assert chan.reconnects == 1

    # add after a reset: the request never left ("Broken pipe"), so it is retried exactly once.
    counter = chan.key("counter")
    assert chan.add(counter, 5) == 5
    reset(store_client_fds(port) - before)
    assert chan.add(counter, 2) == 7
    assert writer.add(counter, 0) == 7
    assert chan.reconnects == 2

    # and the store collectives keep working on the new connection
    reset(store_client_fds(port) - before)
    assert chan.gather("after-reset", b"ok", 1) == {0: b"ok"}
    chan.close()
    writer.close()


SERVER_SCRIPT = """
import datetime, sys, time
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
print(s.port, flush=True)
time.sleep(600)
"""


@pytest.fixture
def server_process():
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"server subprocess failed to start: {line!r}"
        yield proc, int(line)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)


def _wait_until_stopped(pid: int, timeout_s: float = 30.0) -> None:
    """SIGSTOP is delivered asynchronously: on a loaded host the server answered one more request
    after os.kill returned. Wait until the kernel reports the process stopped ('T')."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"server {pid} did not stop within {timeout_s} s of SIGSTOP")


def test_own_deadline_holds_when_the_server_stops_answering(server_process):
    proc, port = server_process
    (chan,) = open_channels(port, 1, deadline_s=10.0)
    chan.set(chan.key("k"), b"v")
    os.kill(proc.pid, signal.SIGSTOP)
    _wait_until_stopped(proc.pid)
    try:
        get = run_all([lambda: chan.get(chan.key("k"), deadline_s=1.0)])[0]
        assert isinstance(get, ControlChannelError), get
        assert "did not answer" in str(get)
        gather = run_all([lambda: chan.gather("reports", b"x", 1, deadline_s=1.0)])[0]
        assert isinstance(gather, ControlChannelError), gather
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    # The server is back: the next call builds a fresh client and the keys are intact.
    assert chan.get(chan.key("k"), deadline_s=10.0) == b"v"
    assert chan.reconnects >= 1
    chan.close()


def test_connect_to_a_listener_that_never_answers_fails_at_the_deadline():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # the kernel completes handshakes; nobody ever reads or replies
    try:
        cfg = ControlConfig(
            "127.0.0.1", listener.getsockname()[1], 0, 1, new_job_token(), deadline_s=1.0, connect_timeout_s=1.0
        )
        res = run_all([lambda: ControlChannel.connect(cfg)])[0]
        assert isinstance(res, ControlChannelError), res
        assert str(listener.getsockname()[1]) in str(res)
    finally:
        listener.close()


# ---------------------------------------------------------------- namespacing and generations


def test_other_job_token_or_generation_cannot_satisfy_a_gather(port):
    # 3 s, not 1: under a load of 17 on 2 cores, a 1 s deadline once ran out before the posts landed.
    a0, a1 = open_channels(port, 2, deadline_s=3.0)
    stray = ControlChannel.connect(ControlConfig("127.0.0.1", port, 1, 2, new_job_token(), deadline_s=3.0))
    # a stray process of another job posts rank 1's report for the same tag and generation ...
    res = run_all([lambda: stray.gather("reports", b"stray", 1), lambda: a0.gather("reports", b"a0", 1)])
    assert isinstance(res[0], RankLostError) and res[0].ranks == (0,), res  # the stray never meets its job
    assert isinstance(res[1], RankLostError) and res[1].ranks == (1,), res
    # ... and a rank of this job posting at an older generation does not count either.
    res = run_all([lambda: a1.gather("reports", b"old", 0), lambda: a0.gather("reports", b"a0", 1)])
    assert isinstance(res[1], RankLostError) and res[1].ranks == (1,)
    assert a0.key("x").startswith(a0.job_token + "/") and a0.key("x") != stray.key("x")


def test_data_plane_store_prefixes_never_repeat(port):
    (chan,) = open_channels(port, 1)
    for g in range(4):
        s = chan.data_plane_store(g)
        s.set("k", str(g).encode())
    # every generation wrote to its own prefix; none overwrote another
    assert [chan.get(chan.key("dp", f"gen{g}", "k")) for g in range(4)] == [str(g).encode() for g in range(4)]
    with pytest.raises(ValueError, match="advance_generation"):
        chan.data_plane_store(2)
    assert chan.advance_generation() == 1 and chan.advance_generation() == 2
    chan.close()


def test_gloo_groups_build_on_successive_generations(port):
    """The comm module's use: a real gloo group per generation on data_plane_store, after a real fault."""
    chans = open_channels(port, 2)
    gen0 = run_all([lambda c=c: make_gloo(c, 0) for c in chans])
    assert all(isinstance(pg, dist.ProcessGroupGloo) for pg in gen0), gen0
    assert run_all([lambda pg=pg: allreduce(pg) for pg in gen0]) == [2.0, 2.0]
    for c in chans:
        c.advance_generation()
    gen1 = run_all([lambda c=c: make_gloo(c, c.generation) for c in chans])
    assert run_all([lambda pg=pg: allreduce(pg) for pg in gen1]) == [2.0, 2.0]
    for c in chans:
        c.close()


def test_from_env(port, monkeypatch):
    for name in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AccelPactError, match="ACCELPACT_CONTROL_ADDR"):
        ControlChannel.from_env()
    monkeypatch.setenv("ACCELPACT_CONTROL_ADDR", f"127.0.0.1:{port}")
    with pytest.raises(AccelPactError, match="ACCELPACT_JOB_TOKEN"):
        ControlChannel.from_env()
    monkeypatch.setenv("ACCELPACT_JOB_TOKEN", "tok")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(AccelPactError, match="RANK"):
        ControlChannel.from_env()
    chan = ControlChannel.from_env(rank=2)
    assert (chan.rank, chan.world_size, chan.job_token, chan.generation) == (2, 3, "tok", 0)
    chan.heartbeat()
    assert chan.last_seen(2) is not None and chan.last_seen(0) is None
    chan.close()
    with pytest.raises(ValueError, match="job_token"):
        ControlConfig("127.0.0.1", port, 0, 1, "a/b")


# ---------------------------------------------------------------- is_comm_fault on real gloo errors


def make_gloo(chan: ControlChannel, generation: int, timeout_s: float = 20.0) -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(
        chan.data_plane_store(generation), chan.rank, chan.world_size, datetime.timedelta(seconds=timeout_s)
    )


def allreduce(pg: dist.ProcessGroupGloo) -> float:
    t = torch.ones(4)
    pg.allreduce([t]).wait()
    return float(t[0])


def test_real_gloo_faults_are_comm_faults(port):
    chans = open_channels(port, 2)
    store_fds = lambda local, peer: port in (local[1], peer[1])  # noqa: E731
    before = tcp_fds(lambda local, peer: True)
    pgs = run_all([lambda c=c: make_gloo(c, 0) for c in chans])
    assert run_all([lambda pg=pg: allreduce(pg) for pg in pgs]) == [2.0, 2.0]

    # 1. connection reset on our own gloo sockets (the store's sockets are left alone)
    gloo_fds = tcp_fds(lambda local, peer: not store_fds(local, peer)) - before
    assert gloo_fds
    reset(gloo_fds)
    errors = run_all([lambda pg=pg: allreduce(pg) for pg in pgs])
    for e in errors:
        assert isinstance(e, RuntimeError) and is_comm_fault(e), e

    # 2. a peer that never shows up at the collective: "Timed out waiting"
    pgs = run_all([lambda c=c: make_gloo(c, 1, timeout_s=1.0) for c in chans])
    timeout_err = run_all([lambda: allreduce(pgs[0])])[0]
    assert isinstance(timeout_err, RuntimeError) and "timed out" in str(timeout_err).lower()
    assert is_comm_fault(timeout_err)

    # 3. a peer that never joins the new group's rendezvous
    build_err = run_all([lambda: make_gloo(chans[0], 2, timeout_s=1.0)])[0]
    assert isinstance(build_err, RuntimeError), build_err
    assert is_comm_fault(build_err)
    for c in chans:
        c.close()


@pytest.mark.parametrize(
    "text",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:30857",
        "Connection closed by peer [10.0.0.2]:41234",
        "Read error [10.0.0.2]:41234: Connection reset by peer",
        "Timed out waiting 5000ms for recv operation to complete",
        "Write error [10.0.0.2]:41234: Broken pipe",
        "Socket Timeout",
        "Gloo connectFullMesh failed with [..] no error",
        "connect [10.0.0.2]:41234: Connection refused",
    ],
)
def test_gloo_transport_texts_are_comm_faults(text):
    """The texts gloo raises in torch 2.13, without the source path that also marks most of them."""
    assert is_comm_fault(RuntimeError(text))
    assert not is_comm_fault(StateDivergedError(text))


def test_unrelated_errors_are_not_comm_faults():
    try:
        torch.ones(2) + torch.ones(3)
    except RuntimeError as exc:
        shape_err = exc
    assert not is_comm_fault(shape_err)
    assert not is_comm_fault(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert not is_comm_fault(MemoryError())
    assert not is_comm_fault(KeyboardInterrupt())
    assert not is_comm_fault(ValueError("Connection closed by peer"))  # not a RuntimeError
    assert not is_comm_fault(RuntimeError("ProcessGroupGloo::allreduce: unsupported layout"))
    # Unrecoverable AccelPact errors never count, whatever their text or cause.
    fault = RuntimeError("Connection closed by peer")
    assert not is_comm_fault(StateDivergedError("Connection closed by peer"))
    wrapped = ControlChannelError("store down")
    wrapped.__cause__ = fault
    assert not is_comm_fault(wrapped)
    # A comm fault stays one when explicitly wrapped, but not when a bug merely happened during handling.
    try:
        try:
            raise fault
        except RuntimeError:
            raise ValueError("a bug in the handler")  # noqa: B904 - the implicit context is what is tested
    except ValueError as during:
        assert during.__context__ is not None and not is_comm_fault(during)
    explicit = KeyError("lookup")
    explicit.__cause__ = fault
    assert is_comm_fault(explicit)
    cf = CommFault("vote failed", phase="in_vote", cause=fault)
    assert is_comm_fault(cf) and cf.__cause__ is fault and cf.phase == "in_vote"
