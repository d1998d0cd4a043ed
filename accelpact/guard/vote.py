"""The guard's vote: the one-element all-reduce that closes every guarded step, region and finish.

The vote counts the voters and, folded into the same number, carries each rank's position
(accelpact.common.positions). When the positions differ, every rank finds it in the same vote, so
all of them gather every rank's position and raise StateDivergedError naming each one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from accelpact.common import positions
from accelpact.errors import StateDivergedError

if TYPE_CHECKING:
    from accelpact.backends.interruptible import CollectiveWaiter
    from accelpact.dataplane.plane import DataPlane

_log = logging.getLogger(__name__)

__all__: list[str] = []  # private to accelpact.guard


class CommitVote:
    """One rank's vote on the data plane's vote group (whichever generation is live when it votes).

    ``wait``: how the all-reduce is waited for (None: plainly). ``loop_step``: the loop's own step, as
    last passed to ``guard.step(step=...)``; every vote carries it."""

    def __init__(self, plane: DataPlane, wait: CollectiveWaiter | None, rank: int) -> None:
        self.plane, self.wait, self.rank = plane, wait, rank
        self.buf = plane.backend.vote_buffer()
        self.loop_step = positions.NO_LOOP_STEP
        self._codec: positions.VoteCodec | None = None  # the vote's arithmetic for the vote group's size

    def __call__(self, kind: int, guard_step: int, region: int, committed_step: int) -> None:
        """Vote at this rank's position (``kind``: 0 step, 1 region, 2 finish; positions.KINDS);
        StateDivergedError, naming ``committed_step`` as the last one, when the ranks' positions differ."""
        group, buf = self.plane.vote_group, self.buf
        codec = self._codec
        if codec is None or codec.group is not group:  # a recovery may have replaced the group
            codec = self._codec = positions.VoteCodec(group.size(), group)
        buf.set(codec.encode(kind, guard_step, region, self.loop_step))
        if not codec.agreed(self.plane.backend.vote(buf, group, wait=self.wait)):
            position = positions.Position(positions.KINDS[kind], guard_step, region, self.loop_step)
            raise self._diverged(position, committed_step)

    def _diverged(self, position: positions.Position, committed_step: int) -> StateDivergedError:
        """Every rank's position (every rank found the disagreement in the same vote, so all gather)."""
        group = self.plane.vote_group
        mine = torch.tensor(position.values(), dtype=torch.int64, device=self.buf.device)
        seen = {self.rank: position}
        try:
            outs = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
            dist.all_gather(outs, mine, group=group)
            ranks = dist.get_process_group_ranks(group)
            seen = {ranks[i]: positions.Position.from_values(t.tolist()) for i, t in enumerate(outs)}
        except Exception as exc:  # noqa: BLE001 - the error is raised anyway, naming this rank's position only
            _log.warning("rank %d: could not gather the other ranks' positions: %s", self.rank, exc)
        return StateDivergedError(
            positions.describe(seen), ranks=tuple(sorted(seen)), last_committed_step=committed_step
        )
