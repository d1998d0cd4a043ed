"""What it takes to build a process group again under the same identity (:class:`GroupSpec`).

In the bottom layer: the backends build groups from it, and the data plane and recovery read it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch

__all__ = ["GroupSpec"]


@dataclass(frozen=True)
class GroupSpec:
    """What it takes to build a group again under the same identity."""

    name: str
    backend: str
    ranks: tuple[int, ...]  # global ranks, in group-rank order
    is_default: bool
    tag: str | None
    desc: str
    timeout: datetime.timedelta | None
    device_id: torch.device | None = None  # the accelerator the group is bound to (NCCL), else None
