"""One slot directory: payload files, then ``marker.json`` by atomic rename; validation and checksums.

A slot without a valid marker does not exist. The writer deletes the marker before it touches the
payload and renames a complete marker into place only after every payload byte is written, so a
process killed at any instant leaves either no marker (the slot is ignored) or a marker whose
checksums match the payload. A reader checks the format, job token, rank, world size and step against
what it expects, then the files' sizes and CRC-32s, before it trusts a byte.

Checksum: CRC-32 (:mod:`accelpact.snapshot.checksum`: ISA-L's when ``isal`` is installed, else
zlib's; the same values either way, so the format does not depend on it).
"""

from __future__ import annotations

import json
import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelpact.errors import AccelPactError
from accelpact.snapshot.checksum import crc32

__all__ = [
    "FORMAT",
    "MARKER",
    "Marker",
    "SnapshotError",
    "SnapshotMissingError",
    "crc32_file",
    "crc32_bytes",
    "write_marker",
    "read_marker",
    "invalidate",
    "validate",
    "verify_files",
]

FORMAT = "accelpact-snapshot/1"
MARKER = "marker.json"
_CHUNK = 64 << 20  # bytes per crc32 call when reading a file


class SnapshotError(AccelPactError):
    """A snapshot cannot be written or loaded (the message says which slot and why)."""


class SnapshotMissingError(SnapshotError):
    """No valid snapshot of the requested step; ``held`` lists the steps that are held."""

    def __init__(self, message: str, *, held: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.held = list(held)


class NoSnapshotToResumeError(SnapshotError):
    """A restarted group was to resume from its snapshots, and no rank holds one under its job token.

    ``job_token`` and ``root``: where the ranks looked. Raised by ``restore_latest`` (accelpact.snapshot.restore)
    instead of training again from step 0 without a word."""

    def __init__(self, message: str, *, job_token: str, root: str) -> None:
        super().__init__(message)
        self.job_token, self.root = job_token, root


class SnapshotsDisagreeError(SnapshotError):
    """The ranks would resume at different steps: some hold snapshots and others none, or no step is held by
    every rank. ``held``: each rank's valid steps."""

    def __init__(self, message: str, *, held: dict[int, list[int]]) -> None:
        super().__init__(message)
        self.held = held


@dataclass
class Marker:
    """What ``marker.json`` says about its slot. ``files`` maps each payload file to its nbytes and crc32."""

    job_token: str
    rank: int
    world_size: int
    step: int
    generation: int
    nbytes: int
    checksum: str
    files: dict[str, dict[str, int]]
    written_at: float = field(default_factory=time.time)
    format: str = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Marker:
        fields = {
            "job_token",
            "rank",
            "world_size",
            "step",
            "generation",
            "nbytes",
            "checksum",
            "files",
            "written_at",
            "format",
        }
        missing = fields - set(d)
        if missing:
            raise SnapshotError(f"marker lacks {sorted(missing)}")
        return cls(**{k: d[k] for k in fields})


def crc32_bytes(data: Any, value: int = 0) -> int:
    """CRC-32 of a bytes-like object (a memoryview of a mapped tensor works), continuing from ``value``."""
    mv = memoryview(data).cast("B")
    for start in range(0, len(mv), _CHUNK):
        value = crc32(mv[start : start + _CHUNK], value)
    return value


def crc32_file(path: Path) -> tuple[int, int]:
    """(nbytes, crc32) of a file, through a read-only mapping: no copy into Python bytes (a ``read()``
    in 64 MiB chunks allocated and copied every byte once more before the CRC read it)."""
    with open(path, "rb", buffering=0) as f:
        n = os.fstat(f.fileno()).st_size
        if n == 0:
            return 0, 0
        with mmap.mmap(f.fileno(), n, access=mmap.ACCESS_READ) as mm:
            return n, crc32_bytes(mm)


def combined_checksum(files: dict[str, dict[str, int]]) -> str:
    """One string over every payload file's crc (the marker's ``checksum`` field)."""
    value = 0
    for name in sorted(files):
        value = crc32(f"{name}:{files[name]['nbytes']}:{files[name]['crc32']};".encode(), value)
    return f"crc32:{value & 0xFFFFFFFF:08x}"


def invalidate(slot: Path) -> None:
    """Make ``slot`` not exist for readers (before its payload is overwritten)."""
    try:
        os.unlink(slot / MARKER)
    except FileNotFoundError:
        pass


def write_marker(slot: Path, marker: Marker) -> None:
    """Write ``marker.json`` atomically: a temporary file, flushed, then renamed over the name."""
    tmp = slot / f".{MARKER}.tmp"
    with open(tmp, "w") as f:
        json.dump(marker.to_dict(), f)
        f.flush()
        os.fsync(f.fileno())  # free on tmpfs; on a disk root the payload must not trail the marker
    os.replace(tmp, slot / MARKER)


def read_marker(slot: Path) -> Marker | None:
    """The slot's marker, or None when there is none or it does not parse (a slot that does not exist)."""
    try:
        return Marker.from_dict(json.loads((slot / MARKER).read_text()))
    except (OSError, ValueError, TypeError, SnapshotError):
        return None


def validate(
    marker: Marker | None, *, job_token: str, rank: int, world_size: int | None = None, step: int | None = None
) -> str | None:
    """Why ``marker`` must not be loaded by (job_token, rank, world_size, step), or None if it may."""
    if marker is None:
        return "no valid marker"
    if marker.format != FORMAT:
        return f"format {marker.format!r}, expected {FORMAT!r}"
    if marker.job_token != job_token:
        return f"job token {marker.job_token!r}, expected {job_token!r}"
    if marker.rank != rank:
        return f"rank {marker.rank}, expected {rank}"
    if world_size is not None and marker.world_size != world_size:
        return f"world size {marker.world_size}, expected {world_size}"
    if step is not None and marker.step != step:
        return f"step {marker.step}, expected {step}"
    if (
        combined_checksum(marker.files) != marker.checksum
        or sum(f["nbytes"] for f in marker.files.values()) != marker.nbytes
    ):
        return "marker's checksum does not match its own file list"
    return None


def verify_files(slot: Path, marker: Marker, *, checksums: bool = True) -> str | None:
    """Why the payload of ``slot`` does not match ``marker`` (sizes; CRCs too with ``checksums``), or None."""
    for name, want in sorted(marker.files.items()):
        path = slot / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want["nbytes"]:
            return f"{name} has {size} bytes, the marker says {want['nbytes']}"
        if checksums:
            _, crc = crc32_file(path)
            if crc != want["crc32"]:
                return f"{name}: crc32 {crc:08x}, the marker says {want['crc32']:08x} (corrupt)"
    return None
