"""The guard: owns the step boundary, runs the commit protocol, recovers from comm faults in memory.

One guarded step is: ``step_fn(batch)`` (forward + backward), gradient clipping, the vote (a one-
element all-reduce), ``optimizer.step()``, ``zero_grad(set_to_none=True)``. If the vote completed on
ANY rank, every rank holds complete reduced gradients, so ranks that have not stepped roll forward;
if it completed on none, nobody stepped and the step is retried on the same batch (the proof is in
accelpact/recovery/consensus.py).

Everything backend-specific (how to abort a generation, the vote's device, which errors are
recoverable) goes through the :class:`accelpact.backends.Backend` of the data-plane group.

On a communication fault the guard runs recovery rounds (accelpact.recovery.rounds: abort the broken
generation, reset FSDP, agree over the control channel, build and prove the next generation, apply the
decision); nothing hangs past the control channel's deadline. A lost rank is healed with ``heal=``
(accelpact.recovery.heal), else raises RankLostError naming it and the last committed step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.control.store_loss import store_lost_error
from accelpact.dataplane.plane import DataPlane
from accelpact.dataplane.tracebacks import drop_traceback as _drop_traceback
from accelpact.errors import AccelPactError, ControlChannelError, RankLostError, RolledBack
from accelpact.events import HealEvent, RecoveryLog
from accelpact.guard import attach_checks as _attach_checks
from accelpact.guard import decisions, launcher_notes
from accelpact.guard.clipping import clip_gradients
from accelpact.guard.config import GuardConfig, InjectionClock
from accelpact.guard.wiring import wire
from accelpact.recovery import rounds as recovery
from accelpact.recovery.consensus import Decision, Phase
from accelpact.recovery.context import StepState
from accelpact.recovery.region_rule import RegionAction, RegionPhase

if TYPE_CHECKING:
    from accelpact.backends.base import Backend
    from accelpact.common.control_client import ControlClient
    from accelpact.recovery.heal import HealOutcome, HealPolicy
    from accelpact.recovery.rejoin import RejoinTicket
    from accelpact.snapshot.snapshotter import Snapshotter

_log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")  # Guard.run returns what the caller's fn returns

__all__ = ["Guard"]

PhaseHook = Callable[[str, int], None]
# Heals (accelpact.recovery.heal) happen only for ranks found dead, never for one that missed the deadline
# (it may be alive and hung: a replacement would run beside it).
_HEALABLE = ("notice", "heartbeat")
# close() waits this long for the heartbeat's and the watchdog's threads: one store call (5 s timeout) at most.
_THREAD_STOP_S = 6.0


class Guard:
    """One rank's guard over an FSDP model and its optimizer: guarded steps, guarded regions, heals.

    Build it with :func:`accelpact.attach`, which turns its keyword arguments into the ``config`` (a
    :class:`GuardConfig`) and checks the model, the optimizer and the job token first. Then
    :meth:`step` runs each training step, :meth:`run` the caller's own collectives between steps,
    :meth:`finish` ends the run and :meth:`close` the guard.

    Args:
        model: the FSDP-wrapped model (FSDP2 ``fully_shard`` or FSDP1); nothing about it changes.
        optimizer: built from ``model.parameters()`` after wrapping.
        control: a connected control channel (:class:`accelpact.control.ControlChannel`).
        process_group: the data-plane group (None: the default group).
        config: the guard's settings.
        injection_clock: see :func:`accelpact.attach`; also settable later as ``guard.injection_clock``.
        snapshots: an ``accelpact.snapshot.Snapshotter`` of this model and optimizer (FSDP2 only).
        heal: with a :class:`accelpact.recovery.heal.HealPolicy`, a rank found dead is healed in
            memory instead of raising RankLostError (FSDP2 only).
        rejoin: on a replacement process, its ticket: the guard joins the survivors, and
            ``resumed`` says where it continues.

    Attributes a caller reads: ``committed_step``, ``next_step``, ``events`` (recoveries),
    ``heal_events``, ``resumed``, ``finished``; and appends to: ``phase_hooks``, ``heal_hooks``.
    """

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
        _attach_checks.check_attach(model, optimizer, control, snapshots, heal, rejoin)
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
        if snapshots is not None and hasattr(snapshots, "attach_control"):
            snapshots.attach_control(control)  # a tax budget agrees on the cadence through it
        self.events = RecoveryLog()  # the newest 256; .total counts them all (accelpact/events.py)
        # Called as hook(phase, step) at "step_start", "clip_allreduce", "vote", "post_vote" and,
        # during a recovery, "recovery" (new generation built, before its first collective); in a survivor's
        # heal, "heal_plan" (every replacement arrived, before the roll call and the plan).
        self.phase_hooks: list[PhaseHook] = []
        # Measures detection time from a known injection instead of from the attempt's start.
        self.injection_clock: InjectionClock | None = injection_clock
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.heal_events: list[HealEvent] = []  # the heals of lost ranks (accelpact.recovery.heal)
        # Called as hook(event) on a survivor once a heal is done, before training continues (e.g. to
        # build a side group with the replacement, which builds its own right after attach returns).
        self.heal_hooks: list[Callable[[HealEvent], None]] = []
        self.last_snapshot_wait_s = 0.0  # how long the last step's before_update() blocked
        # True once finish() returned (and no heal moved the run back since); close() then marks the end.
        self._finished = False
        # On a replacement: where attach() resumed it, as the RolledBack a survivor catches. None elsewhere.
        self.resumed: RolledBack | None = None
        self._modules_recorded = False  # what this process loaded, written once after its first commit
        self._closed = False
        self._progress = 0  # bumped at every phase boundary; peers read it from the heartbeat
        parts = wire(
            model,
            optimizer,
            control,
            rank=self.rank,
            world_size=self.world_size,
            process_group=process_group,
            config=config,
            state=self.state,
            events=self.events,
            snapshots=snapshots,
            heal=heal,
            hook=self._hook,
            progress=lambda: self._progress,
        )
        self.plane: DataPlane = parts.plane
        self._heartbeat, self._watchdog = parts.heartbeat, parts.watchdog
        self._wait, self._vote = parts.wait, parts.vote
        self._recovery, self._healer = parts.recovery, parts.healer
        if rejoin is not None:
            self._join(rejoin)

    # -- public ------------------------------------------------------------------------------------

    @property
    def process_groups(self) -> list[dist.ProcessGroup]:
        """The live generation of every data-plane group, vote group included."""
        return list(self.plane.groups)

    @property
    def backend(self) -> Backend:
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

        Only the numbering changes: the caller restores model and optimizer state. Call it between steps,
        before the first :meth:`step` of the resumed run, so recovery reports and errors name its step numbers.
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
            self._vote.loop_step = int(step)
        step = self.state.next_step
        state = self.state
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
                self._vote(0, step, state.region_done, self.committed_step)
                state.unchecked_since = time.time()
                if self._watchdog is not None:
                    self._watchdog.end_attempt(completed=True)
                state.phase = Phase.VOTED
                self._hook("post_vote", step)
                self._apply(step)
                return loss
            except BaseException as exc:  # noqa: BLE001 - _recover returns None for anything but a comm fault
                recovered = self._recover(exc, step, t_start)
                if recovered is None:
                    raise
            if not isinstance(recovered, Decision):  # a lost rank was healed
                if recovered.resume_step == step:
                    torch.set_rng_state(rng)  # the same step again, as after a retry
                    continue
                raise RolledBack(  # our own snapshot restored the RNG of resume_step
                    f"rank {self.rank}: healed the loss of rank(s) {recovered.event.lost_ranks}; rolled back "
                    f"to step {recovered.resume_step - 1}, continue at step {recovered.resume_step}",
                    resume_step=recovered.resume_step,
                    extra_state=recovered.extra_state,
                ) from None
            # the vote completed on some rank: apply the step; else retry it
            if decisions.rolls_forward(recovered, self.rank, step, state.phase, loss is not None, self.committed_step):
                self._apply(step)
                return cast(torch.Tensor, loss)  # rolls_forward raised if step_fn had not returned
            torch.set_rng_state(rng)  # retry the same step on the same batch

    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
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
        state = self.state
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
                result: R | None = None
                if self._watchdog is not None:
                    self._watchdog.begin_attempt(getattr(self.control, "generation", 0))
                try:
                    result = fn(*args, **kwargs)
                    state.region_phase = RegionPhase.IN_VOTE
                    self._vote(2 if fn is _nothing else 1, state.next_step, state.region_done + 1, self.committed_step)
                    state.unchecked_since = time.time()
                    if self._watchdog is not None:
                        self._watchdog.end_attempt(completed=False)  # a region's length is not a step's
                    state.region_done += 1
                    return result
                except BaseException as exc:  # noqa: BLE001 - _recover returns None for anything but a comm fault
                    recovered = self._recover(exc, position, t_start, region=True)
                    if recovered is None:
                        raise
                if not isinstance(recovered, Decision):  # a lost rank was healed: every rank re-runs the step
                    raise RolledBack(
                        f"rank {self.rank}: healed the loss of rank(s) {recovered.event.lost_ranks} inside guard.run "
                        f"after step {position - 1}; continue at step {recovered.resume_step}",
                        resume_step=recovered.resume_step,
                        extra_state=recovered.extra_state,
                    ) from None
                peers = state.peer_regions
                action = decisions.region_action(recovered, rank=self.rank, committed=self.committed_step, peers=peers)
                if action is RegionAction.COMPLETE:
                    state.region_done += 1
                    return cast(R, result)  # every rank had finished fn: its result, computed before the fault
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
            launcher_notes.mark_ended(self.control, self.rank, self.committed_step)
        self._closed = True
        self.phase_hooks.clear()
        if self._heartbeat is not None:
            self._heartbeat.stop(wait_s=_THREAD_STOP_S)
        if self._watchdog is not None:
            self._watchdog.stop(wait_s=_THREAD_STOP_S)

    # -- the step ---------------------------------------------------------------------------------

    def _recover(
        self, exc: BaseException, position: int, t_start: float, region: bool = False
    ) -> Decision | HealOutcome | None:
        """The catch of a failed attempt at ``position`` (a step, or a guarded region when ``region``), shared
        by :meth:`step` and :meth:`run`: None when ``exc`` is no communication fault (the caller re-raises
        it); else the recovery round's decision, or, when the round found a rank dead and ``heal=`` is on,
        the heal's outcome (the caller moves on to its resume step). A lost control store, a rank lost
        without a heal, or one that missed the deadline (it may be alive and hung) raise."""
        fired = self._watchdog.end_attempt(completed=False) if self._watchdog is not None else None
        if not self.plane.is_comm_fault(exc):
            return None
        t_caught = time.time()
        try:
            decision = recovery.recover(
                self._recovery, exc, position, t_start, watchdog=fired, injection_clock=self.injection_clock
            )
        except ControlChannelError as lost:  # the store's host died: say so (accelpact.control.store_loss)
            raise store_lost_error(
                lost, control=self.control, step=position, committed_step=self.committed_step
            ) from lost
        except RankLostError as lost:
            if self._healer is None or lost.detected_by not in _HEALABLE:
                raise
            _drop_traceback(exc)
            del exc
            # a region resumes at most at the last committed step: the replacement starts at a step's top
            return self._heal(lost, position, t_caught, resume_by=max(self.committed_step, 0) if region else None)
        _drop_traceback(exc)
        return decision

    def _join(self, rejoin: RejoinTicket) -> None:
        """On a replacement: join the survivors' heal and record where this process resumes (``resumed``)."""
        if self._healer is None:
            raise AccelPactError("attach(rejoin=ticket) needs heal=HealPolicy(...): the replacement's heal runs it")
        rejoin.stop_heartbeat()  # this guard's own heartbeat beats from now on
        if hasattr(self.control, "heartbeat"):  # at once: no JOINING beat may outlive the join (detection.liveness)
            self.control.heartbeat()
        outcome = self._healer.join(rejoin)
        self.heal_events.append(outcome.event)
        self.resumed = RolledBack(
            f"rank {self.rank}: replacement resumed at step {outcome.resume_step} (loaded step "
            f"{outcome.resume_step - 1} from {outcome.event.source})",
            resume_step=outcome.resume_step,
            extra_state=outcome.extra_state,
        )

    def _heal(self, lost: RankLostError, step: int, t_caught: float, resume_by: int | None = None) -> HealOutcome:
        """A survivor's heal of the ranks ``lost`` names (accelpact.recovery.heal); the outcome, hooks run."""
        outcome = self._healer.survive(lost, step, t_caught, resume_by=resume_by)  # type: ignore[union-attr]  # set: callers check
        self.state.region_done = 0  # every rank resumes at the top of a step
        self._finished = False
        self.heal_events.append(outcome.event)
        for heal_hook in self.heal_hooks:
            heal_hook(outcome.event)
        self.state.unchecked_since = time.time()
        return outcome

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
        if not self._modules_recorded:  # under accelpact.run: for the template (guard.launcher_notes)
            self._modules_recorded = True
            launcher_notes.record_modules(self.control, self.rank)
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


def _nothing() -> None:
    """finish()'s region: nothing but the region vote."""
