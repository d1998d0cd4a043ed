"""The row's torchft columns, from the event log (pure: no torch, no torchft).

Quorum and heal times, discarded attempts, and the steps some replica group sat out: those steps averaged
fewer gradients than the fault-free reference's, so the run is not bit-identical to it by design, and
``bit_identity_note`` says so with the steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.events import Event, Heal, Recovery, Step, of_type, typed

TORCHFT_VERSION = "0.2.0"


def torchft_columns(events: Sequence[Mapping[str, Any] | Event]) -> dict[str, Any]:
    """torchft's figures for the row (pure): quorum and heal times, discarded attempts, and the steps some
    replica group sat out, which make the run differ from the reference by design. ``events``: the run's
    records or typed events; torchft's own fields ride in each event's ``extra``."""
    log = typed(events)
    steps = [e.to_record() for e in of_type(log, Step) if "torchft_participants" in e.extra]
    short = sorted({int(e["step"]) for e in steps if int(e["torchft_participants"]) < int(e.get("torchft_groups", 0))})
    quorum = [float(e["torchft_quorum_s"]) for e in steps if e.get("torchft_quorum_s") is not None]
    retries = [
        r
        for r in (e.to_record() for e in of_type(log, Recovery))
        if r.get("decision") == "retry" and "torchft_quorum_id" in r
    ]
    heals = [r for r in (e.to_record() for e in of_type(log, Heal)) if r.get("role") in ("replacement", "rejoin")]
    note = None
    if short:
        note = (
            f"no by design: fewer replica groups took part in {len(short)} step(s) ({_ranges(short)}), so "
            "those steps averaged fewer gradients than the reference's"
        )
    return {
        "torchft_version": TORCHFT_VERSION,
        # per rank (every rank of a discarded step writes one): the most any rank discarded
        "torchft_discarded_attempts": max(
            (sum(1 for e in retries if e.get("rank") == r) for r in {e.get("rank") for e in retries}), default=0
        ),
        "torchft_quorum_median_s": sorted(quorum)[len(quorum) // 2] if quorum else None,
        "torchft_quorum_max_s": max(quorum) if quorum else None,
        "torchft_retry_recovery_max_s": max(
            (float(e["detection_s"]) + float(e["agreement_s"]) + float(e["rebuild_s"]) for e in retries), default=None
        ),
        "torchft_heals": len(heals),
        "torchft_heal_max_s": max((float(e["total_s"]) for e in heals), default=None),
        "torchft_short_steps": len(short),
        "bit_identity_note": note,
    }


def _ranges(xs: list[int]) -> str:
    out: list[str] = []
    start = prev = xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)
