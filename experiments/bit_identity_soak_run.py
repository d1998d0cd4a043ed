"""Running the bit-identity soak and reading it back from its kept directory (what a soak is and how it is
judged: ``experiments.bit_identity_soak``).

Its session timeout scales with the work (``soak_timeout_s``); its directory is never a temp dir, and every
rank appends one JSON line per step as it goes, so a soak killed part-way keeps every fault up to then
(``load_progress``, ``collect``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from accelpact.testing.compare import bit_differences
from accelpact.testing.session import run_session
from experiments.bit_identity_fds import kinds_from_progress
from experiments.workloads.fault_schedules import PG_TIMEOUT_S, RESOURCES, armed, fault_rows, hang_every, soak_faults
from experiments.workloads.fsdp_scenarios import RUNNER

__all__ = [
    "SETTLE_S",
    "HEARTBEAT_MISSES",
    "soak_timeout_s",
    "default_soak_dir",
    "run_soak",
    "run_reference",
    "load_progress",
    "json_lines",
    "collect",
]

SETTLE_S = PG_TIMEOUT_S + 5.0  # abandoned generations' collectives time out after PG_TIMEOUT_S
# Missed heartbeats (of 0.5 s) before a peer is called dead: 20 (10 s), not 4, so that a rank starved of
# CPU on a loaded host is not called dead (docs/reliability.md, "Heartbeat verdicts under starvation").
HEARTBEAT_MISSES = 20
# Upper bounds per unit of work on 2 cores shared with other jobs (a quiet host needs ~1/4 of each):
# a step of either run ~0.3 s quiet, a recovery ~0.1-0.4 s, a hang its stall plus the timeout.
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
