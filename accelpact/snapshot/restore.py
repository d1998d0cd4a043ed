"""The library restore call: every rank loads the newest snapshot that ALL ranks hold.

For a job restarted by its launcher (torchrun ``--max-restarts``, a relaunch, a replacement): each
rank lists its own valid slots (CRC-checked), the ranks exchange what they hold, a rank that lacks the
newest step no rank is behind of fetches its buddy's replica of it (``fetch``), and the ranks agree on
the newest step held everywhere. Two slots per rank and a commit
protocol that lets ranks differ by at most one committed step make such a step exist whenever every
rank holds anything. If some ranks hold snapshots and others none, restoring would mix a resumed rank
with a fresh one: ``SnapshotsDisagreeError`` naming them (fall back to a disk checkpoint).

If no rank holds anything, a group restart must not quietly train again from step 0:

- when no rank even has a directory for the token (nothing was ever written under it: the token changed
  between attempts, e.g. the control channel's per-attempt token), ``NoSnapshotToResumeError`` names the
  token, the root and the fix;
- when some rank has one (the job failed before its first snapshot completed), every rank starts from
  step 0 (None), and says so on stderr.

``required=True`` raises ``NoSnapshotToResumeError`` whenever no rank holds a snapshot; ``False`` never
(None, then). The default, None: the rule above on a group restart (``TORCHELASTIC_RESTART_COUNT`` > 0),
None elsewhere.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.snapshot import layout as paths
from accelpact.snapshot.launch import restart_count
from accelpact.snapshot.load import check_slot, load_slot, own_slots
from accelpact.snapshot.slots import Marker, NoSnapshotToResumeError, SnapshotsDisagreeError, invalidate
from accelpact.snapshot.snapshotter import SnapshotConfig

__all__ = ["SnapshotInfo", "restore_latest", "Fetch"]

# fetch(src_rank, dest_dir, step=None) -> marker dict or None: copy the buddy's replica of src_rank
# (its newest, or of ``step``) into dest_dir, marker last.
Fetch = Callable[..., "dict[str, Any] | None"]


@dataclass
class SnapshotInfo:
    """What :func:`restore_latest` loaded: the step (resume with step + 1), from where, and how long it took."""

    step: int
    source: str  # "own" or "buddy"
    slot: Path
    extra_state: Any
    nbytes: int
    load_s: float
    marker: Marker
    held: dict[int, list[int]] | None = None  # each rank's valid snapshot steps when the ranks agreed


def _own(root: Path, job_token: str, rank: int, world_size: int) -> list[tuple[Path, Marker, str]]:
    return [(d, m, "own") for d, m in own_slots(root, job_token, rank, world_size, verify=True)]


def _fetched(
    root: Path, job_token: str, rank: int, world_size: int, fetch: Fetch, step: int | None
) -> list[tuple[Path, Marker, str]]:
    """The buddy's replica of this rank (of ``step``, or its newest), copied next to the own slots."""
    dest = paths.job_dir(root, job_token) / "fetched" / f"rank{rank}"
    invalidate(dest)
    if not fetch(rank, dest, step=step):
        return []
    marker, why = check_slot(dest, job_token=job_token, rank=rank, world_size=world_size, step=step, verify=True)
    return [(dest, marker, "buddy")] if why is None and marker is not None else []


def _gather(held: Any, world_size: int) -> list[Any]:
    if world_size == 1 or not dist.is_initialized():
        return [held]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, held)
    return out


def _nothing_held(root: Path, job_token: str, rank: int, world_size: int, required: bool | None) -> None:
    """No rank holds a snapshot: raise NoSnapshotToResumeError where the module's rule says so, else say that
    every rank starts from step 0 (collective, like the rest of restore_latest)."""
    ever = _gather(paths.job_dir(root, job_token).exists(), world_size)
    restarted = restart_count()
    if required is False or (required is None and (restarted == 0 or any(ever))):
        if restarted:
            print(
                f"accelpact.snapshot: rank {rank}: group restart {restarted}, but no rank holds a complete snapshot "
                f"of {job_token!r} yet (the job failed before its first one completed): starting from step 0",
                file=sys.stderr,
                flush=True,
            )
        return
    why = (
        (
            "no rank has ever written a snapshot under this token: the token changed between attempts (a "
            "Snapshotter named after the control channel's per-attempt token, control.job_token?)"
        )
        if not any(ever)
        else "every rank's snapshots of this token are gone or invalid"
    )
    raise NoSnapshotToResumeError(
        f"rank {rank}: restart {restarted} was to resume from the newest snapshot every rank holds, but no rank "
        f"holds one of job token {job_token!r} under {root}: {why}. Name the snapshots with "
        "accelpact.snapshot.job_token_from_env() (the same in every attempt); pass required=False to "
        "restore_latest to start from step 0 instead",
        job_token=job_token,
        root=str(root),
    )


def restore_latest(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    job_token: str,
    rank: int,
    config: SnapshotConfig | None = None,
    fetch: Fetch | None = None,
    world_size: int | None = None,
    required: bool | None = None,
) -> SnapshotInfo | None:
    """Load the newest snapshot step every rank holds into ``model``/``optimizer`` in place (see module doc).

    Call it on every rank after building model, FSDP wrapping and optimizer (collective: it agrees over
    the default process group when one is initialised; pass ``fetch`` on every rank or on none). Returns None when no rank holds a snapshot
    (start from step 0); then this rank's stale slots are dropped. Resume the loop at ``info.step + 1``
    after re-running whatever the loop does after ``guard.step`` for ``info.step``.
    """
    config = config or SnapshotConfig()
    root = Path(config.root)
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_initialized() else 1
    t0 = time.perf_counter()
    cands = _own(root, job_token, rank, world_size)
    if not cands and fetch is not None:  # this rank's own slots are gone (host lost): the buddy's newest
        cands = _fetched(root, job_token, rank, world_size, fetch, None)
    everyone = _gather(sorted({m.step for _, m, _ in cands}), world_size)
    if fetch is not None and any(everyone):
        # The newest step no rank is behind of; a rank whose own slots lack it (lost, corrupt) asks
        # its buddy for that step's replica, then everyone reports again.
        want = min(max(steps) for steps in everyone if steps)
        if want not in {m.step for _, m, _ in cands}:
            cands += _fetched(root, job_token, rank, world_size, fetch, want)
        everyone = _gather(sorted({m.step for _, m, _ in cands}), world_size)
    if not any(everyone):
        for d, _, _ in cands:
            invalidate(d)
        _nothing_held(root, job_token, rank, world_size, required)
        return None
    empty = [r for r, steps in enumerate(everyone) if not steps]
    common = set(everyone[0]).intersection(*map(set, everyone[1:]))
    if empty and fetch is not None and hasattr(fetch, "lost_error"):
        raise fetch.lost_error(empty, everyone)  # buddy replication: name each lost rank's buddy too
    if empty or not common:
        raise SnapshotsDisagreeError(
            f"the ranks would resume at different steps: no snapshot step is held by every rank (held: "
            f"{ {r: s for r, s in enumerate(everyone)} }); rank(s) {empty or 'all'} cannot resume with the "
            "others in memory: restore from a disk checkpoint",
            held=dict(enumerate(everyone)),
        )
    step = max(common)
    slot, marker, source = next((d, m, s) for d, m, s in cands if m.step == step)
    marker, extra = load_slot(model, optimizer, slot, job_token=job_token, rank=rank, world_size=world_size, step=step)
    for d, m in own_slots(root, job_token, rank, world_size, verify=False):
        if m.step > step:  # that future is re-run: the next snapshot must not overwrite the restored one
            invalidate(d)
    return SnapshotInfo(
        step=step,
        source=source,
        slot=slot,
        extra_state=extra,
        nbytes=marker.nbytes,
        load_s=time.perf_counter() - t0,
        marker=marker,
        held=dict(enumerate(everyone)),
    )
