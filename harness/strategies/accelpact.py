"""Strategy ``accelpact``: every step through ``accelpact.guard``; comm faults are recovered in memory.

No restore and no replay: each in-memory recovery becomes a ``recovery`` event (decision and the
durations of detection, agreement, rebuild, rebind, first collective). After a recovery the
checkpointer's own gloo group (broken by the same fault) is replaced by a fresh one.

When the guard cannot recover (a rank was SIGKILLed: ``RankLostError``; or any other
``UnrecoverableError``), the rank writes a ``fallback`` event with the reason and exits with
``EXIT_FALLBACK``; the parent then falls back to checkpoint restore: it relaunches every rank, which
loads the newest checkpoint and replays (the base class), and the results row names the fallback.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Mapping, Optional

from harness.strategies.base import Strategy, TrainContext, forward_backward
from harness.strategies.spec import StrategySpec

if TYPE_CHECKING:
    import torch

# Exit status of a rank that gave up on in-memory recovery (the parent relaunches from a checkpoint).
EXIT_FALLBACK = 75


class AccelPactStep(Strategy):
    def __init__(self, ctx: TrainContext) -> None:
        from accelpact.control import ControlChannel
        from accelpact.guard import attach

        super().__init__(ctx)
        # The control channel's own deadline bounds how long survivors wait for a lost rank.
        os.environ.setdefault("ACCELPACT_CONTROL_DEADLINE_S", str(ctx.cfg.strategy.recovery_deadline_s))
        self.control = ControlChannel.from_env()
        max_norm = ctx.cfg.train.max_grad_norm
        self.guard = attach(
            ctx.model, ctx.optimizer, self.control,
            max_grad_norm=max_norm if max_norm > 0 else None,
            pg_timeout=timedelta(seconds=ctx.cfg.cluster.pg_timeout_s),
            # Detection is measured from the injected fault, not from the failed attempt's start.
            injection_clock=self.faults.injector.consume_injection_time if self.faults is not None else None,
            # None = auto (10 s when the PG timeout is longer), 0 = off (harness.app.capabilities).
            stall_timeout_s=_stall_timeout(ctx.cfg.strategy.stall_timeout_s),
        )
        self.guard.phase_hooks.append(self.on_guard_phase)
        self._seen = 0
        # A resumed guard counts from the restored step, so its messages name the harness's step.
        self.guard.resume_at(self.first_step())

    def run_step(self, step: int, tokens: "torch.Tensor") -> float:
        from accelpact.errors import UnrecoverableError

        model = self.ctx.model
        try:
            loss = self.guard.step(lambda batch: forward_backward(model, batch), tokens)
        except UnrecoverableError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            # detected_by: how the loss was found ("notice", "heartbeat", "deadline"); the row reports it.
            self.ctx.events.emit("fallback", step=step, reason=reason[:500], error=type(exc).__name__,
                                 detected_by=getattr(exc, "detected_by", None),
                                 generation=getattr(exc, "generation", None))
            print(f"rank {self.ctx.rank}: in-memory recovery impossible at step {step}, falling back to "
                  f"checkpoint restore: {reason}", file=sys.stderr, flush=True)
            # os._exit, not an exception: tearing down process groups a dead peer left half-open can
            # block, and the parent only needs the event (already flushed) and the exit status.
            sys.stdout.flush()
            os._exit(EXIT_FALLBACK)
        self._record_recoveries()
        return float(loss.detach())

    def _record_recoveries(self) -> None:
        new = self.guard.events.since(self._seen)  # the log is bounded: count, never len()
        if not new:
            return
        self._seen = self.guard.events.total
        for ev in new:
            d = ev.to_dict()
            decision = d.pop("decision")
            d.pop("reports", None)
            # t = when the recovery ended (goodput lays the durations back to back, ending there);
            # the record is written after the retried step, so t must be given explicitly.
            self.ctx.events.emit("recovery", decision=decision.get("action"), decision_detail=decision,
                                 written=time.time(), **{**d, "t": ev.t_detected + ev.total_s})
        if self.ckpt is not None:
            import torch.distributed as dist

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


def _stall_timeout(value: "float | None") -> "float | None | str":
    if value is None:
        return "auto"
    return value or None


def relaunch_on_fallback(exit_codes: Mapping[int, Optional[int]], first_failure: Optional[int]) -> Optional[str]:
    """Fall back to checkpoint restore (relaunch every rank) only when a rank said it cannot recover in
    memory (exit ``EXIT_FALLBACK``) or was killed by a signal; any other failure ends the run."""
    failed = {r: c for r, c in exit_codes.items() if c not in (0, None)}
    fell_back = sorted(r for r, c in failed.items() if c == EXIT_FALLBACK)
    killed = sorted(r for r, c in failed.items() if c is not None and c < 0)
    if not (fell_back or killed):
        return None
    parts = []
    if killed:
        parts.append(f"rank(s) {killed} killed by a signal")
    if fell_back:
        parts.append(f"rank(s) {fell_back} could not recover in memory")
    return "fallback to checkpoint restore: " + ", ".join(parts)


SPEC = StrategySpec(
    name="accelpact",
    rank_class="harness.strategies.accelpact:AccelPactStep",
    description="in-memory recovery: agree out of band, new process group, rebind FSDP's references, continue",
    label="AccelPact",
    color="tab:green",
    order=1,
    relaunch=relaunch_on_fallback,
    # Survivors of a lost rank learn of it from the parent's death notice (within ~0.1 s) or by the
    # heartbeat rule (~2 s), write their fallback event and exit; 10 s covers a loaded host. A
    # survivor still waiting then is killed, which the relaunch policy treats the same way.
    settle_s=lambda run: min(run.strategy.recovery_deadline_s + 15.0, 10.0),
    recovers_in_memory=True,
)
