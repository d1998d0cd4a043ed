"""Recovery rounds without a Guard or a process group: ``recover`` driven by a stand-in data plane and
control channel (pure logic of the rounds: the decision, the event, nested rounds, MAX_ROUNDS).

The real rounds over gloo are covered by test_recovery_fsdp2.py and friends; these check what the rounds
do with what they are given, which the multi-process tests can only reach by timing.
"""

from __future__ import annotations

import pytest

from accelpact.backends import is_comm_fault
from accelpact.errors import CommFault, RankLostError
from accelpact.events import RecoveryLog
from accelpact.recovery.consensus import Action, Phase, RankReport
from accelpact.recovery.context import RecoveryContext, StepState
from accelpact.recovery.rounds import MAX_ROUNDS, recover


class FakeControl:
    """The control channel's generation counter and report gather; the peers' reports are scripted."""

    def __init__(self, peers: dict[int, RankReport], lost: RankLostError | None = None) -> None:
        self.generation = 0
        self.peers = peers
        self.lost = lost
        self.gathers: list[int] = []

    def advance_generation(self) -> int:
        self.generation += 1
        return self.generation

    def gather(self, what: str, payload: bytes, generation: int, watch=None) -> dict[int, bytes]:
        assert what == "report" and watch is None
        self.gathers.append(generation)
        if self.lost is not None:
            raise self.lost
        mine = RankReport.from_bytes(payload)
        return {mine.rank: payload, **{r: p.to_bytes() for r, p in self.peers.items()}}


class FakePlane:
    """A data plane whose rebuild fails ``fail`` times with ``error`` before it works; records every call."""

    def __init__(self, fail: int = 0, error: BaseException | None = None) -> None:
        self.groups = ["g0", "vote"]
        self.calls: list[tuple] = []
        self.fail = fail
        self.error = error or CommFault("Connection closed by peer (rebuild)")
        self.rescanned = False
        self.last_path = {"path": "fake", "why": "a unit test's stand-in"}

    def abort(self) -> int:
        self.calls.append(("abort",))
        return 1

    def is_comm_fault(self, exc: BaseException) -> bool:
        return is_comm_fault(exc)

    def forget_expired(self) -> None:
        self.calls.append(("forget_expired",))

    def rescan(self) -> None:
        self.calls.append(("rescan",))
        self.rescanned = True

    def rebuild(self, generation: int, clock=None):
        self.calls.append(("rebuild", generation))
        if self.fail:
            self.fail -= 1
            raise self.error
        if clock is not None:
            clock.mark()
            clock.mark()
        old, self.groups = self.groups, [f"{g}@{generation}" for g in ["g0", "vote"]]
        return old, list(self.groups)

    def prove(self, new_groups) -> None:
        self.calls.append(("prove", tuple(new_groups)))

    def prepare_next_generation(self) -> None:
        self.calls.append(("prepare",))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def context(plane: FakePlane, control: FakeControl, state: StepState, world_size: int = 2):
    resets: list[int] = []
    hooks: list[tuple[str, int]] = []
    ctx = RecoveryContext(
        rank=0,
        world_size=world_size,
        control=control,
        plane=plane,
        state=state,
        reset_fsdp=lambda: resets.append(1),
        hook=lambda p, s: hooks.append((p, s)),
        liveness=None,
        events=RecoveryLog(),
    )
    return ctx, resets, hooks


def test_fault_before_the_vote_on_every_rank_is_retried_in_one_round():
    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE)
    plane = FakePlane()
    control = FakeControl({1: RankReport(1, 5, 4, Phase.BEFORE_VOTE)})
    ctx, resets, hooks = context(plane, control, state)
    d = recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    assert d.action is Action.RETRY and d.step == 5 and d.resume_step == 5 and d.apply_on == ()
    assert plane.names() == ["forget_expired", "abort", "rescan", "rebuild", "prove", "prepare"]
    assert plane.calls[4] == ("prove", ("g0@1", "vote@1"))  # the new generation, not the old one
    assert control.gathers == [1] and resets == [1] and hooks == [("recovery", 5)]
    assert state.unchecked_since is not None and state.committed_step == 4  # recover never commits
    (event,) = ctx.events
    assert (event.step, event.generation, event.rounds, event.phase) == (5, 1, 1, "before_vote")
    assert event.decision == {"action": "retry", "step": 5, "apply_on": [], "resume_step": 5}
    assert event.ranks == [0, 1] and event.detected_by == "exception" and len(event.round_times) == 1


def test_a_vote_completed_on_a_peer_rolls_this_rank_forward_and_keeps_its_gradients():
    state = StepState(committed_step=4, next_step=5, phase=Phase.IN_VOTE, unchecked_since=None)
    plane = FakePlane()
    plane.rescanned = True  # after the first step: no rescan
    control = FakeControl({1: RankReport(1, 5, 4, Phase.VOTED)})
    ctx, resets, _ = context(plane, control, state)
    d = recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0, watchdog="peer 1 stopped")
    assert d.action is Action.ROLL_FORWARD and d.apply_on == (0, 1) and d.resume_step == 6
    assert resets == []  # the reduced gradients are needed for the roll forward
    assert "rescan" not in plane.names()
    assert ctx.events[0].detected_by == "watchdog" and ctx.events[0].fault["watchdog"] == "peer 1 stopped"


def test_retry_after_the_vote_drops_the_gradients_nobody_committed():
    state = StepState(committed_step=4, next_step=5, phase=Phase.IN_VOTE)
    plane = FakePlane()
    control = FakeControl({1: RankReport(1, 5, 4, Phase.BEFORE_VOTE)})
    ctx, resets, _ = context(plane, control, state)
    d = recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    assert d.action is Action.RETRY and resets == [1]  # once, after the decision


def test_nested_faults_start_new_rounds_on_new_generations():
    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE)
    plane = FakePlane(fail=2)
    control = FakeControl({1: RankReport(1, 5, 4, Phase.BEFORE_VOTE)})
    ctx, resets, hooks = context(plane, control, state)
    d = recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    assert d.action is Action.RETRY
    assert [c for c in plane.calls if c[0] == "rebuild"] == [("rebuild", 1), ("rebuild", 2), ("rebuild", 3)]
    assert plane.names().count("abort") == 3  # the fault, then each half-built generation
    assert plane.names().count("rescan") == 1  # round 1 only
    assert control.gathers == [1, 2, 3] and len(resets) == 3 and hooks == [("recovery", 5)]
    (event,) = ctx.events
    assert event.rounds == 3 and event.generation == 3 and len(event.round_times) == 3


def test_a_data_plane_that_never_comes_back_gives_up_after_max_rounds():
    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE)
    plane = FakePlane(fail=10 * MAX_ROUNDS)
    control = FakeControl({1: RankReport(1, 5, 4, Phase.BEFORE_VOTE)})
    ctx, _, _ = context(plane, control, state)
    with pytest.raises(RankLostError, match=f"{MAX_ROUNDS} recovery rounds in a row failed for step 5") as info:
        recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    assert plane.names().count("rebuild") == MAX_ROUNDS and info.value.last_committed_step == 4
    assert list(ctx.events) == [] and state.unchecked_since is None


def test_an_error_that_is_no_comm_fault_ends_the_recovery_at_once():
    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE)
    plane = FakePlane(fail=1, error=ValueError("shape mismatch"))
    ctx, _, _ = context(plane, FakeControl({1: RankReport(1, 5, 4, Phase.BEFORE_VOTE)}), state)
    with pytest.raises(ValueError, match="shape mismatch"):
        recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    assert plane.names().count("rebuild") == 1 and list(ctx.events) == []


def test_a_rank_lost_during_the_gather_is_named_with_the_generation_and_how_it_was_found():
    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE)
    plane = FakePlane()
    lost = RankLostError("rank 1 is dead (notice)", ranks=(1,), detected_by="notice")
    ctx, _, _ = context(plane, FakeControl({}, lost=lost), state)
    with pytest.raises(RankLostError) as info:
        recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    err = info.value
    assert (err.ranks, err.generation, err.detected_by, err.last_committed_step) == ((1,), 1, "notice", 4)
    assert "rebuild" not in plane.names()


def test_diverged_reports_raise_instead_of_rebuilding():
    from accelpact.errors import StateDivergedError

    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE)
    plane = FakePlane()
    control = FakeControl({1: RankReport(1, 7, 6, Phase.BEFORE_VOTE)})  # two steps ahead: impossible
    ctx, _, _ = context(plane, control, state)
    with pytest.raises(StateDivergedError):
        recover(ctx, CommFault("Connection closed by peer"), 5, t_start=0.0)
    assert "rebuild" not in plane.names()


def test_the_injection_clock_is_asked_from_when_the_data_plane_was_last_checked():
    asked: list[float] = []
    state = StepState(committed_step=4, next_step=5, phase=Phase.BEFORE_VOTE, unchecked_since=10.0)
    plane = FakePlane()
    ctx, _, _ = context(plane, FakeControl({1: RankReport(1, 5, 4, Phase.BEFORE_VOTE)}), state)
    recover(
        ctx,
        CommFault("Connection closed by peer"),
        5,
        t_start=12.0,
        injection_clock=lambda since: asked.append(since) or 11.0,
    )
    assert asked == [10.0]  # min(attempt start, last check)
    assert ctx.events[0].detection_from == "injection" and ctx.events[0].reports[0]["injected_at"] == 11.0
