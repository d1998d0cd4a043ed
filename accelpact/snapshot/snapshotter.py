"""The per-rank snapshotter: after every committed step, copy the shard into the older of two slots.

The guard calls :meth:`Snapshotter.before_update` before the next step's vote / ``optimizer.step()``
(waits until the previous snapshot is complete, marker included) and :meth:`Snapshotter.after_commit`
right after ``zero_grad`` (captures the RNG, hyper-parameters and ``extra_state`` now, starts the
copy in a background thread). The copy of step N thus overlaps step N+1's forward and backward, and
only what is left of it when step N+1's update begins is on the critical path (``wait_s``).

"Snapshot of step N" is the state after step N committed: a resumed run continues with step N+1.
It is taken inside ``guard.step(N)``, so whatever a loop does after ``guard.step`` returns (e.g.
``scheduler.step()``) is not in it: after a restore, run that part of step N again, then step N+1.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from accelpact import shutdown
from accelpact.common.control_client import ControlClient
from accelpact.snapshot import layout as paths
from accelpact.snapshot.launch import check_snapshot_token
from accelpact.snapshot.load import load_slot, own_slots
from accelpact.snapshot.push_rule import check_push_every, is_pushed, slot_to_overwrite
from accelpact.snapshot.sizing import check_room, snapshot_nbytes
from accelpact.snapshot.slots import SnapshotError, SnapshotMissingError, invalidate
from accelpact.snapshot.state import capture_meta, check_supported, entries, param_names, signature
from accelpact.snapshot.tax_budget import TaxBudget
from accelpact.snapshot.writer import CopyJob, CopyPlan, PayloadMaps

__all__ = ["SnapshotConfig", "Snapshotter"]


@dataclass(frozen=True)
class SnapshotConfig:
    """Where and how often to snapshot.

    ``root``: this host's snapshot directory (``$ACCELPACT_SNAPSHOT_ROOT``, else ``/dev/shm/accelpact``).
    ``every``: snapshot the steps divisible by it (1: every step). ``check_room``: refuse at start when
    the root cannot hold 4 slots per rank sharing it (``ranks_sharing_root``; None: ``$LOCAL_WORLD_SIZE``,
    else 1). ``pause_mid_copy_s``: fault-injection tests only (sleep halfway through each copy).
    ``push_every``: hand only every k-th snapshot to ``on_complete`` (the buddy push): the steps
    divisible by ``every * push_every`` (:mod:`accelpact.snapshot.push_rule`), and never overwrite
    the own slot of the newest such step, so that survivors still hold the step a replacement's
    replica is of. A heal after a host loss then replays at most ``every * push_every`` steps when
    each push is acknowledged before the next vote (``Replication(confirm=True)``); with asynchronous
    pushes (the default), at most that many when the lost rank's newest pushed snapshot had reached
    its buddy, else the heal finds no common step and fails loudly (docs/snapshots.md, "push_every").

    ``max_tax``: a budget for protection's cost as a fraction of a step (e.g. 0.03). ``every`` and
    ``push_every`` are then the warm-up cadence; after ``tax_warmup`` steps the ranks agree on the densest
    cadence whose measured cost fits, with at most ``max_bound`` steps replayed after a host loss
    (:mod:`accelpact.snapshot.tax_budget`; docs/snapshots.md, "A tax budget"). None: a fixed cadence.
    """

    root: str = ""
    every: int = 1
    check_room: bool = True
    ranks_sharing_root: int | None = None
    pause_mid_copy_s: float = 0.0
    push_every: int = 1
    max_tax: float | None = None
    max_bound: int = 16
    tax_warmup: int = 8

    def __post_init__(self) -> None:
        if not self.root:
            object.__setattr__(self, "root", paths.default_root())
        if self.every < 1:
            raise ValueError(f"SnapshotConfig.every={self.every}: use 1 (every step) or more")
        try:
            check_push_every(self.push_every)
        except ValueError as exc:
            raise ValueError(f"SnapshotConfig.{exc}") from None
        if self.max_tax is not None and not 0 < self.max_tax < 1:
            raise ValueError(
                f"SnapshotConfig.max_tax={self.max_tax}: give the budget as a fraction of a step (e.g. 0.03 for "
                "3%), or None for a fixed cadence"
            )
        if self.max_tax is not None and self.max_bound < self.every * self.push_every:
            raise ValueError(
                f"SnapshotConfig.max_bound={self.max_bound} is below the warm-up cadence's replay bound "
                f"every*push_every={self.every * self.push_every}: raise max_bound or lower every/push_every"
            )
        if self.tax_warmup < 1:
            raise ValueError(f"SnapshotConfig.tax_warmup={self.tax_warmup}: measure at least 1 step (e.g. 8)")

    def sharing(self) -> int:
        if self.ranks_sharing_root is not None:
            return max(1, int(self.ranks_sharing_root))
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


class Snapshotter:
    """Double-buffered per-step snapshots of one rank's shard (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        job_token: str,
        rank: int,
        world_size: int,
        config: SnapshotConfig | None = None,
        extra_state: Callable[[], Any] | None = None,
        on_complete: Callable[[Path, dict[str, Any]], None] | None = None,
        generation: Callable[[], int] | None = None,
    ) -> None:
        check_supported(model)
        self.model, self.optimizer = model, optimizer
        self.job_token, self.rank, self.world_size = paths.check_token(job_token), int(rank), int(world_size)
        check_snapshot_token(self.job_token)  # a per-attempt token would leave a restarted group nothing to resume
        self.config = config or SnapshotConfig()
        self.extra_state = extra_state
        self.on_complete = on_complete
        self.generation = generation  # the control channel's generation, recorded in each marker
        self.root = Path(self.config.root)
        self.dir = paths.rank_dir(self.root, job_token, rank)
        self.nbytes = snapshot_nbytes(model, optimizer)
        if self.config.check_room:
            check_room(self.root, paths.job_dir(self.root, job_token), self.nbytes, self.config.sharing())
        self.dir.mkdir(parents=True, exist_ok=True)
        self._maps = PayloadMaps()
        self._staging: dict[str, Any] = {}
        self._job: CopyJob | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        shutdown.register(self)  # a copy returning while the interpreter finalizes would abort it
        self._layout: tuple[Any, ...] | None = None  # (signature, plan, index, nbytes, names, index json): see _entries
        # Seconds the training thread was blocked: the last before_update, and in total.
        self.last_wait_s = 0.0
        self.wait_s = 0.0
        self.snapshots = 0
        self.last_copy_s = 0.0
        self.last_seal_s = 0.0
        cfg = self.config
        owner = getattr(on_complete, "__self__", None)  # a Replication: its pusher thread's CPU per push
        self.budget = (
            TaxBudget(
                cfg.max_tax,
                cfg.max_bound,
                cfg.tax_warmup,
                (cfg.every, cfg.push_every),
                self.rank,
                self.world_size,
                getattr(owner, "push_cpu_s", None) if on_complete is not None else None,
            )
            if cfg.max_tax is not None
            else None
        )

    def cadence(self, step: int) -> tuple[int, int]:
        """(every, push_every) in force for ``step``: the configured one, or the tax budget's."""
        return self.budget.at(step) if self.budget is not None else (self.config.every, self.config.push_every)

    def push_gap(self, step: int) -> int:
        """Steps between the pushed step ``step`` and the pushed one before it (a replacement's guess of
        the older replica its buddy holds; with a tax budget, the job's recorded cadence is looked up)."""
        if self.budget is not None:
            self.budget.learn()
        every, push_every = self.cadence(step - 1)
        return every * push_every

    def attach_control(self, control: ControlClient) -> None:
        """The guard hands over its control client: the tax budget agrees on the cadence through it."""
        if self.budget is not None:
            self.budget.control = control

    # -- the guard's two calls ---------------------------------------------------------------------

    def after_commit(self, step: int) -> None:
        """Start the snapshot of committed step ``step`` (the guard calls it right after zero_grad)."""
        if self._closed:
            return
        if self.budget is not None:
            gen = int(self.generation()) if self.generation is not None else 0
            self.budget.on_commit(step, time.perf_counter(), gen)
        every, push_every = self.cadence(step)
        if step % every:
            return
        self._finish(block_counts=True)  # the previous snapshot's seal and push, if still running
        slot = self._target_slot(step)
        plan, index, nbytes, names, index_json = self._entries()
        extra = self.extra_state() if self.extra_state is not None else None
        meta = capture_meta(self.model, self.optimizer, step, index, extra, names, index_json)
        gen = int(self.generation()) if self.generation is not None else 0
        push = is_pushed(step, every, push_every)
        job = CopyJob(
            slot=slot,
            plan=plan,
            nbytes=nbytes,
            meta=meta,
            on_complete=self.on_complete if push else None,
            pause_mid_copy_s=self.config.pause_mid_copy_s,
            marker_fields={
                "job_token": self.job_token,
                "rank": self.rank,
                "world_size": self.world_size,
                "step": int(step),
                "generation": gen,
                "written_at": time.time(),
            },
        )
        job.start_device_copy(self._staging)
        self._job = job
        self._thread = threading.Thread(
            target=job.run, args=(self._maps,), name=f"accelpact-snapshot-{step}", daemon=True
        )
        self._thread.start()

    def stop_for_exit(self, deadline: float) -> threading.Thread | None:
        """The copy in flight completes (a copy always ends; its marker makes the snapshot usable)."""
        job, thread = self._job, self._thread
        if job is not None:
            job.done.wait(max(0.0, deadline - time.monotonic()))
        return shutdown.join_until(thread, deadline)

    def before_update(self) -> None:
        """Wait until the previous step's snapshot is COMPLETE: copied, marker written, ``on_complete``
        returned. The guard calls it before the next step's vote (at the latest before optimizer.step).

        Waiting for the marker, not just for the copy, is what makes a heal replay at most one step: a
        rank that entered the vote of step c + 1 holds a valid slot of c, so a death at any later instant
        leaves c loadable (a death between the copy and the marker would otherwise leave only c - 1
        while a survivor committed c + 1 and overwrote its c - 1). The checksum thus joins the critical
        path only when the next step's forward and backward are shorter than copy + checksum.
        """
        job = self._job
        self.last_wait_s = 0.0
        if job is None:
            return
        if job.cuda_event is not None:
            # GPU: the optimizer's kernels wait on the device for the side stream's copy (no host block
            # for the copy itself; the host still waits below for the marker).
            torch.cuda.current_stream(job.plan.cuda[0][1].device).wait_event(job.cuda_event)
        self._finish(block_counts=True)

    def flush(self) -> None:
        """Wait for the in-flight snapshot (and its on_complete hook); SnapshotError if it failed."""
        self._finish(block_counts=False)

    # -- what is held, and restore -----------------------------------------------------------------

    def held_steps(self, verify: bool = False) -> list[int]:
        """Steps of this rank's valid own slots, newest first (``verify``: CRCs checked too, slower)."""
        self.flush()
        return [m.step for _, m in own_slots(self.root, self.job_token, self.rank, self.world_size, verify=verify)]

    def restore(self, step: int, source: Path | None = None) -> Any:
        """Load snapshot ``step`` into model and optimizer in place; set the RNG; return its extra_state.

        ``source``: a slot directory elsewhere (e.g. a replica fetched from the buddy); default this
        rank's own slot holding ``step``. Own slots newer than ``step`` are dropped (that future is
        re-run), so the next snapshot never overwrites the one just restored.
        """
        self.flush()
        if source is None:
            held = own_slots(self.root, self.job_token, self.rank, self.world_size, verify=False)
            match = [d for d, m in held if m.step == step]
            if not match:
                raise SnapshotMissingError(
                    f"rank {self.rank}: no valid snapshot of step {step} in {self.dir}; held: "
                    f"{[m.step for _, m in held] or 'none'}",
                    held=[m.step for _, m in held],
                )
            source = match[0]
        marker, extra = load_slot(
            self.model,
            self.optimizer,
            Path(source),
            job_token=self.job_token,
            rank=self.rank,
            world_size=self.world_size,
            step=step,
        )
        self.drop_newer_than(step)
        if self.budget is not None:
            self.budget.restored()
        return extra

    def drop_newer_than(self, step: int) -> None:
        """Invalidate own slots of steps after ``step`` (after a rollback to ``step``)."""
        for d, m in own_slots(self.root, self.job_token, self.rank, self.world_size, verify=False):
            if m.step > step:
                invalidate(d)

    def close(self, remove: bool = False) -> None:
        """Finish the in-flight copy, unmap the slots; ``remove``: delete this rank's snapshots."""
        if self._closed:
            return
        self._closed = True
        try:
            self._finish(block_counts=False)
        except SnapshotError:
            if not remove:
                raise
        finally:
            self._maps.drop()
            self._staging.clear()
            if remove:
                shutil.rmtree(self.dir, ignore_errors=True)
                for d in (self.dir.parent,):  # the job directory once no rank is left in it
                    try:
                        d.rmdir()
                    except OSError:
                        pass

    # -- internals ---------------------------------------------------------------------------------

    def _entries(self) -> tuple[CopyPlan, list[Any], int, dict[int, str], str]:
        """The shard's tensors and layout, rebuilt only when a tensor was replaced (7 ms -> 0.3 ms a step
        for the 4-layer test model: walking the modules each step was the training thread's main cost)."""
        sig = signature(self.optimizer)
        if self._layout is None or self._layout[0] != sig:
            items = entries(self.model, self.optimizer)
            index = [e for e, _ in items]
            nbytes = max((e.offset + -(-e.nbytes // 64) * 64 for e in index), default=0)
            self._layout = (
                sig,
                CopyPlan(items),
                index,
                nbytes,
                param_names(self.model, self.optimizer),
                json.dumps([e.to_dict() for e in index]),
            )
        return self._layout[1:]

    def _target_slot(self, step: int) -> Path:
        """The slot to overwrite: one without a valid marker, else the older one, but never the slot of the
        newest pushed step (``push_rule.slot_to_overwrite``; with push_every=1 that is the older slot)."""
        held: dict[Path, int | None] = {}
        for s in paths.SLOTS:
            d = paths.slot_dir(self.root, self.job_token, self.rank, s)
            steps = [
                m.step
                for dd, m in own_slots(self.root, self.job_token, self.rank, self.world_size, verify=False, slots=(s,))
            ]
            held[d] = steps[0] if steps else None
        return slot_to_overwrite(held, step, *self.cadence(step), was_pushed=lambda s: is_pushed(s, *self.cadence(s)))

    def _finish(self, block_counts: bool) -> None:
        job, thread = self._job, self._thread
        if job is None:
            return
        if not job.done.is_set():
            t0 = time.perf_counter()
            job.done.wait()
            if block_counts:
                waited = time.perf_counter() - t0
                self.last_wait_s += waited
                self.wait_s += waited
        if thread is not None:
            thread.join()
        self._job, self._thread = None, None
        if job.error is not None:
            raise SnapshotError(
                f"rank {self.rank}: the snapshot into {job.slot} failed: {type(job.error).__name__}: {job.error}"
            ) from job.error
        self.snapshots += 1
        self.last_copy_s, self.last_seal_s = job.copy_s, job.seal_s
        if self.budget is not None:
            self.budget.on_snapshot(job.cpu_s)
