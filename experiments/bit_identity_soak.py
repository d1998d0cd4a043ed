"""The long soak of the bit-identity experiment: N faults in a row on 2 ranks, kept on disk as it runs.

A soak of 1000 faults runs for about an hour on 2 loaded cores, so three things matter more than in
the 10-fault runs:

* its session timeout scales with the work (steps of the reference and the faulted run, faults,
  hangs, the settle wait), or is set with ``--soak-timeout-s``; only a real hang should reach it;
* its directory is never a temp dir (default ``outputs/bit_identity_soak/<UTC time>/``) and every
  rank appends one JSON line per step (resources, new recovery events) as it goes, so a soak killed
  or failed part-way keeps every fault up to then; ``--soak-report DIR`` rebuilds the rows from it;
* growth is judged after a warm-up (allocator arenas, lazily built caches fill in the first ~50
  faults) as a fitted slope per fault with a 95% confidence interval, and the "back to baseline"
  figure is taken after abandoned generations have passed their collective timeout.
"""

# Here: the growth verdicts, the soak's section of table.md and the CLI; running a soak and reading it
# back from its directory: experiments.bit_identity_soak_run.

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.bit_identity_fds import fd_kind_lines, only_store_connection
from experiments.bit_identity_soak_run import SETTLE_S, run_reference, run_soak
from experiments.workloads.fault_schedules import PG_TIMEOUT_S, RESOURCES

__all__ = [
    "WARMUP_FAULTS",
    "RSS_TARGET_MIB_PER_FAULT",
    "fit_slope",
    "growth",
    "soak_lines",
    "soak_provenance",
]

WARMUP_FAULTS = 50
RSS_TARGET_MIB_PER_FAULT = 0.05


def _t95(dof: int) -> float:
    """Student's t 97.5% quantile (Cornish-Fisher expansion; < 0.1% off for dof >= 5): no scipy here."""
    z = 1.959964
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3


def fit_slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares slope of y on x with a 95% interval from Newey-West (HAC) standard errors.

    Why HAC: successive samples of RSS or fds are strongly autocorrelated (a step's RSS is the
    previous one's plus a little), so the textbook OLS interval would be far too narrow.
    Returns (slope, low, high); NaNs with fewer than 3 distinct x.
    """
    import numpy as np

    xa, ya = np.asarray(x, float), np.asarray(y, float)
    if len(xa) < 3 or len(set(xa.tolist())) < 3:
        return float("nan"), float("nan"), float("nan")
    xc = xa - xa.mean()
    slope = float((xc * (ya - ya.mean())).sum() / (xc**2).sum())
    resid = ya - ya.mean() - slope * xc
    u = xc * resid
    n = len(xa)
    lags = int(math.floor(4 * (n / 100) ** (2 / 9)))
    s = float((u * u).sum())
    for lag in range(1, lags + 1):
        s += 2 * (1 - lag / (lags + 1)) * float((u[lag:] * u[:-lag]).sum())
    se = math.sqrt(max(s, 0.0)) / float((xc**2).sum())
    half = _t95(n - 2) * se
    return slope, slope - half, slope + half


def growth(soak: dict, warmup: int = WARMUP_FAULTS) -> dict[str, dict[str, float]]:
    """Per resource, the worst rank's slope per fault after ``warmup`` faults, and the settled change."""
    out = {}
    for key in RESOURCES:
        fits = []
        for series in soak["resources"]:
            pts = [(p["recoveries"], p[key]) for p in series if p["recoveries"] >= warmup]
            fits.append(fit_slope([a for a, _ in pts], [b for _, b in pts]))
        worst = max(fits, key=lambda f: f[2] if not math.isnan(f[2]) else -math.inf)
        settled = [s[key] - b[key] for s, b in zip(soak.get("settled") or [], soak["baseline"]) if s and b]
        out[key] = {
            "slope": worst[0],
            "low": worst[1],
            "high": worst[2],
            "settled": max(settled) if settled else float("nan"),
        }
    return out


def soak_lines(soak: dict) -> list[str]:
    """The soak's section of table.md: bit-identity, the fitted growth per resource, the settled change."""
    g = growth(soak)
    unit = {"rss_mib": "MiB", "threads": "threads", "fds": "fds", "tcp": "sockets"}
    ok_bits = not soak["diffs"]
    lc = soak.get("loss_check") or {}
    partial = (
        [
            f"Losses step by step against the fault-free reference, over the {lc['steps']} steps both runs "
            "reached: "
            + (
                "bit-identical on every rank."
                if not lc["n_mismatches"]
                else f"{lc['n_mismatches']} MISMATCHES (rank, step): {lc['mismatches'][:5]}."
            ),
            "",
        ]
        if lc.get("steps") and soak["diffs"]
        else []
    )
    lines = [
        f"## Soak: {len(soak['rows'])} of {soak['faults_planned']} faults, {soak['flavour']}, "
        f"{soak['world']} ranks, {soak['steps']} steps planned, model {soak.get('model')} "
        f"({soak.get('wall_s', float('nan')):.0f} s)",
        "",
        "Bit-identical to the fault-free run: "
        + (
            f"yes, {soak['counts']['tensors']} tensors ({soak['counts']['bytes'] / 2**20:.1f} MiB) by "
            f"torch.equal + sha256 and {soak['counts']['losses']} losses"
            if ok_bits
            else f"NO: {'; '.join(soak['diffs'][:3])}"
        )
        + ".",
        "",
        *partial,
        f"Growth after a warm-up of {WARMUP_FAULTS} faults: least-squares slope per fault of the worst "
        "rank, 95% interval from Newey-West standard errors (successive samples are autocorrelated). "
        f"Settled: change from before the first fault to {SETTLE_S:.0f} s after the last step "
        f"(abandoned generations' collectives time out after {PG_TIMEOUT_S:.0f} s), worst rank.",
        "",
        "| resource | slope per fault | 95% interval | settled change | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for key in RESOURCES:
        r = g[key]
        if key == "rss_mib":
            target = f"slope <= {RSS_TARGET_MIB_PER_FAULT} MiB/fault"
            verdict = "within" if r["slope"] <= RSS_TARGET_MIB_PER_FAULT else "OVER"
            if verdict == "within" and r["high"] > RSS_TARGET_MIB_PER_FAULT:
                verdict = "within (interval reaches past it)"
        else:
            target = "settled change <= 0 (back to baseline)"
            verdict = "within" if r["settled"] <= 0 else ("not measured" if math.isnan(r["settled"]) else "OVER")
            if key == "fds" and verdict == "OVER" and only_store_connection(soak, int(r["settled"])):
                target += "; the live generation's store connection is a constant +1"
                verdict = "within (+1: the live generation's store connection)"
        lines.append(
            f"| {key} | {r['slope']:+.4f} {unit[key]} | [{r['low']:+.4f}, {r['high']:+.4f}] | "
            f"{r['settled']:+.1f} | {target} | {verdict} |"
        )
    later = [(w, growth(soak, w)["rss_mib"]) for w in (200, 500) if w < len(soak["rows"]) - 50]
    if later:  # is it warm-up that has not ended yet, or growth per recovery?
        lines += [
            "",
            "RSS slope after longer warm-ups: "
            + "; ".join(f"{w} faults {r['slope']:+.4f} MiB/fault [{r['low']:+.4f}, {r['high']:+.4f}]" for w, r in later)
            + ".",
        ]
    lines += fd_kind_lines(soak)
    rounds = sum(1 for r in soak["rows"] if r["rounds"] > 1)
    missing = [r["fault"] for r in soak["rows"] if r["decision"] == "no recovery event"]
    decisions: dict[str, int] = {}
    for r in soak["rows"]:
        decisions[r["decision"]] = decisions.get(r["decision"], 0) + 1
    lines += [
        "",
        "Faults by kind: "
        + ", ".join(f"{k} {v}" for k, v in sorted(_count(soak["rows"], "kind").items()))
        + ". Decisions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(decisions.items()))
        + f". Recoveries that needed more than one round: {rounds}."
        + (f" Faults with no recovery event: {missing[:20]}." if missing else ""),
        "Worst-rank change after the last fault, before settling: "
        + ", ".join(f"{k} {soak['leak'][k]:+.1f}" for k in RESOURCES)
        + ". Per-fault rows: soak_faults.csv; per step and rank: soak_resources.csv; soak_leaks.png.",
        "",
    ]
    return lines


def _count(rows: Sequence[dict], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r[key]] = out.get(r[key], 0) + 1
    return out


def soak_provenance(soak: dict) -> dict[str, Any]:
    """What the soak's own run recorded (its command, code, load), for the table's provenance."""
    keys = ("command", "git", "started", "load_avg_start", "load_avg_end")
    return {
        "soak_faults": soak["faults_planned"],
        "soak_model": soak.get("model"),
        "soak_timeout_s": soak["timeout_s"],
        "soak_wall_s": _whole(soak.get("wall_s")),
        "soak_dir": soak["dir"],
        **{f"soak_{k}": soak["meta"][k] for k in keys if k in soak.get("meta", {})},
    }


def _whole(x: float | None) -> int | None:
    return None if x is None or math.isnan(x) else round(x)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m experiments.bit_identity_soak --faults N --dir DIR``: only the soak, kept in DIR;
    ``python -m experiments.bit_identity --soak --soak-from DIR`` then tables it with the short runs."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--hidden",
        type=int,
        default=None,
        help="model width (default the experiment's 256); a narrower model makes each step cheap "
        "so that recoveries, what a soak measures, dominate its time on a loaded host",
    )
    ap.add_argument("--dir", required=True)
    ap.add_argument("--timeout-s", type=float, default=None)
    ap.add_argument(
        "--reference-only",
        action="store_true",
        help="only the fault-free reference, into DIR/ref_run (beside a running soak in DIR)",
    )
    args = ap.parse_args(argv)
    if args.reference_only:
        model = {"hidden": args.hidden, "inter": 3 * args.hidden} if args.hidden else None
        run_reference(Path(args.dir), 2, args.faults, args.layers, model)
        return 0
    import os
    import subprocess

    out = Path(args.dir)
    t = time.time()
    here = Path(__file__).resolve().parents[1]
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "command": "python -m experiments.bit_identity_soak " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git": git + (" (working tree had uncommitted changes)" if dirty else ""),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    model = {"hidden": args.hidden, "inter": 3 * args.hidden} if args.hidden else None
    soak = run_soak(out, 2, args.faults, args.layers, args.timeout_s, model)
    meta["load_avg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    (out / "session.json").write_text(
        json.dumps({**meta, **{k: soak[k] for k in ("wall_s", "timeout_s", "timed_out", "returncodes")}})
    )
    print(
        f"soak of {args.faults} faults: {time.time() - t:.0f} s, {len(soak['rows'])} faults reached, "
        f"mismatches {len(soak['diffs'])}, leak {soak['leak']}"
    )
    print("\n".join(soak_lines(soak)))
    return 1 if soak["diffs"] else 0


if __name__ == "__main__":
    sys.exit(main())
