"""The soak's fds by kind: what a settled difference from the pre-fault baseline is made of.

The soak's ranks record their fds by kind (``experiments.workloads.memory_probe.fd_kinds``: store connections,
data-plane peers, listeners, files, pipes, anon inodes) before the first fault, after the first
recovery and once settled; these helpers compare them, so that the table names a constant instead
of leaving it to be guessed.
"""

from __future__ import annotations

__all__ = ["only_store_connection", "fd_kind_lines", "kinds_from_progress", "constant_after_first_recovery"]


def _kind_diff(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int] | None:
    """b - a per fd kind, zero entries left out (files named after the rank are one kind)."""
    if a is None or b is None:
        return None
    return {k: b.get(k, 0) - a.get(k, 0) for k in sorted(set(a) | set(b)) if b.get(k, 0) != a.get(k, 0)}


def kinds_from_progress(lines: list[dict]) -> dict[str, dict | None]:
    """One rank's fds by kind from its progress lines: before the first fault, after the first recovery,
    settled (the lines that carry ``fd_kinds``; older runs have none, then every entry is None)."""
    steps = [x for x in lines if "step" in x]
    return {
        "baseline": next((x["fd_kinds"] for x in steps if "fd_kinds" in x and x["recoveries"] == 0), None),
        "first_recovery": next((x["fd_kinds"] for x in steps if "fd_kinds" in x and x["recoveries"]), None),
        "settled": next((x["fd_kinds"] for x in lines if "settled" in x and "fd_kinds" in x), None),
    }


def constant_after_first_recovery(run: dict) -> bool:
    """True when, on every rank, the fds settled are exactly those after the first recovery: whatever
    differs from the baseline was there from the first recovery on (a constant), none of it grew."""
    kinds = run.get("fd_kinds") or []
    return bool(kinds) and all(
        k.get("first_recovery") is not None and k.get("first_recovery") == k.get("settled") for k in kinds
    )


def only_store_connection(soak: dict, settled_change: int) -> bool:
    """True when, on every rank, the settled fds differ from the baseline by exactly one store
    connection: the one the live generation's process group was built on. Generation 0 shares the
    launcher's store client (still open: the session's rank keeps it for barriers); every later
    generation has its own (accelpact/control/data_plane_store.py), which lives as long as its group. A
    constant, not growth; anything else is reported as it is."""
    diffs = [_kind_diff(k.get("baseline"), k.get("settled")) for k in soak.get("fd_kinds") or []]
    return settled_change == 1 and bool(diffs) and all(d == {"tcp store": 1} for d in diffs)


def fd_kind_lines(soak: dict) -> list[str]:
    """One line per rank: which fds changed from before the first fault to the first recovery and to settled."""
    out = []
    for rank, k in enumerate(soak.get("fd_kinds") or []):
        if not k.get("baseline"):
            continue
        first, settled = _kind_diff(k["baseline"], k.get("first_recovery")), _kind_diff(k["baseline"], k.get("settled"))
        out.append(
            f"fds by kind, rank {rank}: after the first recovery {_fmt_kinds(first)}; settled "
            f"{_fmt_kinds(settled)} (before the first fault: {_fmt_kinds(k['baseline'], sign=False)})."
        )
    return ["", *out] if out else []


def _fmt_kinds(d: dict[str, int] | None, sign: bool = True) -> str:
    if d is None:
        return "not recorded"
    if not d:
        return "unchanged"
    # a file by its name only: the soak's directory is in the provenance
    short = {(k.rsplit("/", 1)[-1] if k.startswith("file ") else k): v for k, v in d.items()}
    return ", ".join(f"{k} {v:+d}" if sign else f"{k} {v}" for k, v in short.items())
