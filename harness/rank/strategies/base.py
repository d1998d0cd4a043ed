"""The ``Strategy`` base class: one rank's step policy, and everything every strategy shares.

The loop in ``harness.rank.train`` never changes between strategies: it asks the strategy where to
start, calls :meth:`Strategy.step` once per step and :meth:`Strategy.after_step` once the step
committed. The base class does what every strategy needs, so a new strategy cannot forget it:

- **Checkpoints.** Every strategy saves on the same cadence (``checkpoint.interval`` / ``mode``), so
  the fault-free reference pays the same checkpoint cost and strategies differ only in how they
  recover. A restarted process (cold restart, AccelPact's fallback, an NVRx in-process restart)
  restores the newest complete checkpoint in the constructor and resumes after it.
- **Faults.** The scheduled faults of this rank are armed and their module hooks installed here;
  :meth:`step` tells the injector which step runs and, after the subclass's :meth:`run_step`, fails
  loudly if a fault armed for that step never fired (a strategy that skipped a fault point would
  otherwise report a fault-free run as a recovered one). :meth:`plain_step` fires the clip and vote
  points of a plain loop; a guarded loop passes :meth:`on_guard_phase` to the guard's phase hooks.
- **Replays.** Steps at or below the highest step committed in an earlier incarnation are replays.

The registry never imports this module: a spec names its class by string (``rank_class``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.events import Eval, EventLog, Step, events_path, of_type, read_file_events
from harness.rank.faults import RankFaults
from harness.schema import RunConfig

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class TrainContext:
    """Everything one rank's step needs. Built once per process by ``harness.rank.train``."""

    cfg: RunConfig
    rank: int
    world_size: int
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    events: EventLog
    run_dir: str
    incarnation: int = 0
    control_store: Any | None = None  # the parent's long-lived TCPStore (client)
    replacement: int = 0  # > 0: this process replaces a lost one of its rank (heals in memory)
    rejoin: Any | None = None  # what the strategy's rejoin hook returned (replacements only)
    scheduler: Any | None = None  # the LR scheduler (train.warmup_steps), stepped after each committed step


class Rewind(Exception):
    """Raised by a strategy's step: the rank moved back in memory; the loop runs ``step`` next."""

    def __init__(self, step: int) -> None:
        super().__init__(f"continue at step {step}")
        self.step = step


def forward_backward(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss of ``tokens`` (inputs and labels; transformers shifts them), then backward."""
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return loss


def checkpoint_dir(ctx: TrainContext) -> str:
    return ctx.cfg.checkpoint.dir or str(Path(ctx.run_dir) / "checkpoints")


def committed_before(run_dir: str, rank: int) -> int:
    """Highest step index this rank committed in any earlier incarnation (-1 if none): later runs of
    those indices are replays."""
    steps = of_type(read_file_events(events_path(run_dir, rank)), Step)
    return max((s.step for s in steps), default=-1)


def store_ports_of(ctx: TrainContext) -> set[int]:
    """Ports a socket-reset fault must spare: the control store's and every process group's store."""
    from accelpact.backends import store_ports  # lazy: torch

    port = getattr(ctx.control_store, "port", None)
    return store_ports([int(port)] if isinstance(port, int) else [])


class FaultPointMissed(RuntimeError):
    """A strategy finished a step without reaching a fault point armed for it."""


class Strategy(ABC):
    """One rank's step policy; subclasses implement :meth:`run_step`."""

    # A relaunched process (incarnation > 0) restores the newest checkpoint in the constructor. A strategy
    # that resumes from somewhere else first (AccelPact's shared-memory snapshots) sets this False and calls
    # :meth:`restore_checkpoint` itself when it has to fall back to the disk.
    restores_checkpoint_at_start = True

    def __init__(self, ctx: TrainContext, exclude_ports: Collection[int] = ()) -> None:
        self.ctx = ctx
        self._replay_until = committed_before(ctx.run_dir, ctx.rank)
        self.ckpt: Any = None
        # A replacement builds its checkpointer once it has joined the survivors (its group is
        # collective with theirs): the subclass calls make_checkpointer then.
        if ctx.cfg.checkpoint.interval > 0 and not ctx.replacement:
            self.ckpt = self.make_checkpointer(self.checkpoint_group())
        self._start = 0
        # Decided by the incarnation (the same on every rank), because load_latest is collective.
        if ctx.incarnation > 0 and not ctx.replacement and self.restores_checkpoint_at_start:
            self._start = self.restore_checkpoint()
        self.faults = RankFaults.for_rank(
            ctx.cfg, ctx.rank, ctx.run_dir, ctx.events, exclude_ports or store_ports_of(ctx)
        )
        if self.faults is not None:
            self.faults.install(ctx.model)

    def restore_checkpoint(self) -> int:
        """Load the newest complete checkpoint (``restore`` event) on every rank; the step to resume at (0
        without a checkpoint). Collective over the checkpoint group."""
        if self.ckpt is None:
            return 0
        loaded = self.ckpt.load_latest()
        start = 0 if loaded is None else loaded.from_step + 1
        if self.ctx.scheduler is not None:
            # The checkpoint holds no scheduler: the warm-up is a function of the step, so step it there.
            for _ in range(start):
                self.ctx.scheduler.step()
        return start

    def checkpoint_group(self) -> Any:
        """The checkpointer's process group; None: the checkpointer creates one (dist.new_group)."""
        return None

    def checkpoint_directory(self) -> str:
        """Where this rank's checkpoints go (torchft: one directory per replica group)."""
        return checkpoint_dir(self.ctx)

    def make_checkpointer(self, process_group: Any) -> Any:
        from harness.checkpoint import Checkpointer, CheckpointSettings  # lazy: psutil, torch

        cc = self.ctx.cfg.checkpoint
        settings = CheckpointSettings(
            directory=self.checkpoint_directory(), interval=cc.interval, mode=cc.mode.value, keep=cc.keep
        )
        return Checkpointer(
            settings,
            self.ctx.model,
            self.ctx.optimizer,
            process_group=process_group,
            on_event=self.ctx.events.emit,
            timeout=timedelta(seconds=self.ctx.cfg.cluster.pg_timeout_s),
        )

    # -- what the loop calls ------------------------------------------------------------------------
    def first_step(self) -> int:
        """Index of the first step this process runs (0 unless it resumed from a checkpoint)."""
        return self._start

    def step_fields(self) -> dict[str, Any]:
        """Extra fields of the step event just run (e.g. how long it waited for a snapshot)."""
        return {}

    def is_replay(self, step: int) -> bool:
        """Whether ``step`` had already committed once before a rollback (goodput counts it as lost)."""
        return step <= self._replay_until

    def step(self, step: int, tokens: torch.Tensor) -> float:
        """Run step ``step`` to commit through the subclass; every fault armed for it must have fired."""
        if self.faults is not None:
            self.faults.begin_step(step)
        loss = self.run_step(step, tokens)
        if self.faults is not None:
            missed = self.faults.unfired(step)
            if missed:
                raise FaultPointMissed(
                    f"strategy {type(self).__name__} finished step {step} without reaching the fault point(s) "
                    f"{missed} armed for it: call self.plain_step(), or pass self.on_guard_phase to the guard's "
                    "phase hooks, so the clip and vote points fire"
                )
        return loss

    def after_step(self, step: int) -> None:
        """Called once step ``step`` committed: the LR schedule, periodic checkpoint saves, evaluations."""
        if self.ctx.scheduler is not None:
            self.ctx.scheduler.step()
        if self.ckpt is not None and self.ckpt.due(step):
            self.save_checkpoint(step)
        every = self.ctx.cfg.train.eval_every
        if every > 0 and (step + 1) % every == 0:
            self.evaluate(step)

    def save_checkpoint(self, step: int) -> None:
        """Save the checkpoint of ``step`` (its ``checkpoint_save`` fault point first)."""
        self.fire("checkpoint_save")
        self.ckpt.save(step)

    def evaluate(self, step: int) -> None:
        """Evaluate after ``step`` and write an ``eval`` event (a guarded strategy runs it under its guard)."""
        self.ctx.events.emit(Eval, step=step, loss=self.eval_loss(step))

    def eval_loss(self, step: int) -> float:
        """The mean over the ranks of a held-out batch's loss: a forward and an all-reduce outside the step."""
        import torch  # lazy: torch
        import torch.distributed as dist  # lazy: torch

        from harness.rank.data import make_batch  # lazy: torch

        cfg, m = self.ctx.cfg, self.ctx.cfg.model
        # Held out: another seed than training's; one batch per evaluation, the same on every run.
        tokens = make_batch(cfg.train.seed + 7919, step, self.ctx.rank, m.batch_size, m.seq_len, m.vocab_size)
        with torch.no_grad():
            loss = self.ctx.model(input_ids=tokens.to(self.ctx.device), labels=tokens.to(self.ctx.device)).loss
        self.fire("eval")
        total = loss.detach().float().reshape(1).clone()
        dist.all_reduce(total)
        return float(total.item()) / self.ctx.world_size

    def finish(self) -> None:
        """After the last step, on every rank (a guarded strategy agrees the end with every rank)."""

    def close(self) -> None:
        """End of training: remove fault hooks, flush async checkpoints."""
        if self.faults is not None:
            self.faults.remove()
        if self.ckpt is not None:
            self.ckpt.close()

    # -- for subclasses -------------------------------------------------------------------------------
    @abstractmethod
    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        """Run step ``step`` to commit on this rank; return this rank's loss."""

    def fire(self, phase: str) -> None:
        """Fire the fault armed at ``phase`` of the current step, if any."""
        if self.faults is not None:
            self.faults.maybe_fire(phase)

    def on_guard_phase(self, phase: str, guard_step: int) -> None:
        """A guard phase hook: fires the clip and vote points inside ``accelpact``'s guarded step."""
        if self.faults is not None:
            self.faults.on_phase(phase, guard_step)

    def plain_step(self, step: int, tokens: torch.Tensor) -> float:
        """Forward, backward, clip, optimizer step, with the fault points of a plain loop."""
        model, opt = self.ctx.model, self.ctx.optimizer
        loss = forward_backward(model, tokens)
        self.fire("clip_allreduce")
        if self.ctx.cfg.train.max_grad_norm > 0:
            # The guard's clipping, so the reference and accelpact do the very same float operations.
            from accelpact.guard import clip_gradients  # lazy: torch

            clip_gradients(model, self.ctx.cfg.train.max_grad_norm)
        self.fire("vote")  # no vote in a plain loop: the point right before optimizer.step
        self.fire("post_vote")  # the same point: nothing separates the two without a vote
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())
