"""The receiving side of buddy replication: a TCP server thread that keeps the last two replicas per source.

Layout, under the snapshot root of this host: ``<root>/<job_token>/replica/rank<src>/slot0|slot1/``, each
a slot directory like the source's own (payload files, then ``marker.json``). A replica is received IN
PLACE, through mappings kept open across pushes (``FileMaps``), into the slot it replaces, whose marker is
deleted before its first byte changes and written again last: a reader sees a complete replica, never a
torn one, and at least the newest complete replica survives any push. The header is checked before a
byte is written; a refused PUT's payload is read and dropped.

One request per connection, one short-lived thread per connection, so a slow PUT never holds up a GET.
Per source, a state lock covers choosing the target slot, writing a marker and serving a GET, and a put
lock serialises PUTs; a new PUT shuts down the source's PUT still running (the newest push wins).
docs/replicas.md, "The channel", says why each of these, with the measurements.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard, cast

from accelpact.snapshot._replica_wire import (
    MARKER,
    FileMaps,
    PeerClosed,
    WireError,
    check_file_list,
    discard,
    payload_files,
    recv_files,
    recv_frame,
    send_files,
    send_frame,
    write_json_atomic,
)

__all__ = ["ReplicaServer", "read_marker", "marker_matches"]

SLOTS = ("slot0", "slot1")
# A whole replica must arrive within this; a peer that stops sending is dropped (its thread ends).
_IO_TIMEOUT_S = 60.0

Validate = Callable[[Path, dict[str, Any]], bool]


def read_marker(slot_dir: Path) -> dict[str, Any] | None:
    """The slot's marker, or None when it is missing or unreadable (then the slot does not exist)."""
    try:
        body = json.loads((slot_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def marker_matches(marker: Any, job_token: str, rank: int, step: int | None = None) -> TypeGuard[dict[str, Any]]:
    """The marker names this job and ``rank`` (and ``step`` when given): a slot of another job, of
    another rank, or of the wrong step is never served or loaded."""
    if not isinstance(marker, dict) or marker.get("job_token") != job_token:
        return False
    if marker.get("rank") != rank or not isinstance(marker.get("step"), int):
        return False
    return step is None or marker["step"] == step


class ReplicaServer:
    """Holds other ranks' snapshot replicas on this host and serves them back. Start with :meth:`start`.

    ``validate(slot_dir, marker)`` (optional) is the snapshot reader's own check (sizes, checksum);
    a replica that fails it is neither counted as "held" nor served. ``receive_check`` (default:
    ``validate``) is what a received replica must pass before it replaces an older one; it may be
    cheaper (marker and sizes, no CRC pass) because :meth:`held` runs ``validate`` before serving.
    Counters: ``puts``, ``gets``, ``refused`` (bad or foreign requests), ``bytes_in``, ``bytes_out``.
    """

    def __init__(
        self,
        *,
        job_token: str,
        rank: int,
        world_size: int,
        root: Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        validate: Validate | None = None,
        receive_check: Validate | None = None,
    ) -> None:
        self.job_token = job_token
        self.rank = rank
        self.world_size = world_size
        self.dir = Path(root) / job_token / "replica"
        self.validate = validate
        self.receive_check = receive_check if receive_check is not None else validate
        self.puts = self.gets = self.refused = self.bytes_in = self.bytes_out = 0
        self._host, self._port = host, port
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._locks: dict[int, threading.Lock] = {}
        self._put_locks: dict[int, threading.Lock] = {}
        self._active: dict[int, socket.socket] = {}  # the connection of each source's running PUT
        self._locks_guard = threading.Lock()
        self._maps = FileMaps()
        self._warned = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> tuple[str, int]:
        """Bind, clear hidden leftovers (an earlier version received into `.incoming-*`), serve; (host, port)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for src in self.dir.glob("rank*"):
            for tmp in src.glob(".*"):
                shutil.rmtree(tmp, ignore_errors=True)
        sock = socket.create_server((self._host, self._port), backlog=64)
        self._sock = sock
        self._port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name=f"accelpact-replica-r{self.rank}", daemon=True)
        self._thread.start()
        return self._host, self._port

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self._port

    def close(self, remove: bool = False) -> None:
        """Stop serving; with ``remove``, delete every replica this host holds for the job."""
        self._closed.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
            except OSError:
                pass
            self._sock.close()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._locks_guard:
            active = list(self._active.values())
        for conn in active:
            _shutdown(conn)
        self._maps.drop()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ what is held

    def source_dir(self, src: int) -> Path:
        return self.dir / f"rank{src}"

    def held(self, src: int, step: int | None = None) -> list[tuple[int, Path, dict[str, Any]]]:
        """(step, slot_dir, marker) of the complete, valid replicas of ``src``, newest first."""
        out = []
        for name in SLOTS:
            slot = self.source_dir(src) / name
            marker = read_marker(slot)
            if not marker_matches(marker, self.job_token, src, step):
                continue
            if self.validate is not None and not self.validate(slot, marker):
                continue
            out.append((marker["step"], slot, marker))
        return sorted(out, key=lambda t: t[0], reverse=True)

    def _lock(self, src: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(src, threading.Lock())

    def _target(self, src: int, step: int) -> Path:
        """The slot a replica of ``step`` overwrites: the one holding the same step (a retried push), else
        one without a valid marker, else the older. The newest complete replica is never the target."""
        base = self.source_dir(src)
        steps: dict[str, int | None] = {}
        for name in SLOTS:
            m = read_marker(base / name)
            steps[name] = m["step"] if marker_matches(m, self.job_token, src) else None
        target = (
            next((n for n in SLOTS if steps[n] == step), None)
            or next((n for n in SLOTS if steps[n] is None), None)
            or min(SLOTS, key=lambda n: cast(int, steps[n]))
        )  # every slot holds a valid step here
        return base / target

    def _begin_put(self, src: int, conn: socket.socket) -> threading.Lock:
        """This source's put lock, acquired after shutting down the PUT still running for it, if any."""
        with self._locks_guard:
            lock = self._put_locks.setdefault(src, threading.Lock())
            previous = self._active.get(src)
            self._active[src] = conn
        if previous is not None:
            _shutdown(previous)  # its recv returns at once; it leaves its slot without a marker
        lock.acquire()
        return lock

    def _end_put(self, src: int, conn: socket.socket, lock: threading.Lock) -> None:
        with self._locks_guard:
            if self._active.get(src) is conn:
                del self._active[src]
        lock.release()

    # ------------------------------------------------------------------ serving

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.01)
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name=f"accelpact-replica-r{self.rank}-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_IO_TIMEOUT_S)
            try:
                req = recv_frame(conn, self.job_token)
                src = req.get("src")
                if not isinstance(src, int) or not 0 <= src < self.world_size:
                    raise WireError(f"source rank {src!r} outside 0..{self.world_size - 1}")
                if req.get("op") == "put":
                    self._put(conn, src, req)
                elif req.get("op") == "get":
                    self._get(conn, src, req)
                else:
                    raise WireError(f"unknown operation {req.get('op')!r}")
            except PeerClosed:
                pass  # the sender died or was reset mid-send: it retries; the half-received slot has no marker
            except WireError as why:
                self.refused += 1
                if not self._warned:
                    self._warned = True
                    print(
                        f"[accelpact] replica server of rank {self.rank}: {why} (further refusals are counted, "
                        f"not logged)",
                        file=sys.stderr,
                        flush=True,
                    )
            except OSError:
                pass  # the peer reset or vanished: a pusher retries, a half-received slot has no marker

    def _put(self, conn: socket.socket, src: int, req: dict[str, Any]) -> None:
        files = check_file_list(req.get("files"))
        marker, step = req.get("marker"), req.get("step")
        if not marker_matches(marker, self.job_token, src, step):
            raise WireError(f"marker of the replica from rank {src} names another job, rank or step")
        why = _header_mismatch(marker, files)
        if why is not None:  # refused before a byte is written: both replicas stay as they are
            discard(conn, sum(size for _, size in files))
            recv_frame(conn, self.job_token)
            send_frame(
                conn, {"ok": False, "error": f"the replica failed its check (marker, sizes): {why}"}, self.job_token
            )
            return
        base = self.source_dir(src)
        base.mkdir(parents=True, exist_ok=True)
        put_lock = self._begin_put(src, conn)
        try:
            with self._lock(src):
                slot = self._target(src, cast(int, step))  # marker_matches: the marker's step
                slot.mkdir(exist_ok=True)
                _unlink(slot / MARKER)  # the slot stops existing before its first byte changes
                keep = {name for name, _ in files}
                for extra in slot.iterdir():  # files of another layout: not part of this replica
                    if extra.name not in keep and extra.is_file():
                        self._maps.drop(extra)
                        _unlink(extra)
            got = recv_files(conn, slot, files, self._maps)
            trailer = recv_frame(conn, self.job_token)
            if trailer.get("commit") is not True:
                send_frame(
                    conn, {"ok": False, "error": "the sender withdrew it (its slot changed mid-send)"}, self.job_token
                )
                return
            with self._lock(src):
                write_json_atomic(slot / MARKER, marker)  # marker last: only now is it a slot
                if self.receive_check is not None and not self.receive_check(slot, marker):
                    _unlink(slot / MARKER)
                    send_frame(conn, {"ok": False, "error": "the replica failed its check on receipt"}, self.job_token)
                    return
            self.puts += 1
            self.bytes_in += got
            send_frame(conn, {"ok": True, "step": step}, self.job_token)
        finally:
            self._end_put(src, conn, put_lock)

    def _get(self, conn: socket.socket, src: int, req: dict[str, Any]) -> None:
        want = req.get("step")
        if want is not None and not isinstance(want, int):
            raise WireError(f"step {want!r} is not an integer")
        with self._lock(src):
            held = self.held(src, want)
            if not held:
                have = [s for s, _, _ in self.held(src)]
                send_frame(
                    conn,
                    {
                        "ok": False,
                        "held": have,
                        "error": f"rank {self.rank} holds no replica of rank {src}"
                        + (f" at step {want}" if want is not None else "")
                        + (f" (it holds steps {have})" if have else ""),
                    },
                    self.job_token,
                )
                return
            step, slot, marker = held[0]
            files = payload_files(slot)
            send_frame(
                conn, {"ok": True, "step": step, "files": [list(f) for f in files], "marker": marker}, self.job_token
            )
            send_files(conn, slot, files)
        self.gets += 1
        self.bytes_out += sum(size for _, size in files)


def _header_mismatch(marker: dict[str, Any], files: list[tuple[str, int]]) -> str | None:
    """Why the header's file list is not the marker's (names, sizes, total), or None."""
    listed = marker.get("files")
    if not isinstance(listed, dict) or not all(isinstance(v, dict) for v in listed.values()):
        return "the marker has no file list"
    want = {name: f.get("nbytes") for name, f in listed.items()}
    if want != dict(files):
        return f"files {dict(files)}, the marker says {want}"
    if marker.get("nbytes") != sum(size for _, size in files):
        return f"{sum(size for _, size in files)} bytes, the marker says {marker.get('nbytes')}"
    return None


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already
