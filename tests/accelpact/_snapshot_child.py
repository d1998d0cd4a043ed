"""A process that snapshots a small model every step and is SIGKILLed by test_snapshot_slots mid-copy.

``python _snapshot_child.py ROOT OUT``: trains steps 0 and 1 with snapshots (each finished), saves its
state after step 1 to OUT/step1.pt, prints "ready", waits for a line on stdin, then commits step 2, whose copy pauses halfway
(``pause_mid_copy_s``), prints "copying 2" and waits to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from accelpact.snapshot import SnapshotConfig, Snapshotter


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, snap: Snapshotter | None) -> None:
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(step))
    (model(x) + torch.randn(8, 256)).pow(2).mean().backward()  # the global RNG too: it is part of the snapshot
    if snap is not None:
        snap.before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if snap is not None:
        snap.after_commit(step)


def main(root: str, out: str) -> None:
    model, optimizer = build()
    fast = Snapshotter(
        model,
        optimizer,
        job_token="killed-job",
        rank=0,
        world_size=1,
        config=SnapshotConfig(root=root),
        extra_state=lambda: {"pos": "after"},
    )
    for step in (0, 1):
        train_step(model, optimizer, step, fast)
    fast.flush()
    torch.save(
        {
            "state": {k: v.clone() for k, v in model.state_dict().items()},
            "optim": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
        },
        Path(out) / "step1.pt",
    )
    fast.close()
    slow = Snapshotter(
        model,
        optimizer,
        job_token="killed-job",
        rank=0,
        world_size=1,
        config=SnapshotConfig(root=root, pause_mid_copy_s=120.0),
    )
    print("ready", flush=True)
    sys.stdin.readline()  # the test reads the slots as they are now, then says go
    train_step(model, optimizer, 2, slow)
    print("copying 2", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
