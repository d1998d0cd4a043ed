"""Reading slots back: which valid ones a rank holds, and loading one into a live model and optimizer.

Nothing is written into the model before the slot passed every check: marker fields (format, job
token, rank, world size, step), file sizes and CRC-32s, and the index against this model's
parameters and local shapes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from accelpact.snapshot import layout as paths
from accelpact.snapshot.slots import Marker, SnapshotError, read_marker, validate, verify_files
from accelpact.snapshot.state import Entry, Meta, apply_meta, check_groups, restore_tensors
from accelpact.snapshot.writer import META, PAYLOAD

__all__ = ["own_slots", "check_slot", "load_slot"]


def check_slot(
    slot: Path,
    *,
    job_token: str,
    rank: int,
    world_size: int | None = None,
    step: int | None = None,
    verify: bool = True,
) -> tuple[Marker | None, str | None]:
    """(marker, None) when ``slot`` may be loaded as described, else (marker or None, the reason)."""
    marker = read_marker(slot)
    why = validate(marker, job_token=job_token, rank=rank, world_size=world_size, step=step)
    if why is None:  # validate passed: there is a marker
        why = verify_files(slot, cast("Marker", marker), checksums=verify)
    return marker, why


def own_slots(
    root: str | Path,
    job_token: str,
    rank: int,
    world_size: int | None,
    *,
    verify: bool,
    slots: Sequence[int] = paths.SLOTS,
) -> list[tuple[Path, Marker]]:
    """This rank's valid own slots as (directory, marker), newest step first."""
    out = []
    for s in slots:
        d = paths.slot_dir(root, job_token, rank, s)
        marker, why = check_slot(d, job_token=job_token, rank=rank, world_size=world_size, verify=verify)
        if why is None and marker is not None:
            out.append((d, marker))
    return sorted(out, key=lambda dm: -dm[1].step)


def load_slot(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    slot: Path,
    *,
    job_token: str,
    rank: int,
    world_size: int | None,
    step: int | None,
) -> tuple[Marker, Any]:
    """Verify ``slot`` completely, then load it in place; (its marker, its extra_state)."""
    marker, why = check_slot(slot, job_token=job_token, rank=rank, world_size=world_size, step=step, verify=True)
    if why is not None:
        raise SnapshotError(f"rank {rank}: refusing snapshot {slot}{f' (step {marker.step})' if marker else ''}: {why}")
    try:
        meta = Meta.from_obj(torch.load(io.BytesIO((slot / META).read_bytes()), weights_only=True))
    except Exception as exc:  # noqa: BLE001 - an unreadable meta is a refused slot, with the reason
        raise SnapshotError(
            f"rank {rank}: {slot / META} does not load ({type(exc).__name__}: {exc}); the "
            "extra_state must hold only tensors, numbers, strings and containers"
        ) from exc
    marker = cast("Marker", marker)  # no reason: check_slot found a marker
    if meta.step != marker.step:
        raise SnapshotError(f"rank {rank}: {slot} says step {marker.step}, its meta step {meta.step}")
    nbytes = marker.files[PAYLOAD]["nbytes"]
    check_groups(model, optimizer, meta)
    payload = torch.from_file(str(slot / PAYLOAD), shared=False, size=max(nbytes, 1), dtype=torch.uint8)[:nbytes]
    restore_tensors(model, optimizer, [Entry.from_dict(e) for e in meta.index], payload)
    apply_meta(model, optimizer, meta)
    return marker, meta.extra_state
