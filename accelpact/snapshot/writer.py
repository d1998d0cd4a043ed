"""The copy of one snapshot into a slot, run in a background thread while the next step computes.

A :class:`CopyJob` has two phases:

1. **copy** (the live shard tensors must not change): every tensor is copied into the slot's payload
   file, which stays mapped (``torch.from_file(..., shared=True)``) across steps, so a copy is one memcpy
   per tensor with no allocation; a reused mapping is the fastest target (docs/snapshots.md, "Off the
   critical path", has the rates). When it ends, ``copied`` is set.
2. **seal** (touches only the slot): CRC-32 of the payload, ``meta.pt``, then ``marker.json`` by atomic
   rename, then the ``on_complete`` hook (the buddy push).

On a GPU the shard is first copied on a side stream into one pinned host buffer; that path has NOT run
on this project's machine (benchmarks/gpu_check.py holds the check). The payload file is preallocated
with ``posix_fallocate``: a full tmpfs then fails the allocation, instead of killing the process with
SIGBUS on a write through the mapping.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from accelpact.snapshot.slots import (
    MARKER,
    Marker,
    SnapshotError,
    combined_checksum,
    crc32_bytes,
    invalidate,
    write_marker,
)
from accelpact.snapshot.state import Entry, Meta

__all__ = ["CopyJob", "CopyPlan", "PayloadMaps", "PAYLOAD", "META"]

PAYLOAD = "shards.bin"
META = "meta.pt"


class PayloadMaps:
    """One shared mapping per slot's payload file, reused while its size does not change, and the
    destination views of a :class:`CopyPlan` into it (built once per mapping and layout)."""

    def __init__(self) -> None:
        self._maps: dict[Path, torch.Tensor] = {}
        self._inodes: dict[Path, tuple[int, int]] = {}  # (st_dev, st_ino) of the file each mapping is of
        self._views: dict[Path, tuple[CopyPlan, list[torch.Tensor]]] = {}

    def get(self, slot: Path, nbytes: int) -> torch.Tensor:
        path = slot / PAYLOAD
        m = self._maps.get(slot)
        if m is not None and m.numel() == nbytes:
            # Reuse only while the path is still the very file that is mapped: a slot directory removed
            # and recreated (a stale cleanup, an operator) leaves the mapping writing into a deleted inode.
            try:
                st = path.stat()
            except FileNotFoundError:
                st = None
            if st is not None and st.st_size == nbytes and (st.st_dev, st.st_ino) == self._inodes.get(slot):
                return m
        self.drop(slot)
        slot.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            if nbytes:
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except OSError as exc:
                    raise SnapshotError(
                        f"cannot allocate {nbytes / 2**30:.2f} GiB for {path}: {exc}. Free space "
                        "where ACCELPACT_SNAPSHOT_ROOT points (a larger /dev/shm: docker "
                        "--shm-size) or snapshot fewer bytes per rank (more ranks)"
                    ) from exc
            st = os.fstat(fd)
        finally:
            os.close(fd)
        m = torch.from_file(str(path), shared=True, size=max(nbytes, 1), dtype=torch.uint8)[:nbytes]
        self._maps[slot] = m
        self._inodes[slot] = (st.st_dev, st.st_ino)
        return m

    def views(self, slot: Path, payload: torch.Tensor, plan: CopyPlan) -> list[torch.Tensor]:
        """``plan``'s destination views into ``payload`` (the mapping :meth:`get` returned for ``slot``)."""
        cached = self._views.get(slot)
        if cached is None or cached[0] is not plan:
            cached = (plan, plan.destinations(payload))
            self._views[slot] = cached
        return cached[1]

    def drop(self, slot: Path | None = None) -> None:
        if slot is None:
            self._maps.clear()
            self._inodes.clear()
            self._views.clear()
        else:
            self._maps.pop(slot, None)
            self._inodes.pop(slot, None)
            self._views.pop(slot, None)


class CopyPlan:
    """The copy of one layout (rebuilt when a tensor is replaced): flat byte views of the CPU sources,
    checked by address each step, and the matching destination views, so a copy is one
    ``torch._foreach_copy_`` call instead of two ``view`` calls and a ``copy_`` per tensor (those
    took ~2 ms of the thread's CPU per step for mistral_tiny's 156 tensors; the memcpy itself is
    bound by memory bandwidth, ~6 GB/s here)."""

    def __init__(self, items: list[tuple[Entry, torch.Tensor]]) -> None:
        self.cpu = [(e, t) for e, t in items if t.device.type != "cuda"]
        self.cuda = [(e, t) for e, t in items if t.device.type == "cuda"]
        self._ptrs: tuple[int, ...] | None = None
        self._src: list[torch.Tensor] = []

    def sources(self) -> list[torch.Tensor]:
        """Each CPU source as flat bytes (as itself where it is not contiguous). A tensor whose storage
        moved (``set_``, ``.data =``) keeps its identity but not its address: re-viewed then."""
        ptrs = tuple(t.data_ptr() for _, t in self.cpu)
        if ptrs != self._ptrs:
            self._src = [t.detach().reshape(-1).view(torch.uint8) if t.is_contiguous() else t for _, t in self.cpu]
            self._ptrs = ptrs
        return self._src

    def destinations(self, payload: torch.Tensor) -> list[torch.Tensor]:
        return [
            payload[e.offset : e.offset + e.nbytes] if t.is_contiguous() else _view(payload, e) for e, t in self.cpu
        ]


@dataclass
class CopyJob:
    """One snapshot in flight: the slot, the tensors, the captured meta, and its progress."""

    slot: Path
    plan: CopyPlan
    nbytes: int
    meta: Meta
    marker_fields: dict[str, Any]
    on_complete: Callable[[Path, dict[str, Any]], None] | None = None
    pause_mid_copy_s: float = 0.0  # fault-injection tests only: sleep halfway through the copy
    copied: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    copy_s: float = 0.0
    seal_s: float = 0.0
    cpu_s: float = 0.0  # this thread's CPU for the copy and the seal (the tax budget's measurement)
    marker: Marker | None = None
    cuda_event: Any = None  # the side stream's "copy finished" event (GPU only)
    _staging: torch.Tensor | None = None

    def start_device_copy(self, staging_pool: dict[str, Any]) -> None:
        """GPU: enqueue the shard's copy into pinned memory on a side stream (nothing on CPU)."""
        cuda = self.plan.cuda
        if not cuda:
            return
        staging = staging_pool.get("pinned")
        if staging is None or staging.numel() != self.nbytes:
            staging = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            staging_pool["pinned"] = staging
        stream = staging_pool.get("stream")
        if stream is None:
            stream = staging_pool["stream"] = torch.cuda.Stream(device=cuda[0][1].device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(cuda[0][1].device))  # after optimizer.step's kernels
        with torch.cuda.stream(stream):
            for e, t in cuda:
                _view(staging, e).copy_(t, non_blocking=True)
            self.cuda_event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.cuda_event.record(stream)
        self._staging = staging

    def run(self, maps: PayloadMaps) -> None:
        """Both phases; errors are kept for the caller (raised at its next call), never lost."""
        c0 = time.thread_time()
        try:
            t0 = time.perf_counter()
            invalidate(self.slot)  # the slot stops existing before its first byte changes
            payload = maps.get(self.slot, self.nbytes)
            dst, src = maps.views(self.slot, payload, self.plan), self.plan.sources()
            with torch.no_grad():
                if self.pause_mid_copy_s:
                    half = len(src) // 2
                    torch._foreach_copy_(dst[:half], src[:half])
                    time.sleep(self.pause_mid_copy_s)
                    torch._foreach_copy_(dst[half:], src[half:])
                elif src:
                    torch._foreach_copy_(dst, src)
                if self.cuda_event is not None:
                    self.cuda_event.synchronize()
                    for e, _t in self.plan.cuda:
                        _view(payload, e).copy_(_view(cast(torch.Tensor, self._staging), e))  # set with the event
            self.copy_s = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - reported by the owner
            self.error = exc
        finally:
            self.copied.set()
        if self.error is None:
            try:
                t1 = time.perf_counter()
                self._seal(payload)
                self.seal_s = time.perf_counter() - t1
                self.cpu_s = time.thread_time() - c0
                if self.on_complete is not None:
                    self.on_complete(self.slot, cast(Marker, self.marker).to_dict())  # _seal set it
            except BaseException as exc:  # noqa: BLE001
                self.error = exc
        self.done.set()

    def _seal(self, payload: torch.Tensor) -> None:
        crc = crc32_bytes(payload.numpy()) if self.nbytes else 0
        buf = io.BytesIO()
        torch.save(self.meta.to_obj(), buf)
        meta_bytes = buf.getvalue()
        with open(self.slot / META, "wb") as f:
            f.write(meta_bytes)
        files = {
            PAYLOAD: {"nbytes": self.nbytes, "crc32": crc},
            META: {"nbytes": len(meta_bytes), "crc32": crc32_bytes(meta_bytes)},
        }
        self.marker = Marker(
            files=files, nbytes=self.nbytes + len(meta_bytes), checksum=combined_checksum(files), **self.marker_fields
        )
        write_marker(self.slot, self.marker)
        assert (self.slot / MARKER).exists()


def _view(buf: torch.Tensor, e: Entry) -> torch.Tensor:
    dtype = getattr(torch, e.dtype)
    return buf[e.offset : e.offset + e.nbytes].view(dtype).view(e.shape)
