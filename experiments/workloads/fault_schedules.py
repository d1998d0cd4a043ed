"""The bit-identity experiment's fault schedules and how one fault's row is read from the ranks' records.

Shared by the 10-fault runs (:mod:`experiments.bit_identity`), the soak
(:mod:`experiments.bit_identity_soak`) and the memory probe (:mod:`experiments.workloads.memory_probe`), so that a
soak's fault means exactly what the same fault
means in the short run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PG_TIMEOUT_S", "RESOURCES", "ten_faults", "soak_faults", "hang_every", "armed", "fault_rows"]

PG_TIMEOUT_S = 15.0  # the hang is detected at the collective timeout; generous enough for a loaded host
RESOURCES = ("threads", "fds", "tcp", "rss_mib")


def ten_faults(world: int) -> list[dict]:
    """The mixed schedule, labelled for the table: one fault every other step (1, 3, ..., 19).

    A fault's recovery is recorded at its own step, or at the next one where the broken connection
    surfaces only then (a reset after the vote completed): faults two steps apart keep every
    recovery attributable to exactly one fault.
    """
    last = world - 1
    allr = list(range(world))
    faults = [
        {"step": 1, "phase": "forward_allgather_first", "ranks": [1], "kind": "reset, one rank"},
        {"step": 2, "phase": "forward_allgather_middle", "ranks": allr, "kind": "reset, all ranks"},
        {"step": 3, "phase": "backward_reduce_scatter", "ranks": [last], "kind": "reset, one rank"},
        {"step": 4, "phase": "clip_allreduce", "ranks": allr, "kind": "reset, all ranks"},
        {"step": 5, "phase": "vote", "ranks": [0], "kind": "reset, one rank"},
        {
            "step": 6,
            "phase": "post_vote",
            "action": "reset_raise",
            "ranks": [1],
            "kind": "vote completed on some ranks only (roll forward)",
        },
        {
            "step": 7,
            "phase": "forward_allgather_middle",
            "action": "stall",
            "stall_s": PG_TIMEOUT_S + 3,
            "ranks": [last],
            "kind": f"hang past the {PG_TIMEOUT_S:.0f} s collective timeout",
        },
        {
            "step": 8,
            "phase": "forward_allgather_first",
            "ranks": [0],
            "kind": "nested: reset, then reset during recovery",
            "nested": {"phase": "recovery", "ranks": [1 % world]},
        },
        {"step": 9, "phase": "vote", "ranks": allr, "kind": "reset, all ranks"},
        {"step": 10, "phase": "backward_reduce_scatter", "ranks": allr, "kind": "reset, all ranks"},
    ]
    return [{**f, "step": 2 * i + 1} for i, f in enumerate(faults)]


def hang_every(n: int) -> int:
    """Every how many faults the soak hangs a rank: every 25th up to 250 faults, then ten hangs in all.

    Each hang costs the full collective timeout (15 s) plus its stall; 40 of them would add ~12 min
    to a 1000-fault soak on 2 cores without exercising anything ten do not.
    """
    return max(25, n // 10)


def soak_faults(world: int, n: int) -> list[dict]:
    """n faults, one every other step, cycling through the kinds of :func:`ten_faults` (partial,
    all-rank, nested, roll-forward), with a hang every :func:`hang_every` faults."""
    cycle = [f for f in ten_faults(world) if f.get("action") != "stall"]
    hang = next(f for f in ten_faults(world) if f.get("action") == "stall")
    every = hang_every(n)
    out = []
    for i in range(n):
        f = dict(hang) if i % every == every - 1 else dict(cycle[i % len(cycle)])
        f["step"] = 2 * i + 1  # every other step, as in ten_faults: each recovery belongs to one fault
        out.append(f)
    return out


def armed(faults: list[dict]) -> list[dict]:
    """FaultInjector specs (the nested fault's second injection is its own spec)."""
    specs = []
    for f in faults:
        specs.append({k: f[k] for k in ("step", "phase", "ranks", "action", "stall_s") if k in f})
        if "nested" in f:
            specs.append({"step": f["step"], **f["nested"]})
    return specs


def fault_rows(flavour: str, world: int, faults: Sequence[dict], per_rank: Sequence[dict[str, Any]]) -> list[dict]:
    """One row per fault from every rank's ``events``, ``resources`` and (when known) ``fired``.

    Matched by step, never by position: a fault that produced no recovery must show up as such,
    not shift every later row. Its recovery is at its step or the next (see :func:`ten_faults`).
    """
    events = [{e["step"]: e for e in reversed(r["events"])} for r in per_rank]  # first event of a step wins
    res_at = [{x["step"]: x for x in r["resources"]} for r in per_rank]
    rows = []
    for i, f in enumerate(faults):
        evs: list[Any] = [by_step.get(f["step"], by_step.get(f["step"] + 1)) for by_step in events]
        fired = sum(1 for r in per_rank for x in r.get("fired", []) if x["step"] == f["step"])
        res: list[Any] = [by_step.get(f["step"]) for by_step in res_at]
        ok = all(e is not None for e in evs)
        rows.append(
            {
                "flavour": flavour,
                "world": world,
                "fault": i + 1,
                "step": f["step"],
                "kind": f["kind"],
                "phase": f["phase"],
                "ranks": " ".join(map(str, f["ranks"])),
                "injections_fired": fired if any("fired" in r for r in per_rank) else "",
                "decision": evs[0]["decision"]["action"] if ok else "no recovery event",
                "apply_on": " ".join(map(str, evs[0]["decision"]["apply_on"])) if ok else "",
                "rounds": max(e["rounds"] for e in evs) if ok else 0,
                "detection_ms_max": max(e["detection_s"] for e in evs) * 1e3 if ok else float("nan"),
                "total_ms_max": max(e["total_s"] for e in evs) * 1e3 if ok else float("nan"),
                **{f"{k}_max": max(x[k] for x in res) if all(res) else float("nan") for k in RESOURCES},
            }
        )
    return rows
