"""The guard: owns the step boundary, runs the commit protocol, recovers from comm faults in memory.

One guarded step is: ``step_fn(batch)`` (forward + backward), gradient clipping, the vote (a one-
element all-reduce), ``optimizer.step()``, ``zero_grad(set_to_none=True)``. If the vote completed on
ANY rank, every rank holds complete reduced gradients, so ranks that have not stepped roll forward;
if it completed on none, nobody stepped and the step is retried on the same batch (the proof is in
accelpact/recovery/consensus.py).

Everything backend-specific (how to abort a generation, the vote's device, which errors are
recoverable) goes through the :class:`accelpact.backends.Backend` of the data-plane group.

On a communication fault the guard:
1. aborts its own transport of the broken generation (gloo: resets its sockets), so peers blocked
   on it fail in ms;
2. resets FSDP to a clean between-steps state (accelpact.dataplane.reset; both traps handled);
3. exchanges a RankReport over the out-of-band control channel (own deadline) and decides;
4. builds the next data-plane generation on a never-used store prefix, under the old names;
5. rebinds every cached reference in place (accelpact.dataplane.bindings);
6. runs the first collective on the new generation;
7. applies the decision. A fault during 4-6 starts a new round on the next generation.
A lost rank or irreconcilable reports raise (RankLostError / StateDivergedError) naming the ranks and
the last committed step; nothing hangs past the control channel's deadline.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.detection import start as detection
from accelpact.guard import attach_checks as _attach_checks
from accelpact.recovery import rounds as recovery
from accelpact.guard.clipping import clip_gradients
from accelpact.recovery.consensus import Phase
from accelpact.errors import AccelPactError, ControlChannelError, RankLostError, RolledBack, StateDivergedError
from accelpact.dataplane.tracebacks import drop_traceback as _drop_traceback
from accelpact.dataplane.plane import DataPlane
from accelpact.dataplane.registry import attach_data_plane
from accelpact.events import HealEvent, RecoveryLog
from accelpact.guard.config import GuardConfig, InjectionClock
from accelpact.dataplane.interruptible import CollectiveWaiter
from accelpact.detection.liveness import LivenessConfig
from accelpact.recovery.context import RecoveryContext, StepState
from accelpact.dataplane.reset import ResetConfig, fsdp_flavour, reset_after_fault
from accelpact.control.store_loss import store_lost_error
from accelpact.detection.watchdog import resolve_stall_timeout

if TYPE_CHECKING:
    from accelpact.recovery.heal import HealPolicy
    from accelpact.recovery.rejoin import RejoinTicket

_log = logging.getLogger(__name__)

__all__ = ["Guard", "GuardConfig", "attach", "clip_gradients"]

PhaseHook = Callable[[str, int], None]
# Heals (accelpact.recovery.heal) happen only for ranks found dead, never for one that missed the deadline
# (it may be alive and hung: a replacement would run beside it).
_HEALABLE = ("notice", "heartbeat")


class Guard:
    """See module docstring. Build with :func:`attach`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, control: Any, *,
                 process_group: Any = None, config: GuardConfig = GuardConfig(),
                 injection_clock: InjectionClock | None = None, snapshots: Any = None,
                 heal: "HealPolicy | None" = None, rejoin: "RejoinTicket | None" = None) -> None:
        if not dist.is_initialized():
            raise AccelPactError("attach() needs an initialised process group: call init_process_group first")
        _attach_checks.check_model(model)
        _attach_checks.check_optimizer(model, optimizer)
        _attach_checks.check_members(control)  # a job-token mismatch fails here, not at the first fault
        self.model = model
        self.optimizer = optimizer
        self.control = control
        self.config = config
        # committed step, next step, phase of the commit protocol (recovery and the heal move it too)
        self.state = StepState()
        # accelpact.snapshot.Snapshotter (or None): a copy of the shard after every committed step.
        self.snapshots = snapshots
        if snapshots is not None and getattr(snapshots, "generation", 0) is None:
            snapshots.generation = lambda: getattr(control, "generation", 0)
        self.events = RecoveryLog()  # the newest 256; .total counts them all (accelpact/events.py)
        # Called as hook(phase, step) at "step_start", "clip_allreduce", "vote", "post_vote" and,
        # during a recovery, "recovery" (new generation built, before its first collective).
        self.phase_hooks: list[PhaseHook] = []
        # Measures detection time from a known injection instead of from the attempt's start; may
        # be set after attach.
        self.injection_clock: InjectionClock | None = injection_clock
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._flavour = fsdp_flavour(model)
        if (snapshots is not None or heal is not None) and self._flavour != "fsdp2":
            raise AccelPactError(
                f"snapshots and heals need FSDP2 (fully_shard); this model uses {self._flavour}: its flat "
                "parameters are not restored shard by shard. Wrap with torch.distributed.fsdp.fully_shard, or "
                "attach without snapshots= and heal=")
        if heal is not None:
            _attach_checks.check_heal_mesh(model, dist.get_world_size())
        # The heal of a lost rank (accelpact.recovery.heal).
        self.heal_events: list[HealEvent] = []
        # Called as hook(event) on a survivor once a heal is done, before training continues (e.g. to
        # build a side group with the replacement, which builds its own right after attach returns).
        self.heal_hooks: list[Callable[[HealEvent], None]] = []
        self.last_snapshot_wait_s = 0.0  # how long the last step's before_update() blocked
        # The data-plane groups and how to get their next generation (accelpact.dataplane): the only
        # part of the guard that recovery and the heal may touch, besides the step state.
        self.plane: DataPlane = attach_data_plane(
            config.data_plane, model, optimizer, control, process_group=process_group,
            group_timeout=config.pg_timeout, verify_rebind=config.verify_rebind)
        _log.info("rank %d: data plane %s (%s)", self.rank, self.plane.last_path["path"], self.plane.last_path["why"])
        self._vote_buf = self.plane.backend.vote_buffer()
        self._closed = False
        self._progress = 0  # bumped at every phase boundary; peers read it from the heartbeat
        self._heartbeat = detection.start_heartbeat(control, self.rank, config.liveness, lambda: self._progress)
        self._watchdog = detection.start_watchdog(control, self.rank, self.world_size, config.stall_timeout_s,
                                                  self.plane.pg_timeout.total_seconds(), config.liveness,
                                                  self.plane.backend)
        # The clip norm's and the vote's all-reduce are waited for in a way that can be given up
        # (accelpact/dataplane/interruptible.py: gloo can leave them waiting for the PG timeout).
        self._wait = CollectiveWaiter(
            fired=self._watchdog.fired_reason if self._watchdog is not None else None,
            superseded=getattr(control, "generation_superseded", None),
            abandon=lambda work: self.plane.abandon(list(self.plane.groups), work))
        # What recovery rounds and heals get instead of the guard.
        self._recovery = RecoveryContext(
            rank=self.rank, world_size=self.world_size, control=control, plane=self.plane, state=self.state,
            reset_fsdp=lambda: reset_after_fault(model, optimizer, config.reset), hook=self._hook,
            liveness=config.liveness, events=self.events)
        self._healer = None
        if heal is not None:
            from accelpact.recovery.heal import Healer

            self._healer = Healer(self._recovery, heal, snapshots)
        self.plane.prepare_next_generation()
        if rejoin is not None:
            if self._healer is None:
                raise AccelPactError("attach(rejoin=ticket) needs heal=HealPolicy(...): the replacement's heal runs it")
            rejoin.stop_heartbeat()  # this guard's own heartbeat beats from now on
            self.heal_events.append(self._healer.join(rejoin).event)

    # -- public ------------------------------------------------------------------------------------

    @property
    def process_groups(self) -> list[dist.ProcessGroup]:
        """The live generation of every data-plane group, vote group included."""
        return list(self.plane.groups)

    @property
    def backend(self) -> Any:
        """The :class:`accelpact.backends.Backend` of the data-plane groups."""
        return self.plane.backend

    @property
    def committed_step(self) -> int:
        """The newest step this rank committed (-1: none yet)."""
        return self.state.committed_step

    @property
    def next_step(self) -> int:
        """The step number the next :meth:`step` call will run."""
        return self.state.next_step

    def resume_at(self, step: int) -> None:
        """Continue numbering from ``step`` (after restoring a checkpoint saved at ``step - 1``).

        Only the numbering changes: the caller restores model and optimizer state. Call it
        between steps, before the first :meth:`step` of the resumed run, so recovery reports
        and errors name the caller's step numbers.
        """
        self.state.resume_at(step)

    def step(self, step_fn: Callable[[Any], torch.Tensor], batch: Any) -> torch.Tensor:
        """Run one committed step; recover in memory from comm faults. Returns step_fn's loss."""
        if self._closed:
            raise AccelPactError("guard is closed")
        step = self.state.next_step
        state, plane = self.state, self.plane
        rng = torch.get_rng_state()  # a retried step must see the same random numbers
        self.last_snapshot_wait_s = 0.0
        while True:
            t_start = time.time()
            state.phase = Phase.BEFORE_VOTE
            loss: torch.Tensor | None = None
            if self._watchdog is not None:
                self._watchdog.begin_attempt(getattr(self.control, "generation", 0))
            try:
                self._hook("step_start", step)
                loss = step_fn(batch)
                self._hook("clip_allreduce", step)
                if self.config.max_grad_norm is not None:
                    clip_gradients(self.model, self.config.max_grad_norm, wait=self._wait)
                self._hook("vote", step)
                self._wait_for_snapshot()
                state.phase = Phase.IN_VOTE
                self._vote_buf.fill_(1.0)
                plane.backend.vote(self._vote_buf, plane.vote_group, wait=self._wait)
                state.unchecked_since = time.time()
                if self._watchdog is not None:
                    self._watchdog.end_attempt(completed=True)
                state.phase = Phase.VOTED
                self._hook("post_vote", step)
                self._apply(step)
                return loss
            except BaseException as exc:  # noqa: BLE001 - filtered right below
                fired = self._watchdog.end_attempt(completed=False) if self._watchdog is not None else None
                if not plane.is_comm_fault(exc):
                    raise
                t_caught = time.time()
                try:
                    decision = recovery.recover(self._recovery, exc, step, t_start, watchdog=fired,
                                                injection_clock=self.injection_clock)
                except ControlChannelError as lost:  # the store's host died: say so (accelpact.control.store_loss)
                    raise store_lost_error(lost, control=self.control, step=step,
                                           committed_step=self.committed_step) from lost
                except RankLostError as lost:
                    if self._healer is None or lost.detected_by not in _HEALABLE:
                        raise
                    _drop_traceback(exc)
                    del exc
                    outcome = self._healer.survive(lost, step, t_caught)
                    self.heal_events.append(outcome.event)
                    for heal_hook in self.heal_hooks:
                        heal_hook(outcome.event)
                    state.unchecked_since = time.time()
                    if outcome.resume_step == step:
                        torch.set_rng_state(rng)  # the same step again, as after a retry
                        continue
                    raise RolledBack(  # our own snapshot restored the RNG of resume_step
                        f"rank {self.rank}: healed the loss of rank(s) {outcome.event.lost_ranks}; rolled back "
                        f"to step {outcome.resume_step - 1}, continue at step {outcome.resume_step}",
                        resume_step=outcome.resume_step, extra_state=outcome.extra_state) from None
                _drop_traceback(exc)
                del exc
            if step == decision.step and self.rank in decision.apply_on:
                if loss is None or state.phase not in (Phase.IN_VOTE, Phase.VOTED):
                    raise StateDivergedError(
                        f"rank {self.rank} was told to roll step {step} forward but holds no reduced "
                        f"gradients (phase {state.phase.value}); this is a bug in the commit rule",
                        ranks=(self.rank,), last_committed_step=self.committed_step,
                    )
                self._apply(step)
                return loss
            if decision.resume_step != step:
                raise StateDivergedError(
                    f"rank {self.rank} is at step {step} but the ranks agreed to resume at "
                    f"{decision.resume_step}", ranks=(self.rank,), last_committed_step=self.committed_step,
                )
            torch.set_rng_state(rng)  # retry the same step on the same batch

    def close(self) -> None:
        self._closed = True
        self.phase_hooks.clear()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._watchdog is not None:
            self._watchdog.stop()

    # -- the step ---------------------------------------------------------------------------------

    def _hook(self, phase: str, step: int) -> None:
        self._progress += 1
        for hook in self.phase_hooks:
            hook(phase, step)

    def _apply(self, step: int) -> None:
        self._wait_for_snapshot()  # a roll forward skips the vote: the copy must be done here too
        self.optimizer.step()
        self.state.phase = Phase.STEPPED
        self.optimizer.zero_grad(set_to_none=True)
        self.state.commit(step)
        if self.snapshots is not None:
            self.snapshots.after_commit(step)  # copies in the background, overlapping the next step
        self.plane.forget_expired()  # abandoned generations past their PG timeout: their threads and fds
        if not self.plane.rescanned:
            self.plane.rescan()  # FSDP's lazily created holders exist now (DataPlane.rescan)

    def _wait_for_snapshot(self) -> None:
        """Wait for the previous step's snapshot copy BEFORE the vote, not just before optimizer.step:
        then no rank commits step c + 1 unless every rank's snapshot of c is complete, so a heal
        replays at most one step (accelpact.recovery.heal_plan has the argument)."""
        if self.snapshots is not None:
            t0 = time.time()
            self.snapshots.before_update()
            self.last_snapshot_wait_s += time.time() - t0


def attach(model: nn.Module, optimizer: torch.optim.Optimizer, control: Any, *,
           max_grad_norm: float | None = None, process_group: Any = None,
           pg_timeout: datetime.timedelta | None = None, verify_rebind: bool = False,
           reset: ResetConfig = ResetConfig(), injection_clock: InjectionClock | None = None,
           heartbeat_interval_s: float | None = 0.5, heartbeat_misses: int = 4,
           stall_timeout_s: float | None | str = "auto", snapshots: Any = None,
           heal: "HealPolicy | None" = None, rejoin: "RejoinTicket | None" = None,
           data_plane: str = "auto") -> Guard:
    """Attach accelpact to an existing FSDP model and optimizer; nothing about them changes.

    Call after ``init_process_group``, ``fully_shard`` / ``FullyShardedDataParallel`` and optimizer
    construction. ``control`` is a connected :class:`accelpact.control.ControlChannel`; attach waits
    (within its connect_timeout_s) until every rank has joined under the same job token.
    ``max_grad_norm``: clip the total gradient norm to this inside the step (None, the default: no
    clipping, exactly what the script did before attach).
    ``injection_clock`` (tests and benchmarks): called as ``injection_clock(t_start)`` when a fault is
    detected, it returns the wall time of a fault injected at or after ``t_start`` (and forgets it) or
    None, so that ``RecoveryEvent.detection_s`` counts from the injection; e.g.
    ``injection_clock=injector.consume_injection_time``. Also settable later as ``guard.injection_clock``.
    ``heartbeat_interval_s`` / ``heartbeat_misses``: this rank beats on the control store every interval
    (a daemon thread, its own store client), and a peer whose connection dropped and that missed that
    many beats is declared dead at once instead of at the control deadline (None: no heartbeat).
    ``stall_timeout_s``: the stall watchdog (accelpact/detection/watchdog.py): a collective stuck this long, and
    longer than 3x the median step, while a peer stopped beating or the link retransmits, is aborted
    and recovered instead of waiting for the PG timeout. "auto": 10 s when the PG timeout is longer,
    else off; None: off; an explicit value must be below the PG timeout.
    ``snapshots``: an ``accelpact.snapshot.Snapshotter`` of this model and optimizer: the guard waits for
    its copy before each vote and starts the next copy after each commit. ``heal``: an
    :class:`accelpact.recovery.heal.HealPolicy`: a rank found dead is healed in memory (survivors wait for its
    replacement) instead of raising RankLostError; ``step`` may then raise :class:`accelpact.RolledBack`.
    ``rejoin``: on a replacement process, the ticket of :func:`accelpact.recovery.rejoin.rejoin`; attach then
    loads the resume step and joins the survivors (``guard.next_step`` is where to continue).
    FSDP2 only with ``snapshots`` or ``heal``.
    ``data_plane``: "auto" (default): on torch >= 2.15, when every data-plane group supports it, a
    recovery reconfigures the SAME groups in place (no rebuild, no rebind); otherwise, or when a
    reconfigure fails, it rebuilds them and rebinds. "reconfigure": the same, but attach raises when it
    cannot. "rebind": always rebuild and rebind. Recovery and heal events say which path ran and why
    (``event.data_plane``); accelpact.dataplane.DATA_PLANES lists the implementations.
    """
    liveness = None if heartbeat_interval_s is None else LivenessConfig(heartbeat_interval_s, heartbeat_misses)
    stall_timeout_s = resolve_stall_timeout(stall_timeout_s, (pg_timeout or dist.default_pg_timeout).total_seconds())
    config = GuardConfig(max_grad_norm=max_grad_norm, pg_timeout=pg_timeout, verify_rebind=verify_rebind,
                         reset=reset, liveness=liveness, stall_timeout_s=stall_timeout_s, data_plane=data_plane)
    return Guard(model, optimizer, control, process_group=process_group, config=config,
                 injection_clock=injection_clock, snapshots=snapshots, heal=heal, rejoin=rejoin)
