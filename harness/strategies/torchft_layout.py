"""What both sides of ``strategy=torchft`` agree on: where a rank sits among the replica groups, the control-store
keys the groups meet on, the Lighthouse's variable, and which groups a fault leaves untouched.

Pure: the parent (``harness.parent.strategies.torchft_parent``), the ranks
(``harness.rank.strategies.torchft_rank``) and validation (``harness.strategies.torchft_check``) all read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"


def gen_key(token: str, group: int) -> str:
    """Control-store key holding replica group ``group``'s current generation (absent: 0)."""
    return f"{token}/torchft/g{group}/gen"


def group_store_key(token: str, group: int, gen: int) -> str:
    """Control-store key where generation ``gen`` of group ``group`` publishes its store's ``host:port``."""
    return f"{token}/torchft/g{group}/gen{gen}/store"


def ports_key(token: str) -> str:
    """Control-store key every rank appends its service ports to (``port,``): a socket reset spares them."""
    return f"{token}/torchft/ports"


@dataclass(frozen=True)
class GroupLayout:
    """Where a global rank sits: replica group ``group``, rank ``local`` of ``size`` inside it."""

    rank: int
    world_size: int
    size: int

    @property
    def group(self) -> int:
        return self.rank // self.size

    @property
    def local(self) -> int:
        return self.rank % self.size

    @property
    def groups(self) -> int:
        return self.world_size // self.size

    def members(self) -> list[int]:
        return list(range(self.group * self.size, (self.group + 1) * self.size))


def ranks_lost(fault_ranks: Iterable[int], world_size: int, hosts: int, whole_host: bool) -> set[int]:
    """The ranks a fault on ``fault_ranks`` kills: each of them, or with ``whole_host`` (a host loss) every
    rank of its host (``hosts`` namespaces of ``world_size / hosts`` consecutive ranks; 0: a host per rank,
    as ``harness.faults.addressing.Layout`` places them)."""
    per_host = world_size // hosts if hosts else 1
    lost: set[int] = set()
    for r in fault_ranks:
        first = (r // per_host) * per_host if whole_host else r
        lost.update(range(first, first + (per_host if whole_host else 1)))
    return lost


def groups_untouched(lost: Iterable[int], world_size: int, group_size: int) -> list[int]:
    """The replica groups with no rank in ``lost``: the peers a restarted group can heal from."""
    hit = {r // group_size for r in lost}
    return [g for g in range(world_size // group_size) if g not in hit]
