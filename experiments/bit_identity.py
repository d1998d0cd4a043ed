"""Bit-identity after 10 successive faults of mixed kinds and phases, against a fault-free reference.

Paper: "parameter state bit-identical on all 16 ranks after 10 successive fault injections, zero
numerical drift" (ranks equal to EACH OTHER). Ours is the stronger claim: every rank's full state
(every local parameter shard, every AdamW exp_avg / exp_avg_sq / step) and every per-step loss is
equal, by ``torch.equal`` and by sha256 of the bytes, to the same run WITHOUT faults (same seed,
same data, same step count). FSDP2 and FSDP1 (flat parameters), one run each, 10 faults in a row:

  socket reset before the first forward all-gather (one rank), a middle all-gather (all ranks), a
  backward reduce-scatter (one rank), the clip-norm all-reduce (all ranks), the vote (one rank); a
  vote that completed on some ranks only (roll forward); a hang past the collective timeout
  (SIGSTOP-like stall of one rank); a nested fault (a second reset while the first recovery builds
  its new generation); the vote on all ranks; backward on all ranks.

Leaks are tracked per fault (threads, open fds, TCP sockets, RSS): after 10 faults each must be
within +2 of its pre-fault baseline (the bar we hold recovery to), once settled: 20 s after the last
step, when the abandoned generations' collectives have timed out (15 s) and released their sockets.

    python -m experiments.bit_identity            # full run (~1.5 min on 2 quiet cores; with --soak ~5.5)
    python -m experiments.bit_identity --quick    # FSDP2 only, 2 ranks, 5 faults, temp dir
    python -m experiments.bit_identity --short-only   # the two 10-fault runs only, keeping table.md's soak
    python -m experiments.bit_identity --soak     # 100 faults on 2 ranks, leaks per fault (slow, not CI)
    python -m experiments.bit_identity --soak --soak-faults 1000 --soak-layers 2   # ~1-1.5 h, see bit_identity_soak

Writes results/bit_identity/: table.md, faults.csv, identity.csv, resources.csv (per step and rank),
leaks.png, provenance.json; with --soak also soak_faults.csv, soak_resources.csv and soak_leaks.png.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from accelpact.testing.compare import bit_differences
from accelpact.testing.session import load_average, run_session
from experiments import _driver
from experiments.bit_identity_fds import kinds_from_progress
from experiments.bit_identity_report import keep_soak_section, leak_plot, per_step_resources, table_md
from experiments.bit_identity_soak import soak_lines, soak_provenance
from experiments.bit_identity_soak_run import (
    SETTLE_S,
    collect,
    default_soak_dir,
    json_lines,
    load_progress,
    run_soak,
)
from experiments.provenance import load_provenance, write_provenance
from experiments.workloads.fault_schedules import PG_TIMEOUT_S, RESOURCES, armed, fault_rows, ten_faults
from experiments.workloads.fsdp_scenarios import RUNNER

NAME = "bit_identity"


def run_flavour(tmp: Path, flavour: str, world: int, faults: list[dict], layers: int) -> dict:
    steps = max(f["step"] for f in faults) + 2
    model = {"layers": layers}
    jobs = [
        {"name": "ref", "kind": "train", "flavour": flavour, "guard": False, "steps": steps, "model": model},
        {
            "name": "faults",
            "kind": "train",
            "flavour": flavour,
            "steps": steps,
            "model": model,
            "faults": armed(faults),
            "track_resources": True,
            "settle_s": SETTLE_S,
            "progress": True,
        },
    ]
    s = run_session(
        tmp / flavour,
        RUNNER,
        jobs,
        world_size=world,
        pg_timeout_s=PG_TIMEOUT_S,
        control_deadline_s=120.0,
        timeout_s=1500.0,
        barrier=True,
    )
    per_rank = s.job("faults")
    s.job("ref")
    diffs, counts = bit_differences(s, "faults", "ref")
    rows = fault_rows(flavour, world, faults, per_rank)
    baseline = [next(x for x in r["resources"] if x["step"] == 0) for r in per_rank]
    final = [r["resources"][-1] for r in per_rank]
    leak = _worst_change(baseline, final)
    # Right after the last fault the abandoned generations' threads and sockets are still there (their
    # collectives time out after PG_TIMEOUT_S); the target is about what stays, so it is judged settled.
    settled = [s.result("faults", r).get("resources_settled") for r in range(world)]
    leak_settled = _worst_change(baseline, settled) if all(settled) else None
    # fds by kind per rank (the progress lines): what a settled difference from the baseline is made of
    kinds = [kinds_from_progress(json_lines(tmp / flavour / f"progress.faults.rank{r}.jsonl")) for r in range(world)]
    return {
        "flavour": flavour,
        "world": world,
        "rows": rows,
        "diffs": diffs,
        "counts": counts,
        "leak": leak,
        "leak_settled": leak_settled,
        "fd_kinds": kinds,
        "baseline": baseline,
        "resources": [r["resources"] for r in per_rank],
        "events": [len(r["events"]) for r in per_rank],
        "steps": steps,
        "wall_s": s.wall_s,
        "losses_equal": not any("loss" in d for d in diffs),
    }


def _worst_change(baseline: list[dict], samples: list[dict]) -> dict[str, float]:
    """Per resource, the largest change of any rank from its baseline to its sample."""
    return {k: max(now[k] - base[k] for base, now in zip(baseline, samples)) for k in RESOURCES}


# The figures' precision in this experiment's CSVs.
write_csv = partial(_driver.write_csv, float_spec=".3f")


def soak_only(out: Path, kept: Path, argv: list[str] | None) -> int:
    """Table a soak from its kept dir into ``out`` without rerunning the short runs: soak_* files, the
    soak's own provenance in ``out/soak/``, and table.md's soak section replaced in place."""
    soak = collect(kept)
    write_provenance(out / "soak", _driver.command(argv, NAME), soak_provenance(soak))
    prov = load_provenance(out / "soak")
    write_csv(out / "soak_faults.csv", soak["rows"])
    write_csv(out / "soak_resources.csv", per_step_resources([soak]))
    leak_plot(out / "soak_leaks.png", [soak], prov, f"Soak: resources over {len(soak['rows'])} recoveries")
    section = (
        "\n".join(soak_lines(soak))
        + "\n"
        + (out / "soak" / "provenance.md").read_text().replace("### Provenance", "### Provenance of the soak section")
        + "\n"
    )
    table = (out / "table.md").read_text().replace("issue bar:", "target:")
    head, sep, tail = table.partition("## How to read it")
    head = head.split("## Soak")[0]
    (out / "table.md").write_text(head + section + sep + tail)
    print(section)
    return 1 if soak["diffs"] and not (soak.get("loss_check") or {}).get("steps") else 0


def main(argv: list[str] | None = None) -> int:
    ap = _driver.parser(__doc__, NAME, "FSDP2 on 2 ranks, the first 5 faults, into a temp dir")
    ap.add_argument("--soak", action="store_true", help="also a 100-fault soak on 2 ranks (slow; not in CI)")
    ap.add_argument("--soak-faults", type=int, default=100, help="faults in the soak (default 100; 1000 is ~1 h)")
    ap.add_argument(
        "--soak-timeout-s",
        type=float,
        default=None,
        help="the soak's session budget (default: scales with --soak-faults, see bit_identity_soak)",
    )
    ap.add_argument(
        "--soak-dir",
        default=None,
        help="where the soak's ranks write as they go, kept afterwards (default outputs/bit_identity_soak/<UTC time>/)",
    )
    ap.add_argument(
        "--soak-from",
        default=None,
        metavar="DIR",
        help="with --soak: table the soak already run into DIR (python -m experiments.bit_identity_soak "
        "--faults N --dir DIR) instead of running one",
    )
    ap.add_argument(
        "--soak-report",
        default=None,
        metavar="DIR",
        help="only print the soak section for a kept (possibly killed) soak dir, and write its "
        "soak_faults.csv and soak_resources.csv there",
    )
    ap.add_argument("--world", type=int, default=4, help="ranks for the FSDP2 run (default 4)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--soak-layers",
        type=int,
        default=None,
        help="decoder layers in the soak (default --layers); fewer make a 1000-fault soak fit a "
        "loaded host: what it measures is per recovery, not per parameter",
    )
    ap.add_argument(
        "--soak-only",
        action="store_true",
        help="with --soak-from DIR: replace only the soak section of an existing table.md (the short "
        "runs' sections and provenance stay as they are); the soak's provenance goes to soak/",
    )
    ap.add_argument(
        "--short-only",
        action="store_true",
        help="rerun only the 10-fault runs and replace their sections of an existing table.md; its soak "
        "section, soak_* files and soak/ provenance stay as they are (the soak takes ~1 h)",
    )
    args = ap.parse_args(argv)
    if args.short_only and (args.soak or args.quick):
        print("--short-only reruns the full 10-fault runs alone: drop --soak / --quick", file=sys.stderr)
        return 2
    if args.soak_only:
        if not args.soak_from:
            print(
                "--soak-only needs --soak-from DIR (a soak run with python -m experiments.bit_identity_soak)",
                file=sys.stderr,
            )
            return 2
        return soak_only(_driver.output_dir(args, NAME), Path(args.soak_from), argv)
    if args.soak_report:
        kept = Path(args.soak_report)
        if not (kept / "schedule.json").exists():
            print(f"{kept} is not a soak dir (no schedule.json); pass the --soak-dir of a soak", file=sys.stderr)
            return 2
        soak = load_progress(kept)
        soak["diffs"] = [f"not compared: rebuilt from the progress lines in {kept}"]
        write_csv(kept / "soak_faults.csv", soak["rows"])
        write_csv(kept / "soak_resources.csv", per_step_resources([soak]))
        print("\n".join(soak_lines(soak)))
        return 0
    out = _driver.output_dir(args, NAME)
    stale = sorted(p.name for p in out.glob("soak_*")) if not (args.soak or args.short_only) else []
    if stale:
        # table.md and provenance are rewritten on every run: without the soak they would describe
        # a run that never made the soak files beside them.
        print(
            f"{out} holds a soak from an earlier run ({', '.join(stale)}); rerun with --soak to regenerate "
            f"it too, or write elsewhere with --out DIR",
            file=sys.stderr,
        )
        return 2
    timing = _driver.Timing()
    plan = (
        [("fsdp2", 2, ten_faults(2)[:5])]
        if args.quick
        else [("fsdp2", args.world, ten_faults(args.world)), ("fsdp1", 2, ten_faults(2))]
    )
    print(
        f"{NAME}: {[(f, w, len(fl)) for f, w, fl in plan]} (flavour, ranks, faults)"
        + (f" + soak of {args.soak_faults}" if args.soak else "")
        + f" -> {out}"
    )
    results = []
    soak = None
    # Not a TemporaryDirectory: a run that fails keeps its rank logs (deleted below on success).
    tmp = tempfile.mkdtemp(prefix=f"{NAME}_")
    for flavour, world, faults in plan:
        t = time.time()
        results.append(run_flavour(Path(tmp), flavour, world, faults, args.layers))
        print(
            f"  {flavour} x{world}: {time.time() - t:.0f}s, mismatches {len(results[-1]['diffs'])}, "
            f"leak {results[-1]['leak']} (load {load_average()})"
        )
    if args.soak and args.soak_from:
        soak = collect(Path(args.soak_from))
        print(f"  soak from {args.soak_from}: {len(soak['rows'])} faults, mismatches {len(soak['diffs'])}")
    elif args.soak:
        t = time.time()
        soak_dir = Path(args.soak_dir) if args.soak_dir else default_soak_dir(Path(__file__).resolve().parents[1])
        print(f"  soak of {args.soak_faults} faults -> {soak_dir} (kept; progress.faults.rank*.jsonl grow per step)")
        soak_layers = args.soak_layers or args.layers
        soak = run_soak(soak_dir, 2, args.soak_faults, soak_layers, args.soak_timeout_s)
        print(f"  soak: {time.time() - t:.0f}s, mismatches {len(soak['diffs'])}, leak {soak['leak']}")
    shutil.rmtree(tmp, ignore_errors=True)
    runtime = timing.elapsed_s
    write_provenance(
        out,
        _driver.command(argv, NAME),
        {
            "runs": ", ".join(f"{f} x{w}: {len(fl)} faults" for f, w, fl in plan),
            "pg_timeout_s": PG_TIMEOUT_S,
            "layers": args.layers,
            "soak": bool(args.soak) or ("kept from an earlier run: soak/provenance.md" if args.short_only else False),
            **(soak_provenance(soak) if soak else {}),
            **timing.extra(),
        },
    )
    prov = load_provenance(out)
    write_csv(out / "faults.csv", [r for res in results for r in res["rows"]])
    write_csv(out / "resources.csv", per_step_resources(results))
    write_csv(
        out / "identity.csv",
        [
            {
                "flavour": r["flavour"],
                "world": r["world"],
                "faults": len(r["rows"]),
                "steps": r["steps"],
                **r["counts"],
                "mismatches": len(r["diffs"]),
                **{f"leak_{k}": r["leak"][k] for k in RESOURCES},
            }
            for r in results
        ],
    )
    leak_plot(out / "leaks.png", results, prov, "Resources per recovery (10 successive faults)")
    if soak:
        write_csv(out / "soak_faults.csv", soak["rows"])
        write_csv(out / "soak_resources.csv", per_step_resources([soak]))
        leak_plot(out / "soak_leaks.png", [soak], prov, f"Soak: resources over {len(soak['rows'])} recoveries")
    table = table_md(results, prov, runtime, soak)
    if args.short_only:
        table = keep_soak_section(table, out / "table.md")
    (out / "table.md").write_text(table)
    print((out / "table.md").read_text())
    bad = any(r["diffs"] for r in results) or (soak is not None and soak["diffs"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
