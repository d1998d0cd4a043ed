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

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accelpact.testing.compare import bit_differences
from accelpact.testing.session import run_session
from experiments.bit_identity_fds import fd_kind_lines, kinds_from_progress, only_store_connection
from harness.workloads.fault_schedules import PG_TIMEOUT_S, RESOURCES, armed, fault_rows, hang_every, soak_faults
from harness.workloads.fsdp_scenarios import RUNNER

__all__ = [
    "WARMUP_FAULTS",
    "RSS_TARGET_MIB_PER_FAULT",
    "soak_timeout_s",
    "default_soak_dir",
    "run_soak",
    "run_reference",
    "load_progress",
    "json_lines",
    "fit_slope",
    "growth",
    "soak_lines",
]

WARMUP_FAULTS = 50
RSS_TARGET_MIB_PER_FAULT = 0.05
SETTLE_S = PG_TIMEOUT_S + 5.0  # abandoned generations' collectives time out after PG_TIMEOUT_S
# Upper bounds per unit of work on 2 cores shared with other jobs (a quiet host needs ~1/4 of each):
# a step of either run ~0.3 s quiet, a recovery ~0.1-0.4 s, a hang its stall plus the timeout.
# Missed heartbeats (of 0.5 s) before a peer whose connection dropped is called dead. The default 4
# (2 s) called a live rank dead at fault 123 of a 1000-fault soak on this 2-core host at load ~19: a
# rank starved of CPU for 2 s stops beating although it is alive. 20 (10 s) keeps the soak about
# leaks, not about starvation; the false verdict itself is reported, not hidden.
HEARTBEAT_MISSES = 20
_STARTUP_S = 180.0
_PER_STEP_S = 1.5
_PER_FAULT_S = 2.0


def soak_timeout_s(n_faults: int, pg_timeout_s: float = PG_TIMEOUT_S) -> float:
    """The session budget of an n-fault soak: grows with steps (both runs), faults and hangs."""
    steps = 2 * n_faults + 2
    hangs = n_faults // hang_every(n_faults)
    return _STARTUP_S + 2 * steps * _PER_STEP_S + n_faults * _PER_FAULT_S + hangs * (2 * pg_timeout_s + 10) + SETTLE_S


def default_soak_dir(root: Path) -> Path:
    """A fresh, kept directory for one soak: ``root/outputs/bit_identity_soak/<UTC time>``."""
    return root / "outputs" / "bit_identity_soak" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def run_reference(out: Path, world: int, n: int, layers: int, model: dict[str, int] | None = None) -> None:
    """Only the fault-free reference of an n-fault soak, into ``out/ref_run`` (alongside a running
    soak: on a crowded host the two sessions together get the reference done sooner)."""
    steps = max(f["step"] for f in soak_faults(world, n)) + 2  # exactly the soak's step count
    # Per-step progress lines (losses) without a control-store barrier: a soak cut short can still
    # compare its losses step by step with the reference's.
    job = {
        "name": "ref",
        "kind": "train",
        "flavour": "fsdp2",
        "guard": False,
        "steps": steps,
        "model": {**(model or {}), "layers": layers},
        "track_resources": True,
        "progress": True,
        "resources_barrier": False,
    }
    run_session(
        out / "ref_run",
        RUNNER,
        [job],
        world_size=world,
        pg_timeout_s=PG_TIMEOUT_S,
        control_deadline_s=120.0,
        timeout_s=soak_timeout_s(n),
        barrier=True,
        check=True,
    )


def run_soak(
    out: Path, world: int, n: int, layers: int, timeout_s: float | None = None, model: dict[str, int] | None = None
) -> dict:
    """Run the soak into ``out`` (kept), then read it back with :func:`load_progress` plus the
    bit comparison when both runs finished."""
    faults = soak_faults(world, n)
    steps = max(f["step"] for f in faults) + 2
    model = {**(model or {}), "layers": layers}
    # The faulted run first: a soak cut short (killed, out of time) keeps its per-fault data from
    # the first minute on; the fault-free reference only matters once the faulted run has finished.
    jobs = [
        {
            "name": "faults",
            "kind": "train",
            "flavour": "fsdp2",
            "steps": steps,
            "model": model,
            "faults": armed(faults),
            "track_resources": True,
            "progress": True,
            "settle_s": SETTLE_S,
            "heartbeat_misses": HEARTBEAT_MISSES,
        },
        {"name": "ref", "kind": "train", "flavour": "fsdp2", "guard": False, "steps": steps, "model": model},
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "schedule.json").write_text(
        json.dumps({"world": world, "faults": faults, "steps": steps, "layers": layers, "model": model})
    )
    budget = timeout_s if timeout_s is not None else soak_timeout_s(n)
    s = run_session(
        out,
        RUNNER,
        jobs,
        world_size=world,
        pg_timeout_s=PG_TIMEOUT_S,
        control_deadline_s=120.0,
        timeout_s=budget,
        barrier=True,
        check=False,
    )
    soak = load_progress(out)
    soak.update(wall_s=s.wall_s, timeout_s=budget, timed_out=s.timed_out, returncodes=s.returncodes)
    finished = all(
        s.result(name, r) and not s.result(name, r).get("error") for name in ("ref", "faults") for r in range(world)
    )
    if finished:
        soak["diffs"], soak["counts"] = bit_differences(s, "faults", "ref")
        soak["settled"] = [s.result("faults", r).get("resources_settled") for r in range(world)]
    else:
        errs = [s.result("faults", r).get("error") for r in range(world) if s.result("faults", r)]
        soak["diffs"] = [
            f"the soak did not finish (exit codes {s.returncodes}, "
            f"{'killed at the ' + format(budget, '.0f') + ' s budget' if s.timed_out else 'failed'}"
            f"{': ' + errs[0]['type'] + ': ' + errs[0]['message'] if errs and errs[0] else ''}); "
            f"{len(soak['rows'])} faults kept in {out}"
        ]
        soak["counts"] = {}
    return soak


def load_progress(out: Path) -> dict:
    """The soak as far as its ranks got: per-fault rows and per-step resources from the JSON lines."""
    sched = json.loads((out / "schedule.json").read_text())
    world, faults = sched["world"], sched["faults"]
    per_rank: list[dict[str, Any]] = []
    settled: list[dict | None] = []
    kinds: list[dict[str, dict | None]] = []
    for rank in range(world):
        path = out / f"progress.faults.rank{rank}.jsonl"
        lines = json_lines(path)
        steps = [x for x in lines if "step" in x]
        per_rank.append(
            {
                "events": [e for x in steps for e in x["events"]],
                "resources": [{k: x[k] for k in ("step", "recoveries", *RESOURCES)} for x in steps],
            }
        )
        settled.append(next((x["settled"] for x in lines if "settled" in x), None))
        # fds by kind (progress lines of newer soaks): names what a constant difference is made of
        kinds.append(kinds_from_progress(lines))
    done = min(len(r["resources"]) for r in per_rank)
    reached = [f for f in faults if f["step"] < done]
    baseline = [r["resources"][0] if r["resources"] else None for r in per_rank]
    final = [r["resources"][done - 1] if done else None for r in per_rank]
    leak = (
        {k: max(fin[k] - base[k] for base, fin in zip(baseline, final)) for k in RESOURCES}
        if done
        else {k: float("nan") for k in RESOURCES}
    )
    return {
        "flavour": "fsdp2",
        "world": world,
        "faults_planned": len(faults),
        "steps": sched["steps"],
        "layers": sched.get("layers"),
        "model": sched.get("model"),
        "rows": fault_rows("fsdp2", world, reached, per_rank),
        "baseline": baseline,
        "leak": leak,
        "resources": [r["resources"] for r in per_rank],
        "settled": settled,
        "fd_kinds": kinds,
        "dir": str(out),
    }


def json_lines(path: Path) -> list[dict]:
    """Every complete JSON line of ``path`` (a soak still running may be half-way through its last)."""
    out = []
    for x in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(x))
        except ValueError:
            continue
    return out


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


def collect(out: Path) -> dict:
    """A finished (or killed) soak read back from its kept directory alone, bit comparison included
    when both runs saved their state: what ``--soak-from DIR`` tables."""
    from accelpact.testing.session import Session

    soak = load_progress(out)
    world = soak["world"]
    results = [json.loads(p.read_text()) if (p := out / f"results.rank{r}.json").exists() else {} for r in range(world)]
    ref_run = out / "ref_run"
    for r in range(world):  # a reference run beside the soak (run_reference) stands in for its own
        if "ref" not in results[r] and (ref_run / f"results.rank{r}.json").exists():
            results[r]["ref"] = json.loads((ref_run / f"results.rank{r}.json").read_text())["ref"]
            if not (out / f"ref.rank{r}.pt").exists():
                (out / f"ref.rank{r}.pt").symlink_to((ref_run / f"ref.rank{r}.pt").resolve())
    meta = json.loads((out / "session.json").read_text()) if (out / "session.json").exists() else {}
    s = Session(out, world, results, meta.get("returncodes", [0] * world), [], meta.get("wall_s", float("nan")))
    soak.update(
        wall_s=s.wall_s, timeout_s=meta.get("timeout_s", float("nan")), timed_out=meta.get("timed_out"), meta=meta
    )
    if all(s.result(n, r) and not s.result(n, r).get("error") for n in ("ref", "faults") for r in range(world)):
        soak["diffs"], soak["counts"] = bit_differences(s, "faults", "ref")
        soak["settled"] = [s.result("faults", r).get("resources_settled") for r in range(world)]
    else:
        soak["diffs"], soak["counts"] = [f"the soak did not finish; {len(soak['rows'])} faults kept in {out}"], {}
    soak["loss_check"] = _compare_losses(out, world)
    return soak


def _compare_losses(out: Path, world: int) -> dict[str, Any]:
    """Step-by-step losses of the faulted run against the reference's, over the steps both reached
    (from the progress lines: meaningful even when neither run finished)."""

    def losses(path: Path) -> dict[int, float]:
        return {x["step"]: x["loss"] for x in json_lines(path) if "step" in x and "loss" in x}

    compared, mismatched = 0, []
    for r in range(world):
        got = losses(out / f"progress.faults.rank{r}.jsonl")
        ref = losses(out / "ref_run" / f"progress.ref.rank{r}.jsonl") or losses(out / f"progress.ref.rank{r}.jsonl")
        common = sorted(set(got) & set(ref))
        compared = len(common) if r == 0 else min(compared, len(common))
        mismatched += [(r, st) for st in common if got[st] != ref[st]]
    return {"steps": compared, "mismatches": mismatched[:20], "n_mismatches": len(mismatched)}


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
