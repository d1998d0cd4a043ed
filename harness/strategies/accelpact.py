"""Strategy ``accelpact``: every step through ``accelpact.guard``; comm faults are recovered in memory.

No restore and no replay: each in-memory recovery becomes a ``recovery`` event (decision and the
durations of detection, agreement, rebuild, rebind, first collective). After a recovery the
checkpointer's own gloo group (broken by the same fault) is replaced by a fresh one.

When the guard cannot recover (a rank was SIGKILLed: ``RankLostError``; or any other
``UnrecoverableError``), the rank writes a ``fallback`` event with the reason and exits with
``EXIT_FALLBACK``; the parent then falls back to checkpoint restore: it relaunches every rank, which
loads the newest checkpoint and replays (``Periodic``), and the results row names the fallback.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from harness.strategies._common import Periodic, control_port
from harness.strategies.base import TrainContext, forward_backward

# Exit status of a rank that gave up on in-memory recovery (the parent relaunches from a checkpoint).
EXIT_FALLBACK = 75


class AccelPactStep(Periodic):
    def __init__(self, ctx: TrainContext) -> None:
        from accelpact.comm import store_ports
        from accelpact.control import ControlChannel
        from accelpact.guard import attach

        port = control_port(ctx)
        super().__init__(ctx, exclude_ports=store_ports([port] if port is not None else []))
        # The control channel's own deadline bounds how long survivors wait for a lost rank.
        os.environ.setdefault("ACCELPACT_CONTROL_DEADLINE_S", str(ctx.cfg.strategy.recovery_deadline_s))
        self.control = ControlChannel.from_env()
        max_norm = ctx.cfg.train.max_grad_norm
        self.guard = attach(
            ctx.model, ctx.optimizer, self.control,
            max_grad_norm=max_norm if max_norm > 0 else None,
            pg_timeout=timedelta(seconds=ctx.cfg.cluster.pg_timeout_s),
        )
        if self.faults is not None:
            self.guard.phase_hooks.append(self.faults.on_phase)
        self._seen = 0
        # A resumed guard counts from the restored step, so its messages name the harness's step.
        self.guard.resume_at(self.first_step())

    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        from accelpact.errors import UnrecoverableError

        self.begin(step)
        model = self.ctx.model
        try:
            loss = self.guard.step(lambda batch: forward_backward(model, batch), tokens)
        except UnrecoverableError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self.ctx.events.emit("fallback", step=step, reason=reason[:500], error=type(exc).__name__)
            print(f"rank {self.ctx.rank}: in-memory recovery impossible at step {step}, falling back to "
                  f"checkpoint restore: {reason}", file=sys.stderr, flush=True)
            # os._exit, not an exception: tearing down process groups a dead peer left half-open can
            # block, and the parent only needs the event (already flushed) and the exit status.
            sys.stdout.flush()
            os._exit(EXIT_FALLBACK)
        self._record_recoveries()
        return float(loss.detach())

    def _record_recoveries(self) -> None:
        new = self.guard.events[self._seen:]
        if not new:
            return
        self._seen = len(self.guard.events)
        for ev in new:
            d = ev.to_dict()
            decision = d.pop("decision")
            d.pop("reports", None)
            # t = when the recovery ended (goodput lays the durations back to back, ending there);
            # the record is written after the retried step, so t must be given explicitly.
            self.ctx.events.emit("recovery", decision=decision.get("action"), decision_detail=decision,
                                 written=time.time(), **{**d, "t": ev.t_detected + ev.total_s})
        if self.ckpt is not None:
            # The fault broke the checkpoint group too (a reset hits every gloo connection of the rank).
            error = self.ckpt.replace_process_group(
                dist.new_group(backend="gloo", timeout=timedelta(seconds=self.ctx.cfg.cluster.pg_timeout_s)))
            if error is not None:
                print(f"rank {self.ctx.rank}: an async checkpoint in flight during the fault was lost: {error}",
                      file=sys.stderr, flush=True)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.guard.close()
            self.control.close()
