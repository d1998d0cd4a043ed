"""Bit-identity of a run against a fault-free reference: every loss, parameter shard and optimizer tensor.

A rank saves ``{"losses": [tensor, ...], "state": {name: tensor}}`` per scenario (see
:meth:`accelpact.testing.session.Session.tensors`); :func:`bit_differences` compares one scenario's
files with a reference scenario's on every rank, by ``torch.equal`` AND by sha256 of the raw bytes
(``torch.equal`` treats NaN != NaN and -0.0 == 0.0; the digest catches what equality forgives).
Tests, experiments and benchmarks all compare through this one function.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from accelpact.testing.session import Session

__all__ = ["sha256", "bit_differences", "differences"]


def sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (contiguous, flattened, as uint8)."""
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _compare_saved(
    rank: int, ref: dict[str, Any], got: dict[str, Any], diffs: list[str], counts: dict[str, int]
) -> None:
    if len(ref["losses"]) != len(got["losses"]):
        diffs.append(f"rank {rank}: {len(got['losses'])} losses, reference has {len(ref['losses'])}")
    for i, (a, b) in enumerate(zip(ref["losses"], got["losses"])):
        counts["losses"] += 1
        if not torch.equal(a, b):
            diffs.append(f"rank {rank}: loss of step {i} {b.item()!r} != reference {a.item()!r}")
    if set(ref["state"]) != set(got["state"]):
        diffs.append(f"rank {rank}: state keys differ: {sorted(set(ref['state']) ^ set(got['state']))[:5]}")
    for key in sorted(set(ref["state"]) & set(got["state"])):
        a, b = ref["state"][key], got["state"][key]
        counts["tensors"] += 1
        counts["bytes"] += a.numel() * a.element_size()
        if not torch.equal(a, b) or sha256(a) != sha256(b):
            diffs.append(
                f"rank {rank}: {key} differs (max abs diff {(a.double() - b.double()).abs().max().item():.3e})"
            )


def _failure(session: Session, name: str, rank: int) -> str | None:
    """Why rank ``rank`` has nothing to compare for scenario ``name`` (None when it finished cleanly)."""
    res = session.result(name, rank)
    if res is None:
        return (
            f"rank {rank}: scenario {name!r} did not run (exit {session.returncodes[rank]}); "
            f"log tail:\n{session.logs[rank]}"
        )
    if res.get("error") is not None:
        err = res["error"]
        return f"rank {rank}, scenario {name!r}: {err['type']}: {err['message']}\n{err.get('traceback', '')}"
    return None


def bit_differences(session: Session, name: str, reference: str = "ref") -> tuple[list[str], dict[str, int]]:
    """Every mismatch between scenario ``name`` and ``reference`` on every rank ([] when bit-identical),
    and counts of what was compared (tensors, bytes, losses).

    A rank on which ``name`` or ``reference`` did not run or raised is reported as a difference (with
    its log tail or its error and traceback), never skipped: a run that failed is identical to nothing.
    """
    diffs: list[str] = []
    counts = {"tensors": 0, "bytes": 0, "losses": 0}
    for rank in range(session.world_size):
        problems = [p for p in (_failure(session, s, rank) for s in (reference, name)) if p]
        if problems:
            diffs.extend(problems)
            continue
        _compare_saved(rank, session.tensors(reference, rank), session.tensors(name, rank), diffs, counts)
    return diffs, counts


def differences(session: Session, name: str, reference: str = "ref") -> list[str]:
    """The mismatches of :func:`bit_differences` alone ([] when bit-identical)."""
    return bit_differences(session, name, reference)[0]
