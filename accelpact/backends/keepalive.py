"""Abandoned generations, kept alive for the whole process until their collectives have timed out.

A generation is *abandoned* when this rank gives up waiting on one of its collectives (a peer started a
newer recovery round, or the watchdog fired) while the collective may still be running in the backend.
Destroying such a group blocks: gloo's destructor joins its worker threads, and a worker stuck in the
collective returns only at the PG timeout. Measured here: a 2-rank gloo group with one all-reduce pending,
dropped inside a reference cycle, made the next ``gc.collect()`` take 9.3 s with a 10 s PG timeout.

So the groups (and the pending work) are kept until the deadline, then dropped, when the collective has
failed and the destructor is quick. They used to be kept by the backend object that abandoned them. A
Guard and its backend form a reference cycle, so once a Guard was closed and dropped (a second job in
the same process, a test session running scenario after scenario), the next garbage collection freed
the backend and with it the groups, and that collection, on whatever thread ran it, waited out the
collective: 113-118 s of a 120 s PG timeout in the rebind check of ``test_recovery_fsdp2``, several CI
runs. Kept here, the generation's lifetime no longer depends on who abandoned it.

Standard library only; no lock: recoveries run on the training thread.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Kept", "new_owner", "keep", "forget_expired", "kept_by"]

# Beyond the PG timeout: the backend's own timeout check runs on its own clock and may fire a bit late.
MARGIN_S = 5.0


@dataclass(frozen=True)
class Kept:
    """One abandoned generation: when it may go, its groups, its pending work, and who abandoned it."""

    deadline: float  # time.monotonic() after which the collective has timed out
    groups: list[Any]
    work: Any
    owner: int  # the abandoning backend's new_owner() number (for its own count only)


_kept: list[Kept] = []
_owners = itertools.count(1)


def new_owner() -> int:
    """A number for one backend's entries (never reused, unlike ``id()`` of a freed object)."""
    return next(_owners)


def keep(owner: int, groups: list[Any], work: Any, timeout_s: float) -> Kept:
    """Keep ``groups`` and ``work`` alive until ``timeout_s`` (the PG timeout) plus a margin from now."""
    entry = Kept(time.monotonic() + timeout_s + MARGIN_S, list(groups), work, owner)
    _kept.append(entry)
    return entry


def forget_expired() -> None:
    """Drop every kept generation whose deadline has passed (any owner's): their destructors are quick now."""
    global _kept
    if not _kept:
        return
    now = time.monotonic()
    _kept = [k for k in _kept if k.deadline > now]


def kept_by(owner: int) -> list[Kept]:
    """The generations ``owner`` abandoned that are still kept."""
    return [k for k in _kept if k.owner == owner]
