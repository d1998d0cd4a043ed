"""How many bytes one snapshot takes, and the start-time check that the root has room for the plan.

The memory plan per rank is 4 slots of one snapshot each: 2 own (the double buffer) + 2 replicas this
rank's host keeps for a buddy. Before the first optimizer step an optimizer holds no state yet, so its
size is estimated from the optimizer's class (AdamW: two moments per parameter); after that it is
exact.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn

from accelpact.snapshot.slots import SnapshotError
from accelpact.snapshot.state import ALIGN, layout

__all__ = ["COPIES", "snapshot_nbytes", "check_room", "used_bytes", "gib"]

COPIES = 4  # 2 own slots + 2 buddy replicas
_META_ALLOWANCE = 1 << 20  # meta.pt + marker: RNG state, param groups, extra_state; well under 1 MiB


def _moments(optimizer: torch.optim.Optimizer) -> int:
    """Per-parameter state tensors of the size of the parameter, for optimizers with no state yet."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 3 if group.get("amsgrad") else 2
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if group.get("momentum", 0) else 0
    if isinstance(optimizer, torch.optim.RMSprop):
        return 1 + bool(group.get("centered")) + bool(group.get("momentum", 0))
    return 2  # unknown optimizer: assume Adam-like until it has state


def snapshot_nbytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of one slot (one snapshot of this rank's shard), exact once the optimizer has stepped."""
    entries, total = layout(model, optimizer)
    if not optimizer.state:
        params = sum(-(-e.nbytes // ALIGN) * ALIGN for e in entries if e.key.startswith("param/"))
        total += _moments(optimizer) * params + ALIGN * len(entries)  # + the step counters
    return total + _META_ALLOWANCE


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def used_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (what the job already holds there: it is overwritten, not added)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def check_room(root: Path, job_dir: Path, per_slot: int, ranks_sharing_root: int = 1, copies: int = COPIES) -> None:
    """SnapshotError with the sizes and the fix when ``root``'s filesystem cannot hold the plan."""
    root.mkdir(parents=True, exist_ok=True)
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize + used_bytes(job_dir)
    need = copies * per_slot * ranks_sharing_root
    if need > free:
        who = f" x {ranks_sharing_root} ranks on this host" if ranks_sharing_root > 1 else ""
        raise SnapshotError(
            f"snapshots need {gib(need)} in {root} ({copies} x {gib(per_slot)} per rank: 2 own slots + 2 buddy "
            f"replicas{who}), {gib(free)} free: DOES NOT FIT. Use a larger shared-memory filesystem (docker run "
            f"--shm-size=..., or `mount -o remount,size=... /dev/shm`), another root (ACCELPACT_SNAPSHOT_ROOT), "
            "more ranks (smaller shards), or turn snapshots off"
        )
