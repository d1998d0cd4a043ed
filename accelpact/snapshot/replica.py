"""Buddy replicas: every snapshot slot of a rank is copied to a buddy rank on another host.

A rank's own snapshots live in its host's shared memory, so they survive the process but not the
host. Each completed slot is therefore also pushed to the rank's *buddy*, which keeps the last two
complete replicas per source (``accelpact.snapshot._replica_server``). A replacement whose own slot
is missing or corrupt fetches the replica back (:meth:`Replication.fetch`).

Who is whose buddy, and where its server listens: accelpact.snapshot.buddies. The channel is plain
TCP between ranks on their control-network addresses, never the training data plane, so a
data-plane fault never reaches it. Requests are signed with the job token
(``accelpact.control.notice_auth``): another job can neither read nor overwrite this job's replicas.

A push never blocks training: :meth:`Replication.push` (the snapshotter's ``on_complete`` hook) only
hands the slot to a pusher thread, which sends the newest pending slot; slots that arrive while one
is being sent replace each other (counted in ``skipped``). A connection that breaks (a socket reset:
the fault injector and the gloo backend's abort reset every TCP connection of the process that is
not a store connection, these included) is retried with a fresh connection and a fresh look-up of
the buddy's address; a buddy that stays unreachable costs one log line, and the slot is dropped
(``dropped``); the next snapshot tries again.

``confirm=True`` makes :meth:`Replication.push` return only once its slot was sent (or dropped, or
superseded). The hook runs on the snapshot's own thread and the guard waits for the snapshot to be
complete before the next step's vote, so the push then counts as part of the snapshot: a rank enters
the vote of step s + 1 only after the buddy acknowledged its replica of s. That is what bounds the
steps a heal after a host loss replays (``accelpact.snapshot.push_rule.replay_bound``); the price is
that a push slower than the next step's forward and backward blocks training. Which snapshots are
pushed at all is the Snapshotter's ``SnapshotConfig.push_every``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelpact.errors import RankLostError
from accelpact.snapshot._replica_server import ReplicaServer, marker_matches, read_marker
from accelpact.snapshot._replica_wire import (
    MARKER,
    WireError,
    check_file_list,
    payload_files,
    recv_files,
    recv_frame,
    send_files,
    send_frame,
    write_json_atomic,
)
from accelpact.snapshot.buddies import AddressBook, AddressStore, buddy_of, control_bind_address, host_groups, wards_of
from accelpact.snapshot.slots import SnapshotError

if TYPE_CHECKING:
    from accelpact.control.channel import ControlChannel

__all__ = [
    "buddy_of",
    "wards_of",
    "host_groups",
    "control_bind_address",
    "check_replica",
    "Replication",
    "ReplicaServer",
    "BuddyLostError",
]

_RETRY_PAUSES_S = (0.0, 0.05, 0.2, 0.5)  # a reset heals at once; a replaced buddy needs a moment to publish


class BuddyLostError(RankLostError, SnapshotError):
    """A rank and its buddy were both lost: no copy of the rank's snapshot survives in memory.

    A RankLostError (``ranks``: the lost rank(s) and their buddies) and a SnapshotError (what
    ``restore_latest`` raises when some rank holds no snapshot), so either ``except`` catches it."""


def check_replica(job_token: str, world_size: int, *, checksums: bool = True) -> Callable[[Path, dict[str, Any]], bool]:
    """The snapshot reader's own check (marker fields, sizes, and with ``checksums`` the CRC-32s) as a
    replica validator."""

    def ok(slot: Path, marker: dict[str, Any]) -> bool:
        from accelpact.snapshot.load import check_slot  # torch: only when a replica is checked

        _, why = check_slot(
            slot,
            job_token=job_token,
            rank=int(marker.get("rank", -1)),
            world_size=world_size,
            step=marker.get("step"),
            verify=checksums,
        )
        return why is None

    return ok


# ---------------------------------------------------------------------------------------------- replication


class Replication:
    """One rank's end of buddy replication: its server (holding its wards' replicas), its pusher, its fetch.

    ``store`` is the rank's ``accelpact.ControlChannel`` (only ``key``/``set``/``get`` are used);
    ``job_token`` the snapshots' token, when it is not the channel's (the Snapshotter's ``job_token``).
    ``root`` is this host's snapshot root. ``validate(slot_dir, marker)`` checks a replica before it is
    served; the default is the snapshot reader's own check (:func:`check_replica`: marker, sizes,
    CRC-32s), so a replica corrupted on the way is never served, and the fetching rank's loader checks
    the CRC-32s again before it loads a byte. On receipt the default checks only the marker and the
    sizes: a CRC pass over every received replica cost every holder a full read of each snapshot per
    step (31 MiB per step at mistral_tiny, on the cores training uses), while a replica is fetched only
    after a loss. A custom ``validate`` is used on receipt too (``receive_check`` overrides that).

    Use: ``Snapshotter(..., on_complete=rep.push)`` on every rank, and ``restore_latest(...,
    fetch=rep)`` in a restarted or replacement rank (the object is the fetch callable; when some
    rank holds neither a snapshot nor a replica it raises :class:`BuddyLostError` naming the buddies).

    ``confirm``: :meth:`push` waits until its slot was sent (see the module docstring: the bound on
    replayed steps after a host loss needs it; default off, pushes are asynchronous).

    Counters: ``pushed``, ``retried``, ``dropped``, ``skipped``, ``push_bytes``, ``push_s`` (wall time
    spent in successful pushes: ``push_bytes / push_s`` is the measured transfer speed).
    """

    def __init__(
        self,
        store: AddressStore,
        *,
        rank: int,
        world_size: int,
        root: Path | str,
        bind_host: str,
        topology: dict[str, Any] | None = None,
        validate: Callable[[Path, dict[str, Any]], bool] | None = None,
        job_token: str | None = None,
        start: bool = True,
        receive_check: Callable[[Path, dict[str, Any]], bool] | None = None,
        confirm: bool = False,
    ) -> None:
        self.store = store
        self.confirm = bool(confirm)
        # The snapshots' job token: it names their directories, is checked in every marker and keys
        # the requests' signatures. The control channel's token by default.
        self.job_token = job_token or store.job_token
        if validate is None:
            validate = check_replica(self.job_token, world_size)
            if receive_check is None:
                receive_check = check_replica(self.job_token, world_size, checksums=False)
        self.rank, self.world_size = rank, world_size
        self.root = Path(root)
        self.topology = dict(topology or {})
        self.buddy = buddy_of(rank, world_size, **self.topology)
        self.addresses = AddressBook(store, self.job_token)  # the servers' addresses, this one's included
        self.server = ReplicaServer(
            job_token=self.job_token,
            rank=rank,
            world_size=world_size,
            root=self.root,
            host=bind_host,
            validate=validate,
            receive_check=receive_check,
        )
        self.pushed = self.retried = self.dropped = self.skipped = self.push_bytes = 0
        self.push_s = 0.0
        self.last_error: str | None = None
        self._pending: tuple[Path, dict[str, Any]] | None = None
        self._busy = False
        # Sequence numbers of queued and finished (sent, dropped or superseded) slots: what confirm waits on.
        self._queued = self._finished = 0
        self._cv = threading.Condition()
        self._closed = False
        self._warned_drop = False
        self._push_cpu: deque[float] = deque(maxlen=16)  # the sender's CPU per push (the tax budget's measure)
        self._thread = threading.Thread(target=self._push_loop, name=f"accelpact-push-r{rank}", daemon=True)
        if start:
            self.start()

    @classmethod
    def from_env(cls, chan: ControlChannel, root: Path | str | None = None, **kwargs: Any) -> Replication:
        """For a rank with a connected ``accelpact.ControlChannel``: rank and world size from it, the
        root from ``ACCELPACT_SNAPSHOT_ROOT`` (else /dev/shm/accelpact), the bind address on the control
        network (:func:`control_bind_address`), hosts from ``LOCAL_WORLD_SIZE``."""
        from accelpact.snapshot.layout import default_root

        return cls(
            chan,
            rank=chan.rank,
            world_size=chan.world_size,
            root=root or default_root(),
            bind_host=control_bind_address(chan.config.host),
            **kwargs,
        )

    def start(self) -> None:
        """Serve, publish the address under the job token, start the pusher (once: a second call is a no-op)."""
        if self._thread.is_alive() or self._closed:
            return
        host, port = self.server.start()
        self.addresses.publish(self.rank, host, port)
        self._thread.start()

    # ------------------------------------------------------------------ push (source side)

    def push(self, slot_dir: Path, marker: dict[str, Any]) -> None:
        """The snapshotter's ``on_complete`` hook: queue this slot for the buddy and return at once."""
        if self.buddy is None:
            return
        with self._cv:
            if self._pending is not None:
                self.skipped += 1  # a newer slot supersedes one that never left
            self._pending = (Path(slot_dir), dict(marker))
            self._queued += 1
            mine = self._queued
            self._cv.notify_all()
            if self.confirm:  # on the snapshot's thread: the snapshot is complete once its replica is
                while self._finished < mine and not self._closed and self._thread.is_alive():
                    self._cv.wait()

    def push_cpu_s(self) -> float | None:
        """The median CPU seconds of this rank's newest pushes (the sender's side); None before the first."""
        done = list(self._push_cpu)
        return statistics.median(done) if done else None

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued slot was pushed or dropped; False at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def _push_loop(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._pending is None:
                    return
                slot_dir, marker = self._pending
                self._pending, self._busy = None, True
                taken = self._queued  # this slot and every one it superseded
            c0 = time.thread_time()
            try:
                self._push_with_retries(slot_dir, marker)
            finally:
                self._push_cpu.append(time.thread_time() - c0)
                with self._cv:
                    self._busy = False
                    self._finished = taken
                    self._cv.notify_all()

    def _push_with_retries(self, slot_dir: Path, marker: dict[str, Any]) -> None:
        assert self.buddy is not None
        if not marker_matches(marker, self.job_token, self.rank):
            self.last_error = (
                f"the slot's marker names job/rank {marker.get('job_token')!r}/{marker.get('rank')}, "
                f"this replication pushes for rank {self.rank} of another job token: pass the "
                "Snapshotter's job_token to Replication(job_token=...)"
            )
            self._drop(marker)
            return
        for attempt, pause in enumerate(_RETRY_PAUSES_S):
            time.sleep(pause)
            t0 = time.monotonic()
            try:
                sent = self._push_once(slot_dir, marker, fresh=attempt > 0)
            except Exception as exc:  # noqa: BLE001 - a reset, a refusal, a vanished buddy: retry, then drop
                self.last_error = f"{type(exc).__name__}: {exc}"
                if attempt + 1 < len(_RETRY_PAUSES_S):
                    self.retried += 1
                continue
            if sent is None:
                return  # withdrawn: the slot changed under the send, a newer push follows
            self.pushed += 1
            self.push_bytes += sent
            self.push_s += time.monotonic() - t0
            if self._warned_drop:
                print(
                    f"[accelpact] rank {self.rank}: replica pushes to buddy rank {self.buddy} work again",
                    file=sys.stderr,
                    flush=True,
                )
                self._warned_drop = False
            return
        self._drop(marker)

    def _drop(self, marker: dict[str, Any]) -> None:
        self.dropped += 1
        if not self._warned_drop:
            self._warned_drop = True
            print(
                f"[accelpact] rank {self.rank}: snapshot of step {marker.get('step')} not replicated to buddy rank "
                f"{self.buddy} ({self.last_error}); training goes on, the next snapshot tries again (failures are "
                f"counted, logged once)",
                file=sys.stderr,
                flush=True,
            )

    def _push_once(self, slot_dir: Path, marker: dict[str, Any], fresh: bool) -> int | None:
        files = payload_files(slot_dir)
        with self.addresses.connect(self.buddy, fresh) as sock:  # type: ignore[arg-type]
            send_frame(
                sock,
                {
                    "op": "put",
                    "src": self.rank,
                    "step": marker.get("step"),
                    "files": [list(f) for f in files],
                    "marker": marker,
                },
                self.job_token,
            )
            send_files(sock, slot_dir, files)
            # The slot is the snapshotter's: if it started rewriting it meanwhile, withdraw the replica.
            unchanged = read_marker(slot_dir) == marker
            send_frame(sock, {"commit": unchanged}, self.job_token)
            ack = recv_frame(sock, self.job_token)
        if not unchanged:
            return None
        if not ack.get("ok"):
            raise WireError(f"buddy rank {self.buddy} refused the replica: {ack.get('error')}")
        return sum(size for _, size in files)

    # ------------------------------------------------------------------ fetch (replacement side)

    def fetch(self, src_rank: int, dest_dir: Path | str, step: int | None = None) -> dict[str, Any] | None:
        """Copy the newest valid replica of ``src_rank`` (or the one of ``step``) from its buddy into
        ``dest_dir`` (a slot directory, marker written last); its marker, or None when the buddy holds
        none or cannot be reached (``last_error`` says which)."""
        holder = buddy_of(src_rank, self.world_size, **self.topology)
        if holder is None:
            self.last_error = "a single rank has no buddy"
            return None
        dest = Path(dest_dir)
        for attempt, pause in enumerate(_RETRY_PAUSES_S):
            time.sleep(pause)
            try:
                return self._fetch_once(holder, src_rank, dest, step, fresh=attempt > 0)
            except _NotHeld as why:
                self.last_error = str(why)
                return None
            except Exception as exc:  # noqa: BLE001 - a reset or a vanished buddy: retry, then give up
                self.last_error = f"buddy rank {holder}: {type(exc).__name__}: {exc}"
        return None

    def _fetch_once(self, holder: int, src: int, dest: Path, step: int | None, fresh: bool) -> dict[str, Any]:
        tmp = dest.parent / f".fetch-{dest.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            with self.addresses.connect(holder, fresh) as sock:
                send_frame(sock, {"op": "get", "src": src, "step": step}, self.job_token)
                head = recv_frame(sock, self.job_token)
                if not head.get("ok"):
                    raise _NotHeld(str(head.get("error")))
                marker = head.get("marker")
                if not marker_matches(marker, self.job_token, src, step):
                    raise WireError(f"buddy rank {holder} sent a replica of another job, rank or step")
                recv_files(sock, tmp, check_file_list(head.get("files")))
            write_json_atomic(tmp / MARKER, marker)
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(tmp, dest)
            return marker
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def __call__(self, src_rank: int, dest_dir: Path | str, step: int | None = None) -> dict[str, Any] | None:
        """:meth:`fetch`: the object is ``restore_latest``'s ``fetch`` callable."""
        return self.fetch(src_rank, dest_dir, step)

    def holder_of(self, src_rank: int) -> int | None:
        """The rank whose host keeps ``src_rank``'s replicas."""
        return buddy_of(src_rank, self.world_size, **self.topology)

    def lost_error(self, ranks: Sequence[int], held: Sequence[Sequence[int]] = ()) -> BuddyLostError:
        """The error for ranks that hold neither a snapshot of their own nor a replica at their buddy."""
        pairs = [(r, self.holder_of(r)) for r in ranks]
        named = "; ".join(f"rank {r} and its buddy rank {b} were both lost" for r, b in pairs)
        seen = f" (steps held by each rank: {dict(enumerate(held))})" if held else ""
        involved = tuple(sorted({x for pair in pairs for x in pair if x is not None}))
        return BuddyLostError(
            f"{named}: no in-memory copy of rank(s) {list(ranks)}'s state survives, neither its own snapshot nor "
            f"its buddy's replica{seen}. Restore from a disk checkpoint.",
            ranks=involved,
        )

    def fetch_or_raise(self, src_rank: int, dest_dir: Path | str, step: int | None = None) -> dict[str, Any]:
        """:meth:`fetch`, or BuddyLostError naming ``src_rank`` and its buddy: no copy survives."""
        marker = self.fetch(src_rank, dest_dir, step)
        if marker is None:
            err = self.lost_error([src_rank])
            err.args = (f"{err.args[0]} (buddy: {self.last_error})",)
            raise err
        return marker

    # ------------------------------------------------------------------ end

    def stats(self) -> dict[str, Any]:
        """Counters for the rank's events (and the measured push speed in MB/s)."""
        mbps = self.push_bytes / self.push_s / 1e6 if self.push_s > 0 else None
        return {
            "buddy": self.buddy,
            "pushed": self.pushed,
            "retried": self.retried,
            "dropped": self.dropped,
            "skipped": self.skipped,
            "push_bytes": self.push_bytes,
            "push_mb_s": mbps,
            "held_for": self.server.puts,
            "served": self.server.gets,
            "refused": self.server.refused,
        }

    def close(self, remove: bool = False, flush_s: float = 0.0) -> None:
        """Stop pushing (after up to ``flush_s`` for a queued push) and serving; ``remove`` deletes the
        replicas this host holds for the job (a clean exit)."""
        if flush_s > 0:
            self.flush(flush_s)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self.server.close(remove=remove)


class _NotHeld(Exception):
    """The buddy answered, and holds no such replica: retrying will not help."""
