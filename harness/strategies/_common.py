"""What every strategy shares: the periodic DCP checkpoint cadence, the fault points, resuming.

All strategies checkpoint with the same cadence (``checkpoint.interval`` / ``checkpoint.mode``) through
``harness.checkpoint.checkpointer.Checkpointer``, so the fault-free reference pays the same checkpoint cost and the
only difference between strategies is how they recover. A restarted process (cold restart, accelpact's
fallback, an NVRx in-process restart) restores the newest complete checkpoint in the constructor, so
its ``restart`` event's ``t_ready`` comes after the restore, and resumes at the step after it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Collection, Optional

import torch

from harness.faults.rank_side import RankFaults
from harness.strategies.base import Strategy, TrainContext, forward_backward


def checkpoint_dir(ctx: TrainContext) -> str:
    return ctx.cfg.checkpoint.dir or str(Path(ctx.run_dir) / "checkpoints")


def committed_before(run_dir: str, rank: int) -> int:
    """Highest step index this rank committed in any earlier incarnation (-1 if none): later runs of
    those indices are replays."""
    from harness.events import events_path

    path = events_path(run_dir, rank)
    best = -1
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("kind") == "step":
                best = max(best, int(rec["step"]))
    return best


def control_port(ctx: TrainContext) -> Optional[int]:
    port = getattr(ctx.control_store, "port", None)
    return int(port) if isinstance(port, int) else None


class Periodic(Strategy):
    """Checkpoint every ``checkpoint.interval`` steps, fire scheduled faults, resume after a restore."""

    def __init__(self, ctx: TrainContext, exclude_ports: Collection[int] = ()) -> None:
        super().__init__(ctx)
        self._replay_until = committed_before(ctx.run_dir, ctx.rank)
        self.ckpt: Any = None
        cc = ctx.cfg.checkpoint
        if cc.interval > 0:
            from harness.checkpoint import Checkpointer, CheckpointSettings

            settings = CheckpointSettings(directory=checkpoint_dir(ctx), interval=cc.interval, mode=cc.mode.value,
                                          keep=cc.keep)
            self.ckpt = Checkpointer(settings, ctx.model, ctx.optimizer, on_event=ctx.events.emit,
                                     timeout=timedelta(seconds=ctx.cfg.cluster.pg_timeout_s))
        self._start = 0
        # Decided by the incarnation (the same on every rank), because load_latest is collective.
        if self.ckpt is not None and ctx.incarnation > 0:
            loaded = self.ckpt.load_latest()
            self._start = 0 if loaded is None else loaded.from_step + 1
        if not exclude_ports:
            from accelpact.comm import store_ports

            port = control_port(ctx)
            exclude_ports = store_ports([port] if port is not None else [])
        self.faults = RankFaults.for_rank(ctx.cfg, ctx.rank, ctx.run_dir, ctx.events, exclude_ports)
        if self.faults is not None:
            self.faults.install(ctx.model)

    def first_step(self) -> int:
        return self._start

    def is_replay(self, step: int) -> bool:
        return step <= self._replay_until

    def fire(self, phase: str) -> None:
        if self.faults is not None:
            self.faults.maybe_fire(phase)

    def begin(self, step: int) -> None:
        if self.faults is not None:
            self.faults.begin_step(step)

    def plain_step(self, step: int, tokens: torch.Tensor) -> float:
        """Forward, backward, clip, optimizer step, with the fault points of a plain loop."""
        model, opt = self.ctx.model, self.ctx.optimizer
        self.begin(step)
        loss = forward_backward(model, tokens)
        self.fire("clip_allreduce")
        if self.ctx.cfg.train.max_grad_norm > 0:
            # The guard's clipping, so the reference and accelpact do the very same float operations.
            from accelpact.guard import clip_gradients

            clip_gradients(model, self.ctx.cfg.train.max_grad_norm)
        self.fire("vote")  # no vote in a plain loop: the point right before optimizer.step
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def after_step(self, step: int) -> None:
        if self.ckpt is not None and self.ckpt.due(step):
            self.ckpt.save(step)

    def close(self) -> None:
        if self.faults is not None:
            self.faults.remove()
        if self.ckpt is not None:
            self.ckpt.close()
