"""Heal a lost rank in memory: survivors keep their live state and wait for a replacement process.

Who waits for whom (docs/process_loss.md has the whole protocol):

1. A survivor's recovery round finds a rank dead (RankLostError from a death notice or the heartbeat
   rule). With a :class:`HealPolicy` attached it does not give up: it flushes its snapshot copy,
   discards the failed step's gradients, and posts a heal request per lost rank.
2. It waits (``replacement_timeout_s``) until a replacement process of each lost rank has ARRIVED
   on the control channel (``{token}/heal/arrived/{rank}``, with a pid that no death notice names).
   The launcher starts the replacement when it reaps the dead process (or a hot spare takes the rank).
3. It writes the replacement's PLAN (``{token}/heal/plan/{rank}/{pid}``): the generation G to build
   and the data-plane groups' names; then builds generation G under the old names (the replacement
   builds the same groups on the same store prefix: accelpact.recovery.rejoin) and rebinds.
4. Every rank posts a :class:`accelpact.recovery.heal_plan.HealReport` at G; all compute the same resume
   step S (newest step every rank holds). Survivors past S roll back from their own slot; the
   replacement loads S from its own slot (the dead process's shared memory), else a buddy replica.
5. First collective on G; continue at S + 1.

A replacement lost during its heal shows up as one more death (a notice naming its pid): the
survivors go around again from step 2 and wait for the next replacement.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from accelpact.control import notice_auth
from accelpact.detection.liveness import (
    DeathNotice,
    LivenessConfig,
    PeerJudge,
    PeerWatch,
    heartbeat_key,
    notice_applies,
    notice_key,
    parse_beat,
)
from accelpact.errors import RankLostError
from accelpact.events import HealEvent
from accelpact.recovery.heal_groups import merge_group_posts
from accelpact.recovery.heal_join import join_as_replacement
from accelpact.recovery.heal_plan import HealReport, ResumePlan, decide_resume
from accelpact.recovery.heal_policy import FetchReplica, HealOutcome, HealPolicy
from accelpact.recovery.heal_wait import (
    ReplacementWatch,
    abandoned_key,
    arrived_key,
    joining_key,
    plan_key,
    publish_no_replacement,
    request_key,
    rollcall_key,
)
from accelpact.recovery.heal_wait import peek as _peek

if TYPE_CHECKING:
    from accelpact.recovery.context import RecoveryContext
    from accelpact.recovery.rejoin import RejoinTicket

_log = logging.getLogger(__name__)

__all__ = [
    "FetchReplica",
    "HealPolicy",
    "HealOutcome",
    "Healer",
    "arrived_key",
    "plan_key",
    "request_key",
    "joining_key",
    "abandoned_key",
    "publish_no_replacement",
]

# How often a survivor at the roll call reads every rank's notice and the others' posts (store round trips).
ROLL_CALL_POLL_S = 0.02


class Healer:
    """One rank's side of heals: :meth:`survive` on a survivor, :meth:`join` on a replacement.

    It gets the guard's recovery context (the data plane, the step state, the control channel), never
    the guard itself."""

    def __init__(self, ctx: RecoveryContext, policy: HealPolicy, snapshots: Any) -> None:
        self.ctx = ctx
        self.policy = policy
        self.snapshots = snapshots
        self.control = ctx.control
        self._resume_by: int | None = None  # survive()'s, for the report of its current heal

    # -- survivors --------------------------------------------------------------------------------

    def survive(self, lost: RankLostError, step: int, t_detected: float, resume_by: int | None = None) -> HealOutcome:
        """Heal the ranks ``lost`` names; returns where to continue. Raises RankLostError when impossible.

        ``resume_by``: the latest step this rank can resume at (a guarded region passes its committed
        step: accelpact.recovery.heal_plan.HealReport.resume_by)."""
        g = self.ctx
        self._resume_by = resume_by
        if self.snapshots is not None:
            self.snapshots.flush()  # a copy in flight must not race the rollback (or be half-read)
        # Nobody can roll the failed step forward (the lost rank's gradients are gone): drop ours.
        g.reset_fsdp()
        dead = set(lost.ranks)
        # Replacements lost on their way in (before arriving, or before the rendezvous) are seen from
        # the launcher's notices within NOTICE_POLL_S; each costs one more wait, bounded per rank.
        watch = ReplacementWatch(self.control, g.rank, self.policy.max_rounds, poll_s=self.policy.poll_s)
        watch.scan(dead - {g.rank}, "lost")  # the processes this heal is for
        rounds = 0
        roll_calls: dict[int, int] = {}  # generation -> roll calls held for it
        # Every rank this heal replaces, for its event: a round retried after a link fault starts with no rank
        # dead (its replacements are alive and beating) but still heals the ones lost before.
        healing = set(dead) - {g.rank}
        while True:
            rounds += 1
            if rounds > self.policy.max_rounds:
                raise RankLostError(
                    f"rank {g.rank}: {self.policy.max_rounds} heals in a row failed after losing rank(s) "
                    f"{sorted(dead)} at step {step} (a replacement was lost during each); restore from a "
                    "checkpoint, or raise HealPolicy.max_rounds",
                    ranks=tuple(sorted(dead)),
                    last_committed_step=g.state.committed_step,
                    detected_by="heal",
                )
            dead |= self._dead_now()
            dead.discard(g.rank)
            _log.info("rank %d: heal round %d for lost rank(s) %s at step %d", g.rank, rounds, sorted(dead), step)
            for r in dead:
                self.control.set(
                    request_key(self.control, r),
                    json.dumps({"generation": self.control.generation, "by": g.rank, "t": time.time()}).encode(),
                )
            arrivals = self._wait_arrivals(dead, step, watch)
            t_arrived = time.time()
            generation = self.control.generation + 1
            g.hook("heal_plan", step)  # the survivors' last point before the roll call and the plan
            attempt = roll_calls.get(generation, 0)
            roll_calls[generation] = attempt + 1
            more, groups = self._roll_call(generation, attempt, dead)
            if more is not None:
                _log.info(
                    "rank %d: heal round %d: roll call %d of generation %d found rank(s) %s lost too",
                    g.rank,
                    rounds,
                    attempt,
                    generation,
                    sorted(more - dead),
                )
                dead |= more
                watch.scan(more - {g.rank}, "lost")
                continue
            # Every survivor writes the same plan: the union of the groups all of them posted at the roll
            # call (under HSDP no survivor holds every group a replacement needs: accelpact.recovery.heal_groups).
            plan = {"generation": generation, "lost": sorted(dead), "t": time.time(), **groups}
            for r, pid in arrivals.items():
                self.control.set(plan_key(self.control, r, pid), json.dumps(plan).encode())
            self.control.advance_generation()
            # Enter the rendezvous only once every replacement has taken its plan: one lost before
            # that would leave us in gloo's rendezvous until the control deadline (accelpact.recovery.heal_wait).
            gone = watch.wait_joining(arrivals, getattr(getattr(self.control, "config", None), "deadline_s", 30.0))
            if gone:
                _log.info(
                    "rank %d: heal round %d: the replacement of rank(s) %s was lost before the rendezvous",
                    g.rank,
                    rounds,
                    sorted(gone),
                )
                continue
            healing |= dead
            try:
                return self._heal_round(step, generation, sorted(healing), rounds, t_detected, t_arrived, watch)
            except RankLostError as again:
                if again.detected_by == "heal":
                    raise
                dead = set(again.ranks)
                watch.scan(dead - {g.rank}, "during the heal")
            except BaseException as nested:  # noqa: BLE001 - a rendezvous or collective with a dead replacement
                if not g.plane.is_comm_fault(nested):
                    raise
                _log.info("rank %d: heal round %d failed: %s", g.rank, rounds, str(nested)[:200])
                del nested
                watch.scan(set(watch.dead_pids), "during the heal")
                dead = set()  # who died is read from the notices at the top of the loop
            g.plane.abort()

    def _roll_call(self, generation: int, attempt: int, dead: set[int]) -> tuple[set[int] | None, dict[str, Any]]:
        """Before any plan is written: every survivor is present, or noticed dead, and all plan for the same ranks.

        Each survivor posts the lost ranks it is about to plan for under ``{token}/heal/rollcall/{G}/{attempt}/
        {rank}``, with its process groups (:func:`_groups_post`), and waits until every other rank outside
        that set posted or is noticed dead (its launcher's notice names the pid it beats with). ``(None,
        groups)``: every other survivor posted the same set and none is dead: write the plans, with
        ``groups`` (every survivor's groups merged: accelpact.recovery.heal_groups). Otherwise ``(the ranks
        to heal instead, {})`` (every death seen, every set posted): every survivor that saw the same goes
        around and holds roll call ``attempt + 1``. Without it, a
        survivor lost after the recheck of notices before the plan was found only by gloo's rendezvous, at
        its store timeout (the PG timeout: 60 s in the harness), and the heal fell back to disk. A death
        after a survivor's roll call (a few milliseconds before its rendezvous) still costs that timeout.
        """
        g = self.ctx
        mine = {"dead": sorted(dead), **self._groups_post()}
        self.control.set(rollcall_key(self.control, generation, attempt, g.rank), json.dumps(mine).encode())
        others = set(range(g.world_size)) - dead - {g.rank}
        deadline_s = getattr(getattr(self.control, "config", None), "deadline_s", 30.0)
        deadline = time.monotonic() + deadline_s
        posted: dict[int, set[int]] = {}
        groups: dict[int, dict[str, Any]] = {g.rank: mine}
        while True:
            noticed = self._dead_now() & others  # notices first: a post seen after a notice is not trusted
            for r in sorted(others - set(posted)):
                raw = _peek(self.control, rollcall_key(self.control, generation, attempt, r))
                if raw is not None:
                    groups[r] = json.loads(raw.decode())
                    posted[r] = {int(x) for x in groups[r]["dead"]}
            union = set().union(*posted.values()) if posted else set()
            if noticed:
                return dead | noticed | union, {}
            if set(posted) == others:
                if union <= dead and all(p == dead for p in posted.values()):
                    return None, merge_group_posts(groups)
                return dead | union, {}
            if time.monotonic() >= deadline:
                missing = sorted(others - set(posted))
                raise RankLostError(
                    f"rank {g.rank}: heal roll call {attempt} of generation {generation}: rank(s) {missing} neither "
                    f"answered within {deadline_s:g} s (the control deadline) nor were noticed dead: hung, or on "
                    "another heal round; restore from a checkpoint",
                    ranks=tuple(missing),
                    detected_by="heal",
                )
            time.sleep(ROLL_CALL_POLL_S)

    def _groups_post(self) -> dict[str, Any]:
        """This survivor's part of the plan's groups: its data-plane groups and how a replacement joins them."""
        return {"groups": [_spec_to_dict(s) for s in self.ctx.plane.specs], **self.ctx.plane.join_plan()}

    def _heal_round(
        self,
        step: int,
        generation: int,
        lost: list[int],
        rounds: int,
        t_detected: float,
        t_arrived: float,
        watch: ReplacementWatch,
    ) -> HealOutcome:
        g, state = self.ctx, self.ctx.state
        old_groups, new_groups = g.plane.rebuild(generation)
        held = {state.committed_step: "live"}
        if self.snapshots is not None:
            held.update({s: "own" for s in self.snapshots.held_steps() if s not in held})
        plan = self._agree(
            HealReport(g.rank, "survivor", state.committed_step, held, resume_by=self._resume_by), generation
        )
        t_load = time.time()
        extra: dict[str, Any] = {}
        replayed = plan.replayed(state.committed_step)
        if state.committed_step > plan.step:
            extra = self.snapshots.restore(plan.step) or {}
            state.committed_step = plan.step
        state.next_step = plan.resume_step
        load_s = time.time() - t_load
        g.hook("recovery", step)
        g.plane.prove(new_groups)
        t_end = time.time()
        del old_groups
        g.plane.prepare_next_generation()
        event = HealEvent(
            role="survivor",
            lost_ranks=lost,
            step=step,
            resume_step=plan.resume_step,
            replayed_steps=replayed,
            source=plan.healed_from(),
            own_source=plan.sources[g.rank],
            generation=generation,
            replacement_start_s=t_arrived - t_detected,
            heal_transfer_s=t_end - t_arrived,
            total_s=t_end - t_detected,
            t=t_end,
            t_detected=t_detected,
            rounds=rounds,
            load_s=load_s,
            replacements_lost=list(watch.lost),
            data_plane=dict(g.plane.last_path),
        )
        _log.info(
            "rank %d: healed rank(s) %s from %s; resuming at step %d", g.rank, lost, event.source, plan.resume_step
        )
        return HealOutcome(plan.resume_step, extra, event)

    def _dead_now(self) -> set[int]:
        """Ranks whose death notice names the pid they beat with now (or that never beat again)."""
        dead = set()
        for r in range(self.ctx.world_size):
            if r == self.ctx.rank:
                continue
            notice = _peek(self.control, notice_key(self.control.job_token, r))
            if notice is None:
                continue
            try:
                n = DeathNotice.from_bytes(json.dumps(notice_auth.verify(notice, self.control.job_token)).encode())
            except (notice_auth.NoticeRejected, ValueError, KeyError, TypeError):
                continue
            if notice_applies(n.pid, parse_beat(_peek(self.control, heartbeat_key(self.control.job_token, r)))):
                dead.add(r)
        return dead

    def _wait_arrivals(self, lost: set[int], step: int, watch: ReplacementWatch) -> dict[int, int]:
        """rank -> pid of the replacement of every rank in ``lost``, once all have arrived.

        Ends early with RankLostError when the launcher says no replacement will come, or when a rank's
        replacements keep dying (``watch``); a replacement that dies before arriving is only waited for
        again (the launcher starts the next one)."""
        deadline = time.monotonic() + self.policy.replacement_timeout_s
        found: dict[int, int] = {}
        next_scan = time.monotonic()
        while True:
            if watch.due():  # every NOTICE_POLL_S: the launcher's notices and its no-replacement word
                if watch.scan(lost, "before arriving"):
                    found = {r: p for r, p in found.items() if not watch.is_dead(r, p)}
                watch.check_abandoned(lost - set(found))
            for r in sorted(lost - set(found)):
                raw = _peek(self.control, arrived_key(self.control, r))
                if raw is None:
                    continue
                pid = int(json.loads(raw.decode())["pid"])
                if watch.is_dead(r, pid) or pid == _notice_pid(
                    _peek(self.control, notice_key(self.control.job_token, r)), self.control.job_token
                ):
                    continue  # an earlier replacement, itself lost since
                found[r] = pid
            if set(found) >= lost:
                # A rank that died with the others but whose notice came later must be in this round: a plan
                # without it sends everyone into a rendezvous with a dead member (docs/process_loss.md).
                if not self._add_new_deaths(lost, watch):
                    return found
                next_scan = time.monotonic() + 0.5
                continue
            if time.monotonic() >= deadline:
                missing = sorted(lost - set(found))
                raise RankLostError(
                    f"no replacement for lost rank(s) {missing} arrived within replacement_timeout_s="
                    f"{self.policy.replacement_timeout_s:g} (seen from rank {self.ctx.rank}, step {step}); the "
                    "launcher must start one per lost rank (harness: strategy=accelpact does), or raise "
                    "HealPolicy.replacement_timeout_s. Restore from a checkpoint.",
                    ranks=tuple(missing),
                    last_committed_step=self.ctx.state.committed_step,
                    detected_by="heal",
                )
            if time.monotonic() >= next_scan:  # another rank may die while we wait: heal it in the same round
                self._add_new_deaths(lost, watch)
                next_scan = time.monotonic() + 0.5
            time.sleep(self.policy.poll_s)

    def _add_new_deaths(self, lost: set[int], watch: ReplacementWatch) -> bool:
        """Add to ``lost`` (in place) every other rank dead by its notice now; True when there was one."""
        more = self._dead_now() - {self.ctx.rank} - lost
        if more:
            watch.scan(more, "lost")
            lost |= more
        return bool(more)

    def _agree(self, report: HealReport, generation: int) -> ResumePlan:
        """Gather every rank's heal report at ``generation`` (a death raises RankLostError), then decide."""
        # Only notices count here (never the heartbeat rule): a replacement builds its model meanwhile, beating
        # as JOINING until its guard takes over, and the notice about its predecessor is not about it.
        watch = PeerWatch(
            self.control.job_token,
            self.ctx.rank,
            PeerJudge(self.ctx.liveness or LivenessConfig(), connection_dropped=False, joining_is_dead=False),
        )
        raw = self.control.gather(
            "heal", report.to_bytes(), generation, deadline_s=self.policy.replacement_timeout_s, watch=watch
        )
        return decide_resume([HealReport.from_bytes(raw[r]) for r in sorted(raw)], self.ctx.world_size)

    # -- a replacement ----------------------------------------------------------------------------

    # -- the replacement ---------------------------------------------------------------------------

    def join(self, ticket: RejoinTicket) -> HealOutcome:
        """The replacement's heal, after its model, FSDP wrapping and optimizer exist (attach calls it)."""
        return join_as_replacement(
            self.ctx, self.policy, self.snapshots, ticket, agree=self._agree, survive=self.survive
        )


def _notice_pid(raw: bytes | None, token: str) -> int | None:
    if raw is None:
        return None
    try:
        pid = notice_auth.verify(raw, token).get("pid")
    except (notice_auth.NoticeRejected, ValueError, KeyError, TypeError):
        return None
    return None if pid is None else int(pid)


def _spec_to_dict(spec: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "backend": spec.backend,
        "ranks": list(spec.ranks),
        "is_default": spec.is_default,
        "tag": spec.tag,
        "desc": spec.desc,
        "timeout_s": None if spec.timeout is None else spec.timeout.total_seconds(),
        "bound": spec.device_id is not None,
    }
