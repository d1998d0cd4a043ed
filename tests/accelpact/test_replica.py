"""Buddy replicas on real processes and real TCP: push, keep two, fetch back bit-identically, refuse
another job, survive a socket reset, never expose a half-received replica; plus the buddy mapping."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.snapshot import replica as replica_mod
from accelpact.snapshot._replica_wire import payload_files, send_frame
from accelpact.snapshot.replica import BuddyLostError, Replication, buddy_of, host_groups, wards_of
from tests.accelpact._replica_rank import digest_dir, payload, write_slot

ROOT = Path(__file__).resolve().parents[2]
NBYTES = 3 << 20


# ---------------------------------------------------------------------------------------------- mapping


def test_buddy_is_same_local_rank_on_next_host():
    assert [buddy_of(r, 4, local_world_size=2) for r in range(4)] == [2, 3, 0, 1]
    assert [buddy_of(r, 6, local_world_size=2) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert wards_of(0, 6, local_world_size=2) == [4]


def test_one_host_buddy_is_next_rank_and_single_rank_has_none(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert [buddy_of(r, 3) for r in range(3)] == [1, 2, 0]
    assert buddy_of(0, 1) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert [buddy_of(r, 4) for r in range(4)] == [2, 3, 0, 1]  # torchrun's variable when not given


def test_explicit_hosts_and_bad_lists():
    hosts = [[0, 1, 2], [3]]
    assert host_groups(4, hosts=hosts) == hosts
    assert [buddy_of(r, 4, hosts=hosts) for r in range(4)] == [3, 3, 3, 0]  # a smaller host wraps
    with pytest.raises(ValueError, match="each rank once"):
        host_groups(4, hosts=[[0, 1], [1, 2, 3]])


# ---------------------------------------------------------------------------------------------- real processes


@pytest.fixture
def store():
    server, port = start_control_server()
    yield port
    del server


def _spawn(tmp: Path, cfg: dict, name: str) -> subprocess.Popen:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    log = open(tmp / f"{name}.log", "wb")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.accelpact._replica_rank", str(path)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait_file(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None and not path.exists():
            log = path.with_name(path.stem + ".log")
            raise AssertionError(f"rank process exited {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{path} not written in {timeout_s} s")


def _chan(port: int, token: str, rank: int, world: int) -> ControlChannel:
    return ControlChannel.connect(
        ControlConfig(host="127.0.0.1", port=port, rank=rank, world_size=world, job_token=token, deadline_s=30)
    )


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); test_replica_restore pushes and fetches, bit-identically
def test_two_ranks_push_to_each_other_and_a_fresh_process_fetches(tmp_path, store):
    """Rank 0 and 1 (own processes, own host roots) push 3 steps each; each keeps the other's last two;
    rank 0's own directory is deleted; a fresh process fetches rank 0's newest replica bit-identically,
    and a given older step too; the oldest step is gone."""
    token, roots = new_job_token(), [tmp_path / "host0", tmp_path / "host1"]
    procs = [
        _spawn(
            tmp_path,
            {
                "port": store,
                "token": token,
                "rank": r,
                "world_size": 2,
                "root": str(roots[r]),
                "mode": "push",
                "steps": [1, 2, 3],
                "nbytes": NBYTES,
                "out": str(tmp_path / f"p{r}.out"),
            },
            f"p{r}",
        )
        for r in range(2)
    ]
    try:
        stats = [_wait_file(tmp_path / f"p{r}.out", procs[r]) for r in range(2)]
        for r in range(2):
            assert stats[r]["buddy"] == 1 - r
            assert stats[r]["stats"]["pushed"] == 3 and stats[r]["stats"]["dropped"] == 0
        held = sorted(
            json.loads((d / "marker.json").read_text())["step"]
            for d in (roots[1] / token / "replica" / "rank0").glob("slot*")
        )
        assert held == [2, 3]  # the last two complete replicas, not the first
        import shutil

        shutil.rmtree(roots[0] / token / "rank0")  # rank 0's own snapshot is lost

        for step, name in ((None, "f_new"), (2, "f_old"), (1, "f_gone")):
            dest = tmp_path / "fresh" / name
            proc = _spawn(
                tmp_path,
                {
                    "port": store,
                    "token": token,
                    "rank": 0,
                    "world_size": 2,
                    "root": str(tmp_path / "host0b"),
                    "mode": "fetch",
                    "src": 0,
                    "step": step,
                    "dest": str(dest),
                    "out": str(tmp_path / f"{name}.out"),
                },
                name,
            )
            res = _wait_file(tmp_path / f"{name}.out", proc)
            proc.wait(60)
            if step == 1:
                assert res["marker"] is None and "holds no replica of rank 0 at step 1" in res["error"]
                assert "[3, 2]" in res["error"]
                continue
            want = 3 if step is None else step
            assert res["marker"]["step"] == want and res["marker"]["rank"] == 0
            assert res["files"]["shard.bin"] == hashlib.sha256(payload(0, want, NBYTES)).hexdigest()
            assert (dest / "shard.bin").read_bytes() == payload(0, want, NBYTES)
    finally:
        ControlChannel.connect(ControlConfig(host="127.0.0.1", port=store, rank=0, world_size=2, job_token=token)).set(
            f"{token}/test/done", b"1"
        )
        for p in procs:
            p.wait(60)


def test_another_job_token_is_refused_and_changes_nothing(tmp_path, store):
    token = new_job_token()
    chan = _chan(store, token, 1, 2)
    holder = Replication(chan, rank=1, world_size=2, root=tmp_path / "h1", bind_host="127.0.0.1")
    src_chan = _chan(store, token, 0, 2)
    src = Replication(src_chan, rank=0, world_size=2, root=tmp_path / "h0", bind_host="127.0.0.1")
    try:
        slot = tmp_path / "h0" / token / "rank0" / "slot0"
        src.push(slot, write_slot(slot, token, 0, 2, 7, 4096))
        assert src.flush(30) and src.pushed == 1

        # Another job that knows the address (it is in the store) but not the token.
        other = new_job_token()
        host, port = holder.server.address
        for body in (
            {"op": "get", "src": 0, "step": None},
            {"op": "put", "src": 0, "step": 8, "files": [], "marker": {"job_token": other, "rank": 0, "step": 8}},
        ):
            with socket.create_connection((host, port), timeout=5) as s:
                send_frame(s, body, other)
                s.settimeout(5)
                assert s.recv(1) == b""  # closed without an answer
        assert holder.server.refused == 2
        # The same job's GET through the normal path still gets step 7, untouched.
        fresh_chan = _chan(store, token, 0, 2)
        fetcher = Replication(
            fresh_chan, rank=0, world_size=2, root=tmp_path / "h0b", bind_host="127.0.0.1", start=False
        )
        marker = fetcher.fetch(0, tmp_path / "got")
        assert marker is not None and marker["step"] == 7
        # A fetcher with another token is refused too (it cannot even read the address signature).
        foreign = Replication(
            _chan(store, other, 0, 2), rank=0, world_size=2, root=tmp_path / "x", bind_host="127.0.0.1", start=False
        )
        foreign.addresses._cache[1] = (host, port)
        assert foreign.fetch(0, tmp_path / "stolen") is None
        assert not (tmp_path / "stolen").exists()
    finally:
        src.close()
        holder.close()


def test_half_received_replica_is_never_complete(tmp_path, store):
    """A sender that dies mid-payload leaves the previous replica as the newest, and no slot of the torn one."""
    token = new_job_token()
    holder = Replication(_chan(store, token, 1, 2), rank=1, world_size=2, root=tmp_path / "h1", bind_host="127.0.0.1")
    src = Replication(_chan(store, token, 0, 2), rank=0, world_size=2, root=tmp_path / "h0", bind_host="127.0.0.1")
    try:
        s0 = tmp_path / "h0" / token / "rank0" / "slot0"
        src.push(s0, write_slot(s0, token, 0, 2, 1, NBYTES))
        assert src.flush(30) and src.pushed == 1
        s1 = tmp_path / "h0" / token / "rank0" / "slot1"
        marker = write_slot(s1, token, 0, 2, 2, NBYTES)
        files = payload_files(s1)
        with socket.create_connection(holder.server.address, timeout=5) as s:
            send_frame(
                s, {"op": "put", "src": 0, "step": 2, "files": [list(f) for f in files], "marker": marker}, token
            )
            s.sendall(b"x" * 1000)  # then the sender dies
        time.sleep(0.5)
        assert [st for st, _, _ in holder.server.held(0)] == [1]
        base = tmp_path / "h1" / token / "replica" / "rank0"
        # The torn replica was received in place into the free slot, whose marker is never written.
        assert sorted(p.name for p in base.iterdir() if (p / "marker.json").exists()) == ["slot0"]
    finally:
        src.close()
        holder.close()


def _wait_for(cond, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_replica_is_received_in_place_and_a_torn_push_costs_only_the_older_one(tmp_path, store):
    """With two complete replicas (steps 1, 2), a push of step 3 that breaks half-way overwrites the
    older one in place: that slot loses its marker first, step 2 stays held and served. The next
    complete push of 3 lands in the same files (same inode: the holder's kept mapping), and a fetch
    returns it exactly. A new PUT also cuts off a PUT of the same source that is still hanging."""
    token = new_job_token()
    holder = Replication(_chan(store, token, 1, 2), rank=1, world_size=2, root=tmp_path / "h1", bind_host="127.0.0.1")
    src = Replication(_chan(store, token, 0, 2), rank=0, world_size=2, root=tmp_path / "h0", bind_host="127.0.0.1")
    own = tmp_path / "h0" / token / "rank0"
    try:
        for step in (1, 2):
            src.push(own / f"slot{step % 2}", write_slot(own / f"slot{step % 2}", token, 0, 2, step, NBYTES))
            assert src.flush(30)
        assert src.pushed == 2 and [st for st, _, _ in holder.server.held(0)] == [2, 1]
        older = next(d for _, d, _ in holder.server.held(0) if read_step(d) == 1)
        inode = (older / "shard.bin").stat().st_ino

        marker = write_slot(own / "slot1", token, 0, 2, 3, NBYTES)
        files = payload_files(own / "slot1")
        hanging = socket.create_connection(holder.server.address, timeout=5)
        send_frame(
            hanging, {"op": "put", "src": 0, "step": 3, "files": [list(f) for f in files], "marker": marker}, token
        )
        hanging.sendall(payload(0, 3, NBYTES)[: NBYTES // 2])  # half, then silence (no reset, no close)
        _wait_for(lambda: not (older / "marker.json").exists())
        assert [st for st, _, _ in holder.server.held(0)] == [2]  # the newest complete replica is untouched

        src.push(own / "slot1", marker)  # the next push of 3 cuts the hanging one off, then lands
        assert src.flush(30) and src.pushed == 3 and src.dropped == 0, src.last_error
        assert hanging.recv(1) == b""  # the holder shut the hanging PUT down
        hanging.close()
        assert [st for st, _, _ in holder.server.held(0)] == [3, 2]
        assert read_step(older) == 3 and (older / "shard.bin").stat().st_ino == inode  # in place
        got = src.fetch(0, tmp_path / "back")
        assert got["step"] == 3 and (tmp_path / "back" / "shard.bin").read_bytes() == payload(0, 3, NBYTES)
    finally:
        src.close()
        holder.close()


def read_step(slot: Path) -> int | None:
    try:
        return json.loads((slot / "marker.json").read_text())["step"]
    except OSError:
        return None


def test_socket_reset_during_push_is_retried_not_lost(tmp_path, store):
    """The fault injector's reset (every TCP connection of the process but the store's) hits the push
    mid-transfer; the pusher retries and the buddy ends up with the exact replica."""
    from accelpact.testing import reset_own_gloo_sockets

    token = new_job_token()
    holder = _spawn(
        tmp_path,
        {
            "port": store,
            "token": token,
            "rank": 1,
            "world_size": 2,
            "root": str(tmp_path / "h1"),
            "mode": "push",
            "steps": [],
            "nbytes": 0,
            "out": str(tmp_path / "h.out"),
        },
        "holder",
    )
    src = None
    try:
        _wait_file(tmp_path / "h.out", holder)
        src = Replication(_chan(store, token, 0, 2), rank=0, world_size=2, root=tmp_path / "h0", bind_host="127.0.0.1")
        slot = tmp_path / "h0" / token / "rank0" / "slot0"
        big = 64 << 20
        stop = threading.Event()
        resets = []

        def resetter() -> None:  # resets until the pusher saw one
            while not stop.is_set() and src.retried == 0:
                resets.append(reset_own_gloo_sockets([store]))
                time.sleep(0.002)

        marker = write_slot(slot, token, 0, 2, 5, big)
        t = threading.Thread(target=resetter)
        t.start()
        src.push(slot, marker)
        assert src.flush(120)
        stop.set()
        t.join()
        assert src.retried >= 1, f"no reset hit the push (resets: {sum(resets)} sockets)"
        assert src.pushed == 1 and src.dropped == 0, src.last_error
        got = src.fetch(0, tmp_path / "back")
        assert got is not None and got["step"] == 5
        assert digest_dir(tmp_path / "back")["shard.bin"] == hashlib.sha256(payload(0, 5, big)).hexdigest()
    finally:
        _chan(store, token, 0, 2).set(f"{token}/test/done", b"1")
        if src is not None:
            src.close()
        holder.wait(60)


def test_unreachable_buddy_is_dropped_counted_and_rank_plus_buddy_lost_names_both(tmp_path, store, capfd):
    token = new_job_token()
    chan = _chan(store, token, 0, 2)
    # The buddy published an address, then died: nothing listens there.
    dead = socket.create_server(("127.0.0.1", 0))
    from accelpact.control.notice_auth import sign

    chan.set(
        chan.key("replica", "addr", "1"), sign({"rank": 1, "host": "127.0.0.1", "port": dead.getsockname()[1]}, token)
    )
    dead.close()
    src = Replication(chan, rank=0, world_size=2, root=tmp_path / "h0", bind_host="127.0.0.1")
    try:
        for step in (1, 2):
            slot = tmp_path / "h0" / token / "rank0" / f"slot{step % 2}"
            t0 = time.monotonic()
            src.push(slot, write_slot(slot, token, 0, 2, step, 1024))
            # push only queues: training never waits for the buddy. A push that waited would sleep through
            # its retry pauses against the dead address (0.75 s) before dropping; 0.1 s was exceeded once
            # (0.105 s) at load 10 on 2 cores, so the bound is what discriminates, not a speed.
            assert time.monotonic() - t0 < sum(replica_mod._RETRY_PAUSES_S)
            assert src.flush(30)
        assert src.dropped == 2 and src.pushed == 0
        assert capfd.readouterr().err.count("not replicated to buddy rank 1") == 1  # logged once
        with pytest.raises(BuddyLostError) as err:
            src.fetch_or_raise(0, tmp_path / "none")
        assert err.value.ranks == (0, 1)
        assert "rank 0 and its buddy rank 1 were both lost" in str(err.value) and "no in-memory copy" in str(err.value)
    finally:
        src.close()


def _put_raw(holder: Replication, slot: Path, token: str, step: int, marker: dict, flip: bool) -> dict:
    """One PUT to ``holder`` as a pusher sends it, with one bit of the payload flipped in transit."""
    from accelpact.snapshot._replica_wire import recv_frame

    files = payload_files(slot)
    with socket.create_connection(holder.server.address, timeout=5) as s:
        send_frame(s, {"op": "put", "src": 0, "step": step, "files": [list(f) for f in files], "marker": marker}, token)
        for name, size in files:
            data = bytearray((slot / name).read_bytes())
            if flip:
                data[size // 2] ^= 0x01
            s.sendall(bytes(data))
        send_frame(s, {"commit": True}, token)
        return recv_frame(s, token)


def test_a_replica_corrupted_on_the_way_is_never_served_nor_restored(tmp_path, store):
    """The holder checks marker and sizes on receipt (no CRC pass per step) and the CRC-32s before it
    serves: a replica with a bit flipped in transit is never served; the older valid one is served
    instead, and a fetching rank's loader would reject the flipped bytes even if it got them."""
    from accelpact.snapshot.load import check_slot

    token = new_job_token()
    holder = Replication(_chan(store, token, 1, 2), rank=1, world_size=2, root=tmp_path / "h1", bind_host="127.0.0.1")
    fetcher = Replication(_chan(store, token, 0, 2), rank=0, world_size=2, root=tmp_path / "h0b", bind_host="127.0.0.1")
    try:
        good = write_slot(tmp_path / "h0" / token / "rank0" / "slot0", token, 0, 2, 4, 1 << 16)
        assert _put_raw(holder, tmp_path / "h0" / token / "rank0" / "slot0", token, 4, good, flip=False)["ok"]
        bad_slot = tmp_path / "h0" / token / "rank0" / "slot1"
        bad = write_slot(bad_slot, token, 0, 2, 5, 1 << 16)
        assert _put_raw(holder, bad_slot, token, 5, bad, flip=True)["ok"]  # sizes match: accepted on receipt
        on_disk = holder.server.source_dir(0)
        assert sorted(json.loads((d / "marker.json").read_text())["step"] for d in on_disk.glob("slot*")) == [4, 5]
        # ... but not held as valid, and never served: the fetch gets step 4, bit-identical
        assert [st for st, _, _ in holder.server.held(0)] == [4]
        got = fetcher.fetch(0, tmp_path / "fetched")
        assert got["step"] == 4 and (tmp_path / "fetched" / "shard.bin").read_bytes() == payload(0, 4, 1 << 16)
        assert (
            fetcher.fetch(0, tmp_path / "f5", step=5) is None
            and "holds no replica of rank 0 at step 5" in fetcher.last_error
        )
        # the flipped replica as it lies at the holder: the restoring rank's check refuses it too
        flipped = next(d for d in on_disk.glob("slot*") if json.loads((d / "marker.json").read_text())["step"] == 5)
        _, why = check_slot(flipped, job_token=token, rank=0, world_size=2, step=5, verify=True)
        assert why is not None and "crc32" in why
        # a replica whose files disagree with its marker's sizes is still refused on receipt, not installed
        lying = dict(
            bad, step=6, files={**bad["files"], "shard.bin": {**bad["files"]["shard.bin"], "nbytes": (1 << 16) + 1}}
        )
        ack = _put_raw(holder, bad_slot, token, 6, lying, flip=False)
        assert ack["ok"] is False and "marker, sizes" in ack["error"]
        assert sorted(json.loads((d / "marker.json").read_text())["step"] for d in on_disk.glob("slot*")) == [4, 5]
    finally:
        fetcher.close()
        holder.close()


def test_confirm_makes_push_return_only_once_the_buddy_holds_the_replica(tmp_path, store):
    """Replication(confirm=True): push (the snapshot's on_complete, on its copy thread) returns only after
    the buddy acknowledged the replica, so the guard's wait for a complete snapshot before the next vote
    covers the push; an unreachable buddy makes it return after the drop, not hang."""
    from accelpact.snapshot._replica_server import read_marker

    token = new_job_token()
    holder = Replication(_chan(store, token, 1, 2), rank=1, world_size=2, root=tmp_path / "h1", bind_host="127.0.0.1")
    src = Replication(
        _chan(store, token, 0, 2), rank=0, world_size=2, root=tmp_path / "h0", bind_host="127.0.0.1", confirm=True
    )
    try:
        for step in (4, 6):
            slot = tmp_path / "h0" / token / "rank0" / f"slot{step // 2 % 2}"
            src.push(slot, write_slot(slot, token, 0, 2, step, 1 << 20))
            held = [
                m["step"]
                for s in (0, 1)
                if (m := read_marker(tmp_path / "h1" / token / "replica" / "rank0" / f"slot{s}")) is not None
            ]
            assert step in held, held  # already at the buddy when push returned
            assert src.pushed == step // 2 - 1
    finally:
        src.close()
        holder.close()

    # The buddy's address now points at nothing: the confirmed push retries, drops, and returns.
    token = new_job_token()
    chan = _chan(store, token, 0, 2)
    dead = socket.create_server(("127.0.0.1", 0))
    from accelpact.control.notice_auth import sign

    chan.set(
        chan.key("replica", "addr", "1"), sign({"rank": 1, "host": "127.0.0.1", "port": dead.getsockname()[1]}, token)
    )
    dead.close()
    lone = Replication(chan, rank=0, world_size=2, root=tmp_path / "h0x", bind_host="127.0.0.1", confirm=True)
    try:
        slot = tmp_path / "h0x" / token / "rank0" / "slot0"
        lone.push(slot, write_slot(slot, token, 0, 2, 2, 1024))
        assert lone.dropped == 1 and lone.pushed == 0  # counted before push returned
    finally:
        lone.close()
