"""The replica channel's wire format: signed frames, then raw file bytes. Stdlib only.

One request per TCP connection. A frame is a 4-byte big-endian length and a JSON body signed with the job
token (``accelpact.control.notice_auth``), so a peer of another job, or anything that merely reaches the
port, can neither read nor overwrite this job's replicas. The signature covers the header (operation,
source rank, step, file names and sizes, the slot's marker); the payload bytes are not MACed, which keeps
the send zero-copy (``socket.sendfile``), and are covered by the marker's checksums, which every reader
checks before loading.

Receiving writes straight into the destination file through ``mmap`` + ``recv_into``, into the reused
mapping of the slot it overwrites (:class:`FileMaps`): a fresh tmpfs mapping is several times slower to
fill (docs/replicas.md).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelpact.control.notice_auth import NoticeRejected, sign, verify

__all__ = [
    "WireError",
    "PeerClosed",
    "send_frame",
    "recv_frame",
    "send_files",
    "recv_files",
    "discard",
    "check_file_list",
    "FileMaps",
    "MARKER",
    "write_json_atomic",
]

MARKER = "marker.json"
_LEN = struct.Struct(">I")
_MAX_FRAME = 1 << 20  # a header is a few hundred bytes; anything near this is not ours
_CHUNK = 8 << 20  # recv_into slice: large enough that the per-call overhead vanishes


class WireError(ConnectionError):
    """The peer broke the protocol, closed early, or failed authentication; ``str()`` says which.

    A ConnectionError so that callers treat it like a reset: drop the connection, maybe retry."""


class PeerClosed(WireError):
    """The peer's connection ended mid-message (it died, or its socket was reset)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed(f"peer closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def send_frame(sock: socket.socket, body: dict[str, Any], job_token: str) -> None:
    raw = sign(body, job_token)
    sock.sendall(_LEN.pack(len(raw)) + raw)


def recv_frame(sock: socket.socket, job_token: str) -> dict[str, Any]:
    """The next frame's body; WireError if it is oversized, unsigned, forged or another job's."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > _MAX_FRAME:
        raise WireError(f"frame of {n} bytes refused (limit {_MAX_FRAME}): not an accelpact replica peer")
    try:
        return verify(_recv_exact(sock, n), job_token)
    except NoticeRejected as why:
        raise WireError(f"request refused: {why}") from None


def check_file_list(files: Any) -> list[tuple[str, int]]:
    """[(name, size)] from a frame, refusing anything that could leave the slot directory."""
    if not isinstance(files, list):
        raise WireError("files must be a list of [name, size]")
    out: list[tuple[str, int]] = []
    for item in files:
        if not (isinstance(item, list) and len(item) == 2):
            raise WireError(f"bad file entry {item!r}")
        name, size = item
        if (
            not isinstance(name, str)
            or not name
            or "/" in name
            or "\0" in name
            or name.startswith(".")
            or name == MARKER
        ):
            raise WireError(f"bad file name {name!r}: plain names only, no marker, no hidden files")
        if not isinstance(size, int) or size < 0:
            raise WireError(f"bad size {size!r} for {name}")
        out.append((name, size))
    return out


def payload_files(slot_dir: Path) -> list[tuple[str, int]]:
    """The slot's payload files (everything but the marker and hidden temporaries), sorted by name."""
    return sorted(
        (p.name, p.stat().st_size)
        for p in slot_dir.iterdir()
        if p.is_file() and p.name != MARKER and not p.name.startswith(".")
    )


def send_files(sock: socket.socket, slot_dir: Path, files: Sequence[tuple[str, int]]) -> None:
    """Each file's first ``size`` bytes, in order, zero-copy. WireError if a file shrank meanwhile."""
    for name, size in files:
        if size == 0:
            continue
        with open(slot_dir / name, "rb") as f:
            sent = sock.sendfile(f, 0, size)
        if sent != size:
            raise WireError(f"{name}: sent {sent} of {size} bytes (the slot changed under the send)")


class FileMaps:
    """Writable shared mappings of files, kept open across pushes and reused while the file is the same
    one (inode) with the same size. Used by one thread at a time per file (the holder serialises a
    source's PUTs). Files are preallocated (``posix_fallocate``): a write through a mapping of a full
    tmpfs kills the process with SIGBUS, an allocation fails with a clean error."""

    def __init__(self) -> None:
        self._maps: dict[Path, tuple[int, int, mmap.mmap]] = {}

    def get(self, path: Path, size: int) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            st = os.fstat(fd)
            cached = self._maps.get(path)
            if cached is not None and cached[0] == st.st_ino and cached[1] == size and st.st_size == size:
                return cached[2]
            self.drop(path)
            if st.st_size != size:
                os.ftruncate(fd, size)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise WireError(
                    f"cannot allocate {size / 2**20:.1f} MiB for the replica {path}: {exc}. Free space "
                    "in this host's snapshot root (a larger /dev/shm) or snapshot fewer bytes"
                ) from exc
            mm = mmap.mmap(fd, size)
            self._maps[path] = (st.st_ino, size, mm)
            return mm
        finally:
            os.close(fd)

    def drop(self, path: Path | None = None) -> None:
        """Unmap ``path`` (every file when None)."""
        for key in list(self._maps) if path is None else [path]:
            entry = self._maps.pop(key, None)
            if entry is not None:
                try:
                    entry[2].close()
                except BufferError:  # a view is still alive somewhere: the mapping goes with it
                    pass


def _recv_into(sock: socket.socket, view: memoryview, name: str) -> None:
    got, size = 0, len(view)
    while got < size:
        k = sock.recv_into(view[got : got + _CHUNK])
        if k == 0:
            raise PeerClosed(f"{name}: peer closed after {got} of {size} bytes")
        got += k


def recv_files(sock: socket.socket, dest: Path, files: Sequence[tuple[str, int]], maps: FileMaps | None = None) -> int:
    """Receive the files into ``dest`` (which exists); returns the bytes received. With ``maps``, into
    the kept mappings of the files already there (in place, reused across calls); else fresh files."""
    total = 0
    for name, size in files:
        if maps is not None:
            if size == 0:
                maps.drop(dest / name)
                os.close(os.open(dest / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))
                continue
            view = memoryview(maps.get(dest / name, size))
            try:
                _recv_into(sock, view, name)
            finally:
                view.release()
            total += size
            continue
        fd = os.open(dest / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if size == 0:
                continue
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as mm:
                view = memoryview(mm)
                try:
                    _recv_into(sock, view, name)
                finally:
                    view.release()
            total += size
        finally:
            os.close(fd)
    return total


def discard(sock: socket.socket, nbytes: int) -> None:
    """Read and drop ``nbytes`` (a refused PUT's payload: answering before it arrived would reset the
    sender's connection mid-send, which it would take for a fault and retry)."""
    buf = bytearray(min(nbytes, _CHUNK) or 1)
    view = memoryview(buf)
    left = nbytes
    while left > 0:
        k = sock.recv_into(view[: min(left, len(buf))])
        if k == 0:
            raise PeerClosed(f"peer closed with {left} bytes of a refused replica unsent")
        left -= k


def write_json_atomic(path: Path, body: dict[str, Any]) -> None:
    """Write ``path`` by a temporary file and rename: a reader sees the old file, the new one, or none."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(body, sort_keys=True))
    os.replace(tmp, path)
