"""DCP checkpointing for the harness: periodic save (sync, async, async with reusable staging) and restore.

Every strategy in the harness checkpoints with the same cadence through this class, so the only
difference between strategies is how they recover. What it guarantees:

- Sharded FSDP2 state: model and optimizer state dicts come from ``get_state_dict`` (DTensor shards,
  no gather) and are restored with ``dcp.load`` into those same tensors, then ``set_state_dict``:
  bit-identical, so a run restored from step k continues exactly like one that never stopped.
- Only complete checkpoints are ever loaded (the ``.complete`` marker, see checkpoint_layout.py),
  and all ranks load the same one (rank 0 decides and broadcasts).
- Async: at most one save in flight; a new save first waits for the previous one; a failed
  background save raises ``CheckpointSaveError`` from the next ``save``/``wait``/``poll``.
- Collectives of checkpointing run on their own gloo group, not the training group: an async save
  runs DCP's collectives from a background thread, and on a shared group they would interleave with
  FSDP's collectives in a different order on each rank.
- Measured per save: the stall the loop saw, bytes written (sum of file sizes, this rank and all),
  peak RSS increase from the start of the save until its write finished.

Modes:
    ``sync``          ``dcp.save``; the loop stalls for the whole write.
    ``async``         ``dcp.async_save`` with DCP's default stager: each save copies the state into
                      freshly allocated host memory, then writes it from a background thread.
    ``async_cached``  ``dcp.async_save`` with one long-lived ``DefaultStager`` whose host buffers are
                      allocated once and reused by every later save (the tuned baseline on CPU).
    ``async_pinned``  as ``async_cached`` with page-locked (pinned) buffers; needs CUDA. Refused with
                      ``CheckpointModeUnavailable`` where CUDA is missing, never silently downgraded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from harness import events
from harness.checkpoint.inflight import SaveSlot
from harness.checkpoint.layout import CheckpointLayout, is_due
from harness.checkpoint.memory import RssPeakSampler
from harness.checkpoint.records import (
    CheckpointError,
    CheckpointModeUnavailable,
    CheckpointSaveError,
    LoadRecord,
    SaveRecord,
)

__all__ = [
    "MODES",
    "CheckpointSettings",
    "Checkpointer",
    "SaveRecord",
    "LoadRecord",
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointModeUnavailable",
    "pinned_memory_available",
]

MODES = ("sync", "async", "async_cached", "async_pinned")
_STAGING = {"sync": "none", "async": "fresh", "async_cached": "cached", "async_pinned": "pinned"}

EventSink = Callable[..., Any]


@dataclass(frozen=True)
class CheckpointSettings:
    """Built by the harness from its CheckpointConfig."""

    directory: str  # root; each checkpoint in <directory>/step_<N>/ (zero-padded)
    interval: int  # save after every `interval` committed steps; 0 = never
    mode: str  # one of MODES
    keep: int = 2  # keep the newest K complete checkpoints

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"checkpoint.mode={self.mode!r} is not one of {', '.join(MODES)}")
        if self.interval < 0:
            raise ValueError(
                f"checkpoint.interval={self.interval}: use 0 to disable checkpointing, or a step count > 0"
            )
        if self.keep < 1:
            raise ValueError(
                f"checkpoint.keep={self.keep}: must be >= 1 (the newest complete checkpoint is always kept)"
            )


def pinned_memory_available() -> bool:
    """Page-locked host memory needs a CUDA driver; DCP's stager silently skips pinning without one."""
    return torch.cuda.is_available()


def _check_mode_available(mode: str) -> None:
    if mode == "async_pinned" and not pinned_memory_available():
        raise CheckpointModeUnavailable(
            "checkpoint.mode=async_pinned needs page-locked host memory, which needs CUDA "
            "(torch.cuda.is_available() is False here; DCP would silently stage unpinned). "
            "Use checkpoint.mode=async_cached for the same reusable staging buffers without pinning "
            "(the tuned async baseline on CPU), or checkpoint.mode=async."
        )


class Checkpointer:
    """Periodic DCP checkpoints of one FSDP2 model + optimizer; construct it on every rank at the same point
    (it creates its gloo group collectively unless ``process_group`` is given)."""

    def __init__(
        self,
        settings: CheckpointSettings,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        process_group: dist.ProcessGroup | None = None,
        on_event: EventSink | None = None,
        timeout: timedelta | None = None,
    ) -> None:
        """``process_group``: the group for checkpoint collectives; None creates a dedicated gloo group
        (collective: every rank must construct its Checkpointer at the same point), with ``timeout``
        (None: torch's default for new groups). ``on_event(kind, **fields)`` receives ``checkpoint`` and
        ``restore`` events (harness.events), always on the calling thread."""
        _check_mode_available(settings.mode)
        self.settings = settings
        self._model = model
        self._optimizer = optimizer
        self._on_event = on_event
        self._layout = CheckpointLayout(settings.directory)
        self._distributed = dist.is_available() and dist.is_initialized()
        self._owns_pg = False
        self._pg: dist.ProcessGroup | None = process_group
        if self._distributed and process_group is None:
            self._pg = dist.new_group(backend="gloo", timeout=timeout)
            self._owns_pg = True
        # Rank within the checkpoint group: DCP names data files and picks its coordinator by it.
        self.rank = dist.get_rank(self._pg) if self._distributed else 0
        self._stager: DefaultStager | None = None
        if settings.mode in ("async_cached", "async_pinned"):
            pinned = settings.mode == "async_pinned"
            # Synchronous staging: save() returns only once the state is copied, so the optimizer
            # may step right after. The stager keeps its buffers keyed by the source storage, and
            # FSDP2's sharded storages live for the whole run, so every later save reuses them.
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=pinned,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=pinned,
                )
            )
        self._slot = SaveSlot()
        self._closed = False
        if self.rank == 0:
            self._layout.root.mkdir(parents=True, exist_ok=True)

    # ---- cadence -------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """After committing ``step`` (0-based), is a save due?"""
        return is_due(step, self.settings.interval)

    # ---- save ----------------------------------------------------------------------------
    def save(self, step: int) -> SaveRecord:
        """Checkpoint the state after ``step``; returns when training may continue.

        sync: after the write is complete. async modes: after waiting for the previous save (its
        failure is raised here as ``CheckpointSaveError``) and staging this one; the returned record's
        bytes/completion fields are filled in when the write finishes (see ``wait``/``poll``).
        """
        self._check_open()
        if self.settings.mode == "sync":
            return self._save_sync(step)
        return self._save_async(step)

    def _save_sync(self, step: int) -> SaveRecord:
        t_start = time.time()
        sampler = RssPeakSampler()
        try:
            state = self._state_dict()
            self._invalidate(step)
            dcp.save(
                state, checkpoint_id=self._layout.path(step), process_group=self._pg, no_dist=not self._distributed
            )
            fields = self._finish(step)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointSaveError(step, exc) from exc
        finally:
            rss_peak_delta = sampler.stop()
        t_end = time.time()
        record = SaveRecord(
            step=step,
            mode="sync",
            t_start=t_start,
            t_end=t_end,
            staging="none",
            t_complete=t_end,
            rss_before=sampler.before,
            rss_peak_delta=rss_peak_delta,
            **fields,
        )
        self._emit(events.Checkpoint.KIND, record.event_fields())
        return record

    def _save_async(self, step: int) -> SaveRecord:
        t_start = time.time()
        self._settle(self._slot.wait())  # one in flight: the previous write must be done first
        wait_s = time.time() - t_start
        sampler = RssPeakSampler()
        try:
            state = self._state_dict()
            self._invalidate(step)
            upload = dcp.async_save(
                state,
                checkpoint_id=self._layout.path(step),
                process_group=self._pg,
                async_stager=self._stager,
                no_dist=not self._distributed,
            )
        except Exception as exc:
            sampler.stop()
            raise CheckpointSaveError(step, exc) from exc
        t_end = time.time()
        if not isinstance(upload, Future):
            # An AsyncSaveResponse only comes back for stagers that stage in the background; ours
            # stage synchronously, so this means DCP changed underneath us.
            raise CheckpointError(f"dcp.async_save returned {type(upload).__name__}, expected a Future")
        done: Future[dict[str, Any]] = Future()

        def on_written(f: Future) -> None:
            # Runs on DCP's writer thread (or here if already done). Anything raised is captured in
            # `done`, so it surfaces in the training thread; nothing is lost in a callback.
            try:
                f.result()
                fields = self._finish(step)
                fields["t_complete"] = time.time()
                fields["rss_peak_delta"] = sampler.stop()
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                sampler.stop()
                done.set_exception(exc)
                return
            done.set_result(fields)

        upload.add_done_callback(on_written)
        record = SaveRecord(
            step=step,
            mode=self.settings.mode,
            t_start=t_start,
            t_end=t_end,
            staging=_STAGING[self.settings.mode],
            wait_s=wait_s,
            rss_before=sampler.before,
        )
        self._slot.put(record, done)
        return record

    def wait(self) -> SaveRecord | None:
        """Finish the in-flight async save (if any); raises ``CheckpointSaveError`` if it failed.
        Call before exit and before loading."""
        self._check_open()
        return self._settle(self._slot.wait())

    def poll(self) -> SaveRecord | None:
        """Settle the in-flight save if it has finished (never blocks): emits its event early and
        raises its failure early. Optional; ``save``/``wait`` settle anyway."""
        self._check_open()
        return self._settle(self._slot.poll())

    @property
    def in_flight(self) -> int | None:
        """The step of the save being written in the background, if any."""
        return self._slot.step

    # ---- load ----------------------------------------------------------------------------
    def latest(self) -> int | None:
        """Newest complete checkpoint's step as this rank sees the disk (rank 0 writes the markers;
        ``load_latest`` makes every rank agree on rank 0's answer)."""
        return self._layout.latest()

    def load_latest(self) -> LoadRecord | None:
        """Restore model + optimizer in place from the newest complete checkpoint; None if there is none.
        Collective over the checkpoint group: call it on every rank."""
        self._check_open()
        self.wait()
        step = self._agree_on_latest()
        if step is None:
            return None
        t_start = time.time()
        state = self._state_dict()
        dcp.load(state, checkpoint_id=self._layout.path(step), process_group=self._pg, no_dist=not self._distributed)
        set_state_dict(
            self._model,
            self._optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
        t_end = time.time()
        record = LoadRecord(from_step=step, t_start=t_start, t_end=t_end, bytes=self._layout.bytes_written(step))
        self._emit(events.Restore.KIND, record.event_fields())
        return record

    # ---- lifecycle -----------------------------------------------------------------------
    def replace_process_group(self, process_group: dist.ProcessGroup) -> CheckpointSaveError | None:
        """Switch checkpoint collectives to a new group (after the old one broke in a network fault).

        The in-flight save, if any, is settled first; its failure is RETURNED (not raised) because the
        caller is recovering from exactly that fault; its directory stays incomplete and unloadable.
        """
        self._check_open()
        error: CheckpointSaveError | None = None
        try:
            self._settle(self._slot.wait())
        except CheckpointSaveError as exc:
            error = exc
        old, owned = self._pg, self._owns_pg
        self._pg, self._owns_pg = process_group, False
        self.rank = dist.get_rank(process_group)
        if owned and old is not None:
            dist.destroy_process_group(old)
        return error

    def close(self) -> None:
        """Wait for the in-flight save (raising its failure) and release the stager and own group."""
        if self._closed:
            return
        try:
            self._settle(self._slot.wait())
        finally:
            self._closed = True
            if self._stager is not None:
                self._stager.close()
            if self._owns_pg and self._pg is not None and dist.is_initialized():
                dist.destroy_process_group(self._pg)
            self._pg = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this Checkpointer is closed; build a new one")

    def _state_dict(self) -> dict[str, Any]:
        # Sharded (DTensor) state: no gather, each rank saves and loads only its own shards. The
        # tensors are the live ones, so dcp.load restores in place.
        model_sd, optim_sd = get_state_dict(self._model, self._optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def _invalidate(self, step: int) -> None:
        # A replayed step is saved into a directory that may already hold an older attempt; make it
        # incomplete before anything is written so a crash mid-save cannot leave a stale marker.
        if self.rank == 0:
            self._layout.invalidate(step)

    def _finish(self, step: int) -> dict[str, Any]:
        """After DCP's save returned on this rank: count bytes; rank 0 marks complete, then prunes."""
        bytes_rank = self._layout.bytes_written(step, rank=self.rank)
        bytes_total = self._layout.bytes_written(step)
        if self.rank == 0:
            world = dist.get_world_size(self._pg) if self._distributed else 1
            self._layout.mark_complete(step, {"world_size": world, "mode": self.settings.mode, "bytes": bytes_total})
            self._layout.prune(self.settings.keep)
        return {"bytes_rank": bytes_rank, "bytes_total": bytes_total, "complete": True}

    def _agree_on_latest(self) -> int | None:
        latest = self._layout.latest() if self.rank == 0 else None
        if not self._distributed:
            return latest
        t = torch.tensor([-1 if latest is None else latest], dtype=torch.int64)
        dist.broadcast(t, group=self._pg, group_src=0)
        value = int(t.item())
        return None if value < 0 else value

    def _settle(self, record: SaveRecord | None) -> SaveRecord | None:
        if record is not None:
            self._emit(events.Checkpoint.KIND, record.event_fields())
        return record

    def _emit(self, kind: str, fields: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(kind, **fields)
