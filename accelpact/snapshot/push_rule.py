"""Which snapshots go to the buddy (``SnapshotConfig.push_every``), and which own slot a rank keeps.

Pure logic (no torch, no I/O): the Snapshotter and the tests call it.

**The rule.** With ``every = e`` (snapshot the steps divisible by e) and ``push_every = k``, the
snapshot of step s is pushed when ``s % (e * k) == 0``: every k-th snapshot, chosen by its step
number, not by a counter. Every rank thus pushes the same steps, and a restarted or replacement
rank (whose counters start again at zero) keeps pushing the same ones. Step 0's snapshot is pushed.
k = 1 pushes every snapshot (the behaviour before the option existed).

**What a rank keeps.** A replacement whose host was lost can only resume at a step its buddy holds
a replica of: a pushed step. The heal (and ``restore_latest``) resumes at the newest step EVERY
rank holds, so the survivors must still hold that pushed step in one of their two own slots. With
k = 1 overwriting the older slot does that. With k > 1 it would not (slots of steps 4 and 5 while the
newest replica is of step 3), so the slot a new snapshot overwrites is never the one holding the
newest pushed step (:func:`slot_to_overwrite`). A rank's two slots then hold its newest snapshot and
its newest pushed snapshot (or the two newest pushed ones, right after a pushed step).

**The bound on replayed steps after a host loss.** Let K = e * k. See :func:`replay_bound` and
docs/snapshots.md ("push_every") for the argument; in short: at most K steps are replayed when a
rank's push of step s is acknowledged before it enters the vote of step s + 1
(``Replication(confirm=True)``); with asynchronous pushes (the default) the heal replays at most K
steps when the lost rank's newest pushed snapshot had landed, and otherwise finds no common step
and fails loudly (a disk-checkpoint fallback), never resuming from mismatched steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = ["check_push_every", "is_pushed", "pushed_steps", "replay_bound", "slot_to_overwrite"]

Slot = TypeVar("Slot")


def check_push_every(push_every: int) -> int:
    """``push_every`` as an int >= 1; ValueError naming the fix otherwise."""
    if isinstance(push_every, bool) or not isinstance(push_every, int) or push_every < 1:
        raise ValueError(
            f"push_every={push_every!r}: use 1 (push every snapshot to the buddy) or more (push every "
            "k-th snapshot); to push none, turn replicas off instead"
        )
    return push_every


def is_pushed(step: int, every: int = 1, push_every: int = 1) -> bool:
    """Whether the snapshot of ``step`` is pushed to the buddy (only snapshotted steps can be)."""
    return step % (every * check_push_every(push_every)) == 0


def pushed_steps(steps: range | list[int], every: int = 1, push_every: int = 1) -> list[int]:
    """The steps among ``steps`` whose snapshot is pushed."""
    return [s for s in steps if is_pushed(s, every, push_every)]


def replay_bound(every: int = 1, push_every: int = 1) -> int:
    """The most steps a heal from a buddy replica replays, given every push was acknowledged before the
    vote of the next step (``Replication(confirm=True)``): ``every * push_every``.

    Why (per-step snapshots, every = 1, K = k): a rank enters the vote of step c + 1 only after its
    snapshot of c is complete, and with ``confirm`` a pushed snapshot is complete only once the buddy
    acknowledged it. Let the survivors have committed c, and s be the newest pushed step <= c. If
    c > s, every rank entered the vote of c >= s + 1, so the lost rank's replica of s had landed, and
    each survivor holds s (its kept slot): the heal resumes at s, replaying c - s <= K - 1 steps. If
    c = s, the replica of s may not have landed, but that of s - K had (the vote of s - K + 1 was
    entered), and the survivors hold s - K (the kept slot is overwritten only by the snapshot after
    s): K steps replayed at most. With every = e, the same argument over snapshotted steps gives e * k.
    """
    return every * check_push_every(push_every)


def slot_to_overwrite(
    held: Mapping[Slot, int | None],
    new_step: int,
    every: int = 1,
    push_every: int = 1,
    was_pushed: Callable[[int], bool] | None = None,
) -> Slot:
    """The slot a snapshot of ``new_step`` goes to, given the step each slot holds (None: no valid slot).

    An empty slot first (in ``held``'s order); else never the slot of the newest pushed step
    (k = 1: every held step is pushed, so this is the older slot, as before); if no slot holds a
    pushed step, the older one.
    """
    if not held:
        raise ValueError("no snapshot slots to choose from")
    for slot, step in held.items():
        if step is None:
            return slot
    steps: dict[Slot, int] = {s: int(v) for s, v in held.items() if v is not None}
    # ``was_pushed``: whether a held step was pushed under the cadence in force WHEN it was taken (a tax
    # budget switches cadence; judging an older step by the new one would drop the buddy's newest replica)
    pushed = {
        s: v for s, v in steps.items() if (was_pushed(v) if was_pushed is not None else is_pushed(v, every, push_every))
    }
    if pushed and len(steps) > 1:
        keep = max(pushed, key=pushed.__getitem__)
        others = {s: v for s, v in steps.items() if s != keep}
        return min(others, key=others.__getitem__)
    return min(steps, key=steps.__getitem__)
