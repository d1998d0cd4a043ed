"""Where a recovery's memory goes, before and after the fixes, side by side in one run.

Two sessions of 2 ranks, each recovering ``--faults`` faults of the soak's mix (no hangs) in one
process: "before" with the C-heap trim off (``ACCELPACT_MALLOC_TRIM=0``) and every RecoveryEvent
kept, "after" as shipped (:mod:`accelpact.dataplane.heap` trims after each recovery; ``guard.events`` keeps the
newest 32 here, 256 by default, so that its bound is reached within the run). Every 5 recoveries each rank samples RSS and glibc's heap (in use vs free but kept);
after a warm-up of 20 recoveries each is fitted as a slope per recovery with a 95% HAC interval
(the soak's fit). Also the trim's cost, as the retirement time of each recovery.

    python -m experiments.recovery_memory --faults 200

Writes ``results/bit_identity/recovery_memory.md`` and ``.json`` with the command, git sha and machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelpact.testing.session import run_session
from experiments.bit_identity_soak import fit_slope
from experiments.workloads.memory_probe import RUNNER

__all__ = ["VARIANTS", "run", "main"]

WARMUP = 20
MODEL = {"layers": 2, "hidden": 64, "inter": 192}
# name -> (scenario keys, environment of the ranks)
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "before": ({"unbounded_events": True}, {"ACCELPACT_MALLOC_TRIM": "0"}),
    # The shipped default keeps 256 events; 32 here, so that the bound is reached within the run.
    "after": ({"keep_events": 32}, {}),
    # An operator's option, not a default: a fixed mmap threshold stops glibc from raising it after
    # each freed large block, so large transient blocks are mmapped and unmapped instead of fragmenting
    # the heap; it costs a page-fault round per large allocation (see the clean step's time).
    "after + MALLOC_MMAP_THRESHOLD_=131072": ({"keep_events": 32}, {"MALLOC_MMAP_THRESHOLD_": "131072"}),
}
SERIES = {
    "rss_mib": "RSS",
    "heap_in_use_mib": "C heap in use",
    "heap_free_mib": "C heap free but kept",
    "py_blocks": "Python objects' memory blocks (count, not MiB)",
}


def run(out: Path, faults: int) -> dict[str, Any]:
    """Both variants, one after the other; per variant and rank the fitted slopes and the trim cost."""
    found: dict[str, Any] = {}
    for name, (keys, env) in VARIANTS.items():
        sc = {"name": name, "faults": faults, "every": 5, "model": MODEL, **keys}
        s = run_session(
            out / name,
            RUNNER,
            [sc],
            world_size=2,
            pg_timeout_s=15.0,
            control_deadline_s=120.0,
            timeout_s=600 + 10 * faults,
            barrier=True,
            check=True,
            env_extra=env,
        )
        ranks = []
        for r in s.job(name):
            pts = [x for x in r["samples"] if x["recoveries"] >= WARMUP]
            xs = [x["recoveries"] for x in pts]
            ranks.append(
                {
                    "recoveries": r["recoveries"],
                    "wall_s": s.wall_s,
                    "slopes": {k: fit_slope(xs, [x[k] for x in pts]) for k in SERIES},
                    "first": r["samples"][0],
                    "last": r["samples"][-1],
                    "retire_ms_median": statistics.median(r["retire_ms"]) if r["retire_ms"] else float("nan"),
                    "clean_step_ms_median": r.get("clean_step_ms_median"),
                }
            )
        found[name] = ranks
    return found


def table(found: dict[str, Any], faults: int) -> list[str]:
    names = list(found)
    lines = [
        f"| series (per recovery, after {WARMUP}) | rank | " + " | ".join(names) + " | after / before |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for key, label in SERIES.items():
        for rank in range(2):
            fits = [found[n][rank]["slopes"][key] for n in names]
            b, a = found["before"][rank]["slopes"][key][0], found["after"][rank]["slopes"][key][0]
            ratio = f"{a / b:.2f}" if b > 0 else "n/a (before <= 0)"
            lines.append(
                f"| {label} | {rank} | "
                + " | ".join(f"{f[0]:+.4f} [{f[1]:+.4f}, {f[2]:+.4f}]" for f in fits)
                + f" | {ratio} |"
            )
    per = [(n, found[n]) for n in names]
    lines += [
        "",
        "Retirement of the old generation per recovery (median ms, rank 0 / 1; the trim is part of it after "
        "the fix): "
        + "; ".join(f"{n} {' / '.join(format(r['retire_ms_median'], '.1f') for r in rs)}" for n, rs in per)
        + ".",
        "A step without a fault (median ms, rank 0 / 1): "
        + "; ".join(
            f"{n} {' / '.join(format(r['clean_step_ms_median'] or float('nan'), '.0f') for r in rs)}" for n, rs in per
        )
        + ".",
        "RecoveryEvents kept at the end: "
        + "; ".join(f"{n} {' / '.join(str(r['last']['events_kept']) for r in rs)}" for n, rs in per)
        + ".",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.provenance import REPO_ROOT, collect, current_command, provenance_markdown

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--dir", type=Path, default=REPO_ROOT / "outputs" / "recovery_memory")
    ap.add_argument("--results", type=Path, default=REPO_ROOT / "results" / "bit_identity")
    args = ap.parse_args(argv)
    prov = collect(current_command(argv, "experiments.recovery_memory"))
    found = run(args.dir, args.faults)
    lines = [
        f"# Memory per recovery, before and after the fixes ({args.faults} faults of the soak's mix, no hangs, "
        "2 ranks, tiny decoder)",
        "",
        "before: no C-heap trim, every RecoveryEvent kept; after: `malloc_trim(0)` after each recovery "
        "(accelpact/dataplane/heap.py), the newest 32 events kept (256 by default; 32 reaches the bound within the run); "
        "after + MALLOC_MMAP_THRESHOLD_: the same with glibc's mmap threshold fixed at 128 KiB in the ranks' "
        "environment (an operator's option, not set by accelpact). Slopes: least squares per recovery after a "
        f"warm-up of {WARMUP}, 95% Newey-West interval. Sessions run one after the other, on a shared host.",
        "",
        *table(found, args.faults),
        "",
        provenance_markdown(prov),
    ]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "recovery_memory.md").write_text("\n".join(lines) + "\n")
    (args.results / "recovery_memory.json").write_text(
        json.dumps({"provenance": prov.to_dict(), "found": found}, indent=1, default=str)
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
