"""Strategy ``accelpact``, rank side (the spec is ``harness.strategies.accelpact``): every step through
``accelpact.guard``; comm faults are recovered in memory.

No restore and no replay: each in-memory recovery becomes a ``recovery`` event (decision and the
durations of detection, agreement, rebuild, rebind, first collective). After a recovery the
checkpointer's own gloo group (broken by the same fault) is replaced by a fresh one, built on an
explicit store prefix per control generation (harness.rank.strategies.heal.side_group).

A lost rank (SIGKILL) heals in memory when snapshots are on (``strategy.snapshot.every``, 1 by
default): the parent starts a replacement for that rank only; the survivors wait for it, agree the
newest step every rank holds, roll back from their own snapshot if they committed past it, and continue
(accelpact.recovery.heal). Each rank writes a ``heal`` event; a survivor that rolled back re-runs the steps from
the resume step (replays). When the heal is impossible (no copy of the lost rank survives, no
replacement arrives), or snapshots are off, the rank writes a ``fallback`` event and exits with
``EXIT_FALLBACK``; the parent then relaunches every rank, and the results row names the fallback.

A relaunched rank (after such a fallback, or a whole-job crash: ``fault=kill_all``) resumes from the newest
snapshot every rank holds in shared memory when snapshots are on (``restore`` event, ``source="snapshot"``);
it reads the newest checkpoint from disk only without snapshots, or when no complete, agreeing set of them
exists (then a ``fallback`` event, ``detected_by="relaunch"``, names why).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from harness import events
from harness.rank.strategies.base import Rewind, Strategy, TrainContext, forward_backward
from harness.rank.strategies.heal import (
    control_deadline,
    die_at_heal_plan,
    restore_extra_state,
    resume_from_snapshots,
    side_group,
    snapshots_and_policy,
)
from harness.strategies.accelpact import EXIT_FALLBACK

if TYPE_CHECKING:
    import torch


class AccelPactStep(Strategy):
    # A relaunched rank resumes from the snapshots every rank holds when it keeps them (_resume_relaunched).
    restores_checkpoint_at_start = False

    def __init__(self, ctx: TrainContext) -> None:
        from accelpact.control import ControlChannel  # lazy: torch
        from accelpact.guard import attach  # lazy: torch

        super().__init__(ctx)
        control_deadline(ctx.cfg)
        rejoined = ctx.rejoin
        self.control = rejoined.control if rejoined is not None else ControlChannel.from_env()
        self.snapshots, heal, self.replication = snapshots_and_policy(
            ctx.cfg, ctx.model, ctx.optimizer, self.control, ctx.rank, ctx.world_size, ctx.scheduler
        )
        if ctx.incarnation > 0 and not ctx.replacement:
            self._start = self._resume_relaunched()
        max_norm = ctx.cfg.train.max_grad_norm
        try:
            self.guard = attach(
                ctx.model,
                ctx.optimizer,
                self.control,
                max_grad_norm=max_norm if max_norm > 0 else None,
                pg_timeout=timedelta(seconds=ctx.cfg.cluster.pg_timeout_s),
                # Detection is measured from the injected fault, not from the failed attempt's start.
                injection_clock=self.faults.injector.consume_injection_time if self.faults is not None else None,
                # None = auto (10 s when the PG timeout is longer), 0 = off (harness.app.capabilities).
                stall_timeout_s=_stall_timeout(ctx.cfg.strategy.stall_timeout_s),
                snapshots=self.snapshots,
                heal=heal,
                rejoin=rejoined.ticket if rejoined is not None else None,
            )
        except Exception as exc:  # a replacement that cannot heal (no copy survives): fall back
            from accelpact.errors import UnrecoverableError  # lazy: torch

            if isinstance(exc, UnrecoverableError):
                self._fall_back(-1, exc)
            raise
        self.guard.phase_hooks.append(self.on_guard_phase)
        dying = die_at_heal_plan(ctx.rank) if not ctx.replacement else None
        if dying is not None:
            self.guard.phase_hooks.append(dying)
        self.guard.heal_hooks.append(lambda _event: self._new_side_groups())
        self._seen = 0
        self._heals_seen = 0
        if rejoined is not None:
            # Joined the survivors at the resume step; the checkpoint group with them comes now (they
            # build theirs in the guard's heal hook, before training continues).
            self._start = self.guard.next_step
            restore_extra_state(ctx.scheduler, self.guard.resumed.extra_state)  # type: ignore[union-attr]  # rejoined: resumed
            self._record_heals()
            if ctx.cfg.checkpoint.interval > 0:
                self.ckpt = self.make_checkpointer(self.checkpoint_group())
        else:
            # A resumed guard counts from the restored step, so its messages name the harness's step.
            self.guard.resume_at(self.first_step())

    def _resume_relaunched(self) -> int:
        """Where a relaunched rank resumes (every rank relaunched: a whole-job crash, or a fallback): the newest
        snapshot every rank holds in shared memory, so at most the steps after it are replayed and nothing is
        read from disk; the newest checkpoint only without snapshots (``strategy.snapshot.every=0``), or when no
        complete, agreeing set of them exists: then a ``fallback`` event (detected_by "relaunch") says why."""
        if self.snapshots is None:
            return self.restore_checkpoint()
        start, why = resume_from_snapshots(self.ctx, self.snapshots, self.replication)
        if start is not None:
            return start
        reason = (
            f"relaunch: no complete, agreeing set of snapshots in shared memory ({why}); restoring the "
            "newest checkpoint from disk"
        )
        self.ctx.events.emit(events.Fallback, reason=reason[:500], error=why.split(":", 1)[0], detected_by="relaunch")
        print(f"rank {self.ctx.rank}: {reason}", file=sys.stderr, flush=True)
        return self.restore_checkpoint()

    def checkpoint_group(self) -> Any:
        ctx = self.ctx
        generation = getattr(getattr(self, "control", None), "generation", 0)
        return side_group(
            ctx.control_store, _token(), "ckpt", generation, ctx.rank, ctx.world_size, ctx.cfg.cluster.pg_timeout_s
        )

    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        from accelpact.errors import RolledBack, UnrecoverableError  # lazy: torch

        model = self.ctx.model
        try:
            loss = self.guard.step(lambda batch: forward_backward(model, batch), tokens)
        except RolledBack as back:
            self._rewind(back, committed=step - 1)
        except UnrecoverableError as exc:
            self._fall_back(step, exc)
        self._record_recoveries()
        return float(loss.detach())

    def _rewind(self, back: Any, committed: int) -> None:
        """A heal moved this rank back to the newest step every rank holds: steps up to ``committed`` (the
        one it had committed) are replays from here on; the LR schedule comes back from the snapshot."""
        self._replay_until = max(self._replay_until, committed)
        restore_extra_state(self.ctx.scheduler, back.extra_state)
        self._record_recoveries()
        raise Rewind(back.resume_step) from None

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` under the guard (accelpact's Guard.run): a fault there recovers, a lost rank heals."""
        from accelpact.errors import RolledBack, UnrecoverableError  # lazy: torch

        committed = self.guard.committed_step
        try:
            out = self.guard.run(fn, *args)
        except RolledBack as back:
            self._rewind(back, committed)
        except UnrecoverableError as exc:
            self._fall_back(committed + 1, exc)
        self._record_recoveries()
        return out

    def save_checkpoint(self, step: int) -> None:
        def save() -> None:
            self._record_recoveries()  # a recovery inside an earlier try replaced the checkpoint group
            self.fire("checkpoint_save")
            try:
                self.ckpt.save(step)
            except Exception as exc:  # noqa: BLE001 - the guard sees the comm fault inside, or re-raises
                cause = exc.__cause__
                if cause is not None and self.guard.backend.is_comm_fault(cause):
                    raise cause from None  # the checkpointer wraps DCP's error: hand the guard the fault
                raise

        self._guarded(save)

    def evaluate(self, step: int) -> None:
        loss = self._guarded(self.eval_loss, step)
        self.ctx.events.emit(events.Eval, step=step, loss=loss)

    def finish(self) -> None:
        from accelpact.errors import RolledBack, UnrecoverableError  # lazy: torch

        committed = self.guard.committed_step
        try:
            self.guard.finish()  # a rank lost after the last step's vote is healed here
        except RolledBack as back:
            self._rewind(back, committed)
        except UnrecoverableError as exc:
            self._fall_back(committed + 1, exc)
        self._record_recoveries()

    def step_fields(self) -> dict[str, Any]:
        if self.snapshots is None:
            return {}
        return {"snapshot_wait_s": self.guard.last_snapshot_wait_s}

    def _fall_back(self, step: int, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        # detected_by: how the loss was found ("notice", "heartbeat", "deadline", "heal"); the row reports it.
        self.ctx.events.emit(
            events.Fallback,
            step=step,
            reason=reason[:500],
            error=type(exc).__name__,
            detected_by=getattr(exc, "detected_by", None),
            generation=getattr(exc, "generation", None),
        )
        print(
            f"rank {self.ctx.rank}: in-memory recovery impossible at step {step}, falling back to "
            f"checkpoint restore: {reason}",
            file=sys.stderr,
            flush=True,
        )
        # os._exit, not an exception: tearing down process groups a dead peer left half-open can
        # block, and the parent only needs the event (already flushed) and the exit status.
        sys.stdout.flush()
        os._exit(EXIT_FALLBACK)

    def _record_recoveries(self) -> None:
        self._record_heals()
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
            self.ctx.events.emit(
                events.Recovery,
                decision=decision.get("action"),
                decision_detail=decision,
                written=time.time(),
                **{**d, "t": ev.t_detected + ev.total_s},
            )
        # The fault broke the checkpoint group too (a reset hits every gloo connection of the rank).
        self._new_side_groups()

    def _record_heals(self) -> None:
        for ev in self.guard.heal_events[self._heals_seen :]:
            self.ctx.events.emit(events.Heal, written=time.time(), **ev.to_dict())
        self._heals_seen = len(self.guard.heal_events)

    def _new_side_groups(self) -> None:
        """The checkpoint group of the current control generation (every rank builds it at the same point)."""
        if self.ckpt is None:
            return
        from accelpact.backends import retire_group  # lazy: torch

        old = self.ckpt._pg
        error = self.ckpt.replace_process_group(self.checkpoint_group())
        if old is not None and old is not self.ckpt._pg:
            try:
                retire_group(old)
            except Exception:  # noqa: BLE001 - a group c10d no longer knows: nothing to retire
                pass
        if error is not None:
            print(
                f"rank {self.ctx.rank}: an async checkpoint in flight during the fault was lost: {error}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.guard.close()
            if self.snapshots is not None:
                # What the snapshots cost this rank (the process_loss experiment reads it): shared-memory
                # bytes of one slot, own slots + the replicas its host held, time blocked, pushes.
                from accelpact.snapshot import used_bytes  # lazy: torch

                rep = self.replication.stats() if self.replication is not None else {}
                budget = self.snapshots.budget
                held = used_bytes(self.replication.server.dir) if self.replication is not None else 0
                self.ctx.events.emit(
                    events.Snapshots,
                    slot_bytes=self.snapshots.nbytes,
                    count=self.snapshots.snapshots,
                    wait_s=self.snapshots.wait_s,
                    own_shm_bytes=used_bytes(self.snapshots.dir),
                    replica_shm_bytes=held,
                    replication=rep,
                    cadence=budget.schedule.to_text() if budget is not None and budget.schedule is not None else "",
                    cadence_decision=dict(budget.decision or {}) if budget is not None else {},
                )
                self.snapshots.close(remove=True)  # a clean exit leaves no snapshot behind
            if self.replication is not None:
                self.replication.close(remove=True)
            self.control.close()


def _token() -> str:
    return os.environ["ACCELPACT_JOB_TOKEN"]


def _stall_timeout(value: float | None) -> float | None | str:
    if value is None:
        return "auto"
    return value or None
