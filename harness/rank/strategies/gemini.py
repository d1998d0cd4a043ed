"""Strategy ``gemini``, rank side (the spec is ``harness.strategies.gemini``): GEMINI in-memory checkpoints
with a peer replica, through lm-resiliency 0.2.0.

Each rank calls ``lm_resiliency.enable_resiliency`` once, after its optimizer exists: it hooks
``optimizer.step`` and, every ``strategy.snapshot.every`` steps (1 if unset), copies the rank's state
(FSDP2 shards) into host memory and replicates it to its paired rank over dedicated gloo pair groups,
from background threads. SCOUT detection is off (``enable_detection=False``): the harness injects the
faults, and detection needs NCCL.

Recovery as lm-resiliency ships it on CPU: a lost process's memory is gone; the survivors write their
own copy and the replica they hold for the lost peer to ``disk_folder`` (on SIGTERM, or on exit after
the collective error), the launcher restarts every worker (plain torchrun restarts here: its standby
rendezvous backend does not register under torch 2.13, see docs/peers.md), and each reloads the newest
step every rank has, then resumes at ``handle.step_count``. The parent's relaunch after any failure is
that torchrun restart; ``settle_s`` gives the survivors time to write their copies before teardown.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.rank.strategies.base import Strategy, TrainContext
from harness.strategies.snapshot_config import snapshots_of

if TYPE_CHECKING:
    import torch


class Gemini(Strategy):
    def __init__(self, ctx: TrainContext) -> None:
        super().__init__(ctx)
        import torch.distributed as dist  # lazy: torch
        from lm_resiliency import enable_resiliency  # lazy: lm-resiliency
        from lm_resiliency.checkpointing.config import InMemoryCkptConfig  # lazy: lm-resiliency

        snap = snapshots_of(ctx.cfg.strategy)
        every = snap.every if snap is not None else 1
        folder = Path(ctx.run_dir) / "gemini"
        t0 = time.time()
        self.handle = enable_resiliency(
            ctx.model,
            ctx.optimizer,
            interval=every,
            enable_detection=False,
            checkpoint=InMemoryCkptConfig(
                interval=every,
                disk_folder=str(folder),
                disk_flush_interval=0,
                pin_memory=False,
                run_id=Path(ctx.run_dir).name,
            ),
            # Without an explicit group lm-resiliency builds NCCL groups even with detection off.
            group=dist.group.WORLD,
            device=ctx.device,
        )
        resumed = int(self.handle.step_count)
        if ctx.incarnation > 0:
            ctx.events.emit(
                "restore", t_start=t0, t_end=time.time(), from_step=resumed - 1, source="gemini", path=str(folder)
            )
        self._start = max(self._start, resumed)

    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        try:
            return self.plain_step(step, tokens)
        except Exception:
            self._failed = True
            raise

    def close(self) -> None:
        if getattr(self, "_failed", False):
            # Write this rank's copy and the replica it holds for its peer to disk before the handle goes:
            # closing the handle first unregisters lm-resiliency's exit flush (measured: nothing written,
            # and the restarted ranks began again at step 0).
            t0 = time.time()
            written = self.handle.flush_for_restart()
            self.ctx.events.emit("gemini_flush", t_start=t0, t_end=time.time(), written=written)
        super().close()
        self.handle.close()
