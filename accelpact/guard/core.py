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

Between steps, :meth:`Guard.run` guards the caller's own collectives (evaluation, checkpoint saves, a
final gather) the same way, closing them with a region vote (accelpact/recovery/region_rule.py), and
:meth:`Guard.finish` is the guarded end of the run: a rank lost after the last step's vote is healed
there instead of leaving its replacement waiting for a plan.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.backends.interruptible import CollectiveWaiter
from accelpact.common import positions
from accelpact.control.store_loss import store_lost_error
from accelpact.dataplane.plane import DataPlane
from accelpact.dataplane.registry import attach_data_plane
from accelpact.dataplane.reset import ResetConfig, fsdp_flavour, reset_after_fault
from accelpact.dataplane.tracebacks import drop_traceback as _drop_traceback
from accelpact.detection import start as detection
from accelpact.detection.liveness import LivenessConfig
from accelpact.detection.watchdog import resolve_stall_timeout
from accelpact.errors import AccelPactError, ControlChannelError, RankLostError, RolledBack, StateDivergedError
from accelpact.events import HealEvent, RecoveryLog
from accelpact.guard import attach_checks as _attach_checks
from accelpact.guard.clipping import clip_gradients
from accelpact.guard.config import GuardConfig, InjectionClock
from accelpact.recovery import rounds as recovery
from accelpact.recovery.consensus import Phase
from accelpact.recovery.context import RecoveryContext, StepState
from accelpact.recovery.region_rule import RegionAction, RegionPhase, decide_region

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient
    from accelpact.recovery.consensus import Decision
    from accelpact.recovery.heal import HealPolicy
    from accelpact.recovery.rejoin import RejoinTicket
    from accelpact.snapshot.snapshotter import Snapshotter

_log = logging.getLogger(__name__)

__all__ = ["Guard", "GuardConfig", "attach", "clip_gradients"]

PhaseHook = Callable[[str, int], None]
# Heals (accelpact.recovery.heal) happen only for ranks found dead, never for one that missed the deadline
# (it may be alive and hung: a replacement would run beside it).
_HEALABLE = ("notice", "heartbeat")
# close() waits this long for the heartbeat's and the watchdog's threads: one store call (5 s timeout) at most.
_THREAD_STOP_S = 6.0


class Guard:
    """See module docstring. Build with :func:`attach`."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        control: ControlClient,
        *,
        process_group: dist.ProcessGroup | None = None,
        config: GuardConfig = GuardConfig(),
        injection_clock: InjectionClock | None = None,
        snapshots: Snapshotter | None = None,
        heal: HealPolicy | None = None,
        rejoin: RejoinTicket | None = None,
    ) -> None:
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
        # during a recovery, "recovery" (new generation built, before its first collective); in a survivor's
        # heal, "heal_plan" (every replacement arrived, before the roll call and the plan).
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
                "attach without snapshots= and heal="
            )
        if heal is not None:
            _attach_checks.check_heal_mesh(model, None if rejoin is None else set(rejoin.groups))
        # The heal of a lost rank (accelpact.recovery.heal).
        self.heal_events: list[HealEvent] = []
        # Called as hook(event) on a survivor once a heal is done, before training continues (e.g. to
        # build a side group with the replacement, which builds its own right after attach returns).
        self.heal_hooks: list[Callable[[HealEvent], None]] = []
        self.last_snapshot_wait_s = 0.0  # how long the last step's before_update() blocked
        # True once finish() returned (and no heal moved the run back since); close() then marks the end.
        self._finished = False
        # On a replacement: where attach() resumed it, as the RolledBack a survivor catches (resume_step,
        # extra_state: what its snapshot's extra_state callable saved). None elsewhere.
        self.resumed: RolledBack | None = None
        # The data-plane groups and how to get their next generation (accelpact.dataplane): the only
        # part of the guard that recovery and the heal may touch, besides the step state.
        self.plane: DataPlane = attach_data_plane(
            config.data_plane,
            model,
            optimizer,
            control,
            process_group=process_group,
            group_timeout=config.pg_timeout,
            verify_rebind=config.verify_rebind,
        )
        _log.info("rank %d: data plane %s (%s)", self.rank, self.plane.last_path["path"], self.plane.last_path["why"])
        self._vote_buf = self.plane.backend.vote_buffer()
        self._loop_step = positions.NO_LOOP_STEP  # the loop's own step, as last passed to step(step=...)
        self._codec: positions.VoteCodec | None = None  # the vote's arithmetic for the vote group's size
        self._modules_recorded = False  # what this process loaded, written once after its first commit
        self._closed = False
        self._progress = 0  # bumped at every phase boundary; peers read it from the heartbeat
        self._heartbeat = detection.start_heartbeat(control, self.rank, config.liveness, lambda: self._progress)
        self._watchdog = detection.start_watchdog(
            control,
            self.rank,
            self.world_size,
            config.stall_timeout_s,
            self.plane.pg_timeout.total_seconds(),
            config.liveness,
            self.plane.backend,
        )
        # The clip norm's and the vote's all-reduce are waited for in a way that can be given up
        # (accelpact/backends/interruptible.py: gloo can leave them waiting for the PG timeout).
        self._wait = CollectiveWaiter(
            fired=self._watchdog.fired_reason if self._watchdog is not None else None,
            superseded=getattr(control, "generation_superseded", None),
            abandon=lambda work: self.plane.abandon(list(self.plane.groups), work),
        )
        # What recovery rounds and heals get instead of the guard.
        self._recovery = RecoveryContext(
            rank=self.rank,
            world_size=self.world_size,
            control=control,
            plane=self.plane,
            state=self.state,
            reset_fsdp=lambda: reset_after_fault(model, optimizer, config.reset),
            hook=self._hook,
            liveness=config.liveness,
            events=self.events,
        )
        self._healer = None
        if heal is not None:
            from accelpact.recovery.heal import Healer

            self._healer = Healer(self._recovery, heal, snapshots)
        self.plane.prepare_next_generation()
        if rejoin is not None:
            if self._healer is None:
                raise AccelPactError("attach(rejoin=ticket) needs heal=HealPolicy(...): the replacement's heal runs it")
            rejoin.stop_heartbeat()  # this guard's own heartbeat beats from now on
            if hasattr(control, "heartbeat"):  # at once: no JOINING beat may outlive the join (detection.liveness)
                control.heartbeat()
            outcome = self._healer.join(rejoin)
            self.heal_events.append(outcome.event)
            self.resumed = RolledBack(
                f"rank {self.rank}: replacement resumed at step {outcome.resume_step} (loaded step "
                f"{outcome.resume_step - 1} from {outcome.event.source})",
                resume_step=outcome.resume_step,
                extra_state=outcome.extra_state,
            )

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

    def step(self, step_fn: Callable[[Any], torch.Tensor], batch: Any, step: int | None = None) -> torch.Tensor:
        """Run one committed step; recover in memory from comm faults. Returns step_fn's loss.

        ``step``: the loop's own step number. The vote carries it (and the guard's position) to every rank,
        so a loop whose step differs from its peers' (one that ignored a :class:`accelpact.RolledBack`) is
        stopped at this step's vote with :class:`accelpact.StateDivergedError` naming every rank's position
        (accelpact.common.positions), before any rank applies it."""
        if self._closed:
            raise AccelPactError("guard is closed")
        if step is not None:
            self._loop_step = int(step)
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
                self._vote(0, step, state.region_done)
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
                    decision = recovery.recover(
                        self._recovery, exc, step, t_start, watchdog=fired, injection_clock=self.injection_clock
                    )
                except ControlChannelError as lost:  # the store's host died: say so (accelpact.control.store_loss)
                    raise store_lost_error(
                        lost, control=self.control, step=step, committed_step=self.committed_step
                    ) from lost
                except RankLostError as lost:
                    if self._healer is None or lost.detected_by not in _HEALABLE:
                        raise
                    _drop_traceback(exc)
                    del exc
                    outcome = self._heal(lost, step, t_caught)
                    if outcome.resume_step == step:
                        torch.set_rng_state(rng)  # the same step again, as after a retry
                        continue
                    raise RolledBack(  # our own snapshot restored the RNG of resume_step
                        f"rank {self.rank}: healed the loss of rank(s) {outcome.event.lost_ranks}; rolled back "
                        f"to step {outcome.resume_step - 1}, continue at step {outcome.resume_step}",
                        resume_step=outcome.resume_step,
                        extra_state=outcome.extra_state,
                    ) from None
                _drop_traceback(exc)
                del exc
            if step == decision.step and self.rank in decision.apply_on:
                if loss is None or state.phase not in (Phase.IN_VOTE, Phase.VOTED):
                    raise StateDivergedError(
                        f"rank {self.rank} was told to roll step {step} forward but holds no reduced "
                        f"gradients (phase {state.phase.value}); this is a bug in the commit rule",
                        ranks=(self.rank,),
                        last_committed_step=self.committed_step,
                    )
                self._apply(step)
                return loss
            if decision.resume_step != step:
                raise StateDivergedError(
                    f"rank {self.rank} is at step {step} but the ranks agreed to resume at {decision.resume_step}",
                    ranks=(self.rank,),
                    last_committed_step=self.committed_step,
                )
            torch.set_rng_state(rng)  # retry the same step on the same batch

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the caller's own collectives (``fn(*args, **kwargs)``) under the guard; return fn's result.

        For what happens between steps: evaluation, a checkpoint save, a final gather. A fault inside
        ``fn`` is handled as inside :meth:`step`, with one difference: ``fn`` must be safe to run again
        from its start (an evaluation is; a save that overwrites is).

        - A communication fault (a reset link, a lost connection): one recovery round, a new data-plane
          generation (``dist.group.WORLD`` and every data-plane group are replaced in place), then ``fn``
          runs again on every rank, or, if every rank had finished it, returns the result it computed.
          ``fn`` is closed by a one-element all-reduce (the region vote), so that no rank moves past the
          region while a peer still needs to run it again (accelpact/recovery/region_rule.py).
        - A lost rank, with ``heal=``: the rank is healed as in a step, and this call raises
          :class:`accelpact.RolledBack` on every survivor: the loop continues at ``resume_step``, which is
          at most the last committed step (the replacement starts at the top of a step, so everyone
          re-runs the loop from there, this region included: one step replayed). Restore what
          ``extra_state`` holds, as after any RolledBack.
        - Without ``heal=``: RankLostError naming the rank (not gloo's bare RuntimeError).

        Collectives on groups the guard does not know (e.g. one made with ``dist.new_group`` after
        attach) are not rebuilt: build such a group inside ``fn`` from the current generation, or use
        the default group. Call it between steps, never inside ``step_fn`` or another ``run``.
        """
        if self._closed:
            raise AccelPactError("guard is closed")
        state, plane = self.state, self.plane
        if state.region_phase is not None:
            raise AccelPactError("guard.run() called inside guard.run(): run the inner collectives in the outer fn")
        rng = torch.get_rng_state()  # a re-run sees the same random numbers
        position = state.next_step  # the report of a rank between steps: attempting next_step, before its vote
        self._progress += 1
        try:
            while True:
                t_start = time.time()
                state.phase = Phase.BEFORE_VOTE
                state.region_phase = RegionPhase.RUNNING
                result: Any = None
                if self._watchdog is not None:
                    self._watchdog.begin_attempt(getattr(self.control, "generation", 0))
                try:
                    result = fn(*args, **kwargs)
                    state.region_phase = RegionPhase.IN_VOTE
                    self._vote(2 if fn is _nothing else 1, state.next_step, state.region_done + 1)
                    state.unchecked_since = time.time()
                    if self._watchdog is not None:
                        self._watchdog.end_attempt(completed=False)  # a region's length is not a step's
                    state.region_done += 1
                    return result
                except BaseException as exc:  # noqa: BLE001 - filtered right below
                    fired = self._watchdog.end_attempt(completed=False) if self._watchdog is not None else None
                    if not plane.is_comm_fault(exc):
                        raise
                    t_caught = time.time()
                    try:
                        decision = recovery.recover(
                            self._recovery, exc, position, t_start, watchdog=fired, injection_clock=self.injection_clock
                        )
                    except ControlChannelError as lost:
                        raise store_lost_error(
                            lost, control=self.control, step=position, committed_step=self.committed_step
                        ) from lost
                    except RankLostError as lost:
                        if self._healer is None or lost.detected_by not in _HEALABLE:
                            raise
                        _drop_traceback(exc)
                        del exc
                        outcome = self._heal(lost, position, t_caught, resume_by=max(self.committed_step, 0))
                        raise RolledBack(
                            f"rank {self.rank}: healed the loss of rank(s) {outcome.event.lost_ranks} inside guard.run "
                            f"after step {position - 1}; continue at step {outcome.resume_step}",
                            resume_step=outcome.resume_step,
                            extra_state=outcome.extra_state,
                        ) from None
                    _drop_traceback(exc)
                    del exc
                action = self._region_action(decision)
                if action is RegionAction.COMPLETE:
                    state.region_done += 1
                    return result
                torch.set_rng_state(rng)  # RETRY: run fn again from its start
        finally:
            state.region_phase = None

    def finish(self) -> None:
        """End the run: every rank agrees training ended. Call once, after the last step, on every rank.

        A guarded region with nothing in it but its vote (:meth:`run`): a rank lost after the last
        step's vote (which the survivors' loops would otherwise leave unnoticed, its replacement waiting
        in ``rejoin`` for a plan that never comes) is healed here, and this call raises
        :class:`accelpact.RolledBack`: run the loop again from ``resume_step`` (the last step, replayed),
        then call ``finish`` again. Guard the collectives after it (a final save, a gather) with
        :meth:`run`: a rank lost there is healed the same way.
        """
        self.run(_nothing)
        self._finished = True

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` returned (and no heal moved the run back since)."""
        return self._finished

    def close(self) -> None:
        """End the guard: the last step's snapshot completes, the heartbeat and the watchdog stop (their
        threads ended when this returns, within their store timeout: accelpact.shutdown).

        After :meth:`finish`, also write that this rank ended the run (``{token}/heal/closed/{rank}``): a
        replacement that may still arrive stops at once once every other rank did, instead of waiting
        ``timeout_s`` for a plan (accelpact.recovery.rejoin), and ``accelpact.run``'s agent never replaces a
        rank that exits after this mark; it reports the exit instead."""
        if self._closed:
            return
        if self.snapshots is not None:
            try:
                self.snapshots.flush()  # the newest committed step is the one a group restart resumes from
            except Exception as exc:  # noqa: BLE001 - the previous snapshot remains; say so
                _log.warning(
                    "rank %d: the snapshot of step %d failed at close: %s", self.rank, self.committed_step, exc
                )
        if self._finished:
            from accelpact.recovery.heal_wait import closed_key

            try:
                self.control.set(closed_key(self.control, self.rank), str(self.committed_step).encode())
            except Exception as exc:  # noqa: BLE001 - the store may be gone at the end of a job: nothing waits then
                _log.info("rank %d: could not mark the run ended on the control store: %s", self.rank, exc)
        self._closed = True
        self.phase_hooks.clear()
        if self._heartbeat is not None:
            self._heartbeat.stop(wait_s=_THREAD_STOP_S)
        if self._watchdog is not None:
            self._watchdog.stop(wait_s=_THREAD_STOP_S)

    # -- the step ---------------------------------------------------------------------------------

    def _heal(self, lost: RankLostError, step: int, t_caught: float, resume_by: int | None = None) -> Any:
        """A survivor's heal of the ranks ``lost`` names (accelpact.recovery.heal); the outcome, hooks run."""
        outcome = self._healer.survive(lost, step, t_caught, resume_by=resume_by)  # type: ignore[union-attr]  # set: callers check
        self.state.region_done = 0  # every rank resumes at the top of a step
        self._finished = False
        self.heal_events.append(outcome.event)
        for heal_hook in self.heal_hooks:
            heal_hook(outcome.event)
        self.state.unchecked_since = time.time()
        return outcome

    def _vote(self, kind: int, guard_step: int, region: int) -> None:
        """The vote, carrying this rank's position (``kind``: 0 step, 1 region, 2 finish; positions.KINDS);
        StateDivergedError when the ranks' positions differ."""
        group, buf = self.plane.vote_group, self._vote_buf
        codec = self._codec
        if codec is None or codec.group is not group:  # a recovery may have replaced the group
            codec = self._codec = positions.VoteCodec(group.size(), group)
        buf.set(codec.encode(kind, guard_step, region, self._loop_step))
        if not codec.agreed(self.plane.backend.vote(buf, group, wait=self._wait)):
            raise self._diverged(positions.Position(positions.KINDS[kind], guard_step, region, self._loop_step))

    def _diverged(self, position: positions.Position) -> StateDivergedError:
        """Every rank's position (every rank found the disagreement in the same vote, so all gather)."""
        group = self.plane.vote_group
        mine = torch.tensor(position.values(), dtype=torch.int64, device=self._vote_buf.device)
        seen = {self.rank: position}
        try:
            outs = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
            dist.all_gather(outs, mine, group=group)
            ranks = dist.get_process_group_ranks(group)
            seen = {ranks[i]: positions.Position.from_values(t.tolist()) for i, t in enumerate(outs)}
        except Exception as exc:  # noqa: BLE001 - the error is raised anyway, naming this rank's position only
            _log.warning("rank %d: could not gather the other ranks' positions: %s", self.rank, exc)
        return StateDivergedError(
            positions.describe(seen), ranks=tuple(sorted(seen)), last_committed_step=self.committed_step
        )

    def _region_action(self, decision: Decision) -> RegionAction:
        """After a recovery round inside a region: run fn again, or return its result (recovery.region_rule)."""
        if decision.committed_step != self.committed_step or (self.rank in decision.apply_on):
            raise StateDivergedError(
                f"rank {self.rank} was inside guard.run after committing step {self.committed_step}, but the ranks "
                f"decided {decision}; this is a bug in the commit rule",
                ranks=(self.rank,),
                last_committed_step=self.committed_step,
            )
        return decide_region(self.state.peer_regions, self.rank, decision.committed_step)

    def _hook(self, phase: str, step: int) -> None:
        self._progress += 1
        for hook in self.phase_hooks:
            hook(phase, step)

    def _apply(self, step: int) -> None:
        self._wait_for_snapshot()  # a roll forward skips the vote: the copy must be done here too
        self.optimizer.step()
        self.state.phase = Phase.STEPPED
        self.optimizer.zero_grad(set_to_none=True)
        self.state.commit(step)  # no guarded region done after it yet
        self._finished = False
        if not self._modules_recorded:
            self._record_modules()
        if self.snapshots is not None:
            self.snapshots.after_commit(step)  # copies in the background, overlapping the next step
        self.plane.forget_expired()  # abandoned generations past their PG timeout: their threads and fds
        if not self.plane.rescanned:
            self.plane.rescan()  # FSDP's lazily created holders exist now (DataPlane.rescan)

    def _record_modules(self) -> None:
        """Under accelpact.run: what this process imported by its first commit, for the template to preload
        (accelpact.run.modules); never fails the step."""
        from accelpact.run.modules import record

        self._modules_recorded = True
        try:
            record(self.control)
        except Exception as exc:  # noqa: BLE001 - a slower replacement at worst
            _log.info("rank %d: could not record its modules for the template: %s", self.rank, exc)

    def _wait_for_snapshot(self) -> None:
        """Wait for the previous step's snapshot copy BEFORE the vote, not just before optimizer.step:
        then no rank commits step c + 1 unless every rank's snapshot of c is complete, so a heal
        replays at most one step (accelpact.recovery.heal_plan has the argument)."""
        if self.snapshots is not None:
            t0 = time.time()
            self.snapshots.before_update()
            self.last_snapshot_wait_s += time.time() - t0


def _nothing() -> None:
    """finish()'s region: nothing but the region vote."""


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    control: ControlClient,
    *,
    max_grad_norm: float | None = None,
    process_group: dist.ProcessGroup | None = None,
    pg_timeout: datetime.timedelta | None = None,
    verify_rebind: bool = False,
    reset: ResetConfig = ResetConfig(),
    injection_clock: InjectionClock | None = None,
    heartbeat_interval_s: float | None = 0.5,
    heartbeat_misses: int = 4,
    stall_timeout_s: float | None | str = "auto",
    snapshots: Any = None,
    heal: HealPolicy | None = None,
    rejoin: RejoinTicket | None = None,
    data_plane: str = "auto",
) -> Guard:
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
    loads the resume step and joins the survivors (``guard.next_step`` is where to continue, and
    ``guard.resumed`` the RolledBack a survivor would catch: its ``extra_state`` is what the loaded
    snapshot's ``extra_state`` callable saved, e.g. the LR scheduler's state).
    FSDP2 only with ``snapshots`` or ``heal``.
    ``data_plane``: "auto" (default): on torch >= 2.15, when every data-plane group supports it, a
    recovery reconfigures the SAME groups in place (no rebuild, no rebind); otherwise, or when a
    reconfigure fails, it rebuilds them and rebinds. "reconfigure": the same, but attach raises when it
    cannot. "rebind": always rebuild and rebind. Recovery and heal events say which path ran and why
    (``event.data_plane``); accelpact.dataplane.DATA_PLANES lists the implementations.
    """
    liveness = None if heartbeat_interval_s is None else LivenessConfig(heartbeat_interval_s, heartbeat_misses)
    stall_timeout_s = resolve_stall_timeout(stall_timeout_s, (pg_timeout or dist.default_pg_timeout).total_seconds())
    config = GuardConfig(
        max_grad_norm=max_grad_norm,
        pg_timeout=pg_timeout,
        verify_rebind=verify_rebind,
        reset=reset,
        liveness=liveness,
        stall_timeout_s=stall_timeout_s,
        data_plane=data_plane,
    )
    return Guard(
        model,
        optimizer,
        control,
        process_group=process_group,
        config=config,
        injection_clock=injection_clock,
        snapshots=snapshots,
        heal=heal,
        rejoin=rejoin,
    )
