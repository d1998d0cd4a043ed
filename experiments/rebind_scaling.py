"""Rebinding time and end-to-end recovery time vs world size and model depth, FSDP2 and FSDP1.

Paper: "reference-rebinding time 0.493-0.518 ms, constant from 4 to 16 GPUs" (16 RTX 5880, NCCL).
Ours, on this host (gloo over 127.0.0.1, all ranks on the same 2 CPU cores):

- rebinding: median of ``--rebinds`` swaps of every cached process-group reference (the binding
  table is built once at attach time; a rebind is a loop over its slots), at world sizes 2, 4, 8, 16
  for a 32-layer mistral_tiny-width decoder, and at depths 2-32 layers (world 2 and 4);
- end-to-end recovery after detection (agreement over the control store, new gloo generation,
  rebind, first collective) from real socket resets injected at mixed phases, at every world size,
  FSDP2 and FSDP1 (use_orig_params=False), 32 layers.

    python -m experiments.rebind_scaling            # full run (~10 min on 2 quiet cores)
    python -m experiments.rebind_scaling --quick    # ~1.5 min check (worlds 2 and 4), into a temp dir

Writes results/rebind_scaling/: table.md, data.csv, recoveries.csv, rebind_vs_world.png,
rebind_vs_depth.png, recovery_vs_world.png, provenance.json (+ provenance.md).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from accelpact.testing.session import load_average, run_session
from experiments import _driver
from experiments.provenance import (
    ClaimRow,
    load_provenance,
    paper_vs_ours_table,
    stamp_figure,
    write_provenance,
)
from experiments.workloads.fsdp_scenarios import RUNNER
from harness.report.paper import PAPER_REBIND_MS, PAPER_REBIND_WORLDS

NAME = "rebind_scaling"
FLAVOURS = ("fsdp2", "fsdp1")
_PAPER_SPREAD = PAPER_REBIND_MS[1] / PAPER_REBIND_MS[0]  # "constant": max/min of the paper's range
# mistral_tiny width; short sequences keep 16 ranks' steps affordable on 2 cores (rebinding and
# recovery do not depend on the sequence length).
MODEL = {"vocab": 4096, "hidden": 256, "inter": 768, "heads": 8, "kv_heads": 4, "seq": 16, "batch": 1}
PHASES = ["forward_allgather_middle", "backward_reduce_scatter", "clip_allreduce", "vote", "forward_allgather_first"]


def jobs_for(world: int, depths: Sequence[int], rebinds: int, faults: int, layers: int) -> list[dict]:
    jobs: list[dict] = []
    for flavour in FLAVOURS:
        jobs.append(
            {
                "name": f"rebind_{flavour}",
                "kind": "rebind",
                "flavour": flavour,
                "depths": list(depths),
                "rebinds": rebinds,
                "model": MODEL,
            }
        )
    for flavour in FLAVOURS:
        # One fault every other step, each on a different rank and phase: the step in between
        # shows the new generation carries on.
        fl = [{"step": 1 + 2 * k, "phase": PHASES[k % len(PHASES)], "ranks": [k % world]} for k in range(faults)]
        jobs.append(
            {
                "name": f"recover_{flavour}",
                "kind": "train",
                "flavour": flavour,
                "steps": 2 * faults + 2,
                "faults": fl,
                "model": {**MODEL, "layers": layers},
                "save_state": False,
            }
        )
    return jobs


def summarize_recoveries(per_rank: list[dict]) -> list[dict[str, float]]:
    """Per fault: each phase on its slowest rank, plus the all-ranks view (one host: clocks agree).

    total: a rank's own detection -> first good collective on the new generation (slowest rank);
    after_last_detect: the last rank caught the fault -> every rank ready;
    detect_all: the injection -> the last rank caught it (a rank busy computing notices only at
    its next collective, so this is mostly compute skew between ranks).
    """
    n = min(len(r["events"]) for r in per_rank)
    fired = sorted(f["at"] for r in per_rank for f in r["fired"])
    rows = []
    for i in range(n):
        evs = [r["events"][i] for r in per_rank]
        last_detect = max(e["t_detected"] for e in evs)
        ready = max(e["t_detected"] + e["total_s"] for e in evs)
        row = {
            k: max(e[k] for e in evs)
            for k in ("agreement_s", "rebuild_s", "rebind_s", "first_collective_s", "total_s", "retire_s")
        }
        row["after_last_detect_s"] = ready - last_detect
        row["detect_all_s"] = last_detect - fired[i] if len(fired) == n else float("nan")
        row["rounds"] = max(e["rounds"] for e in evs)
        rows.append(row)
    return rows


def measure(
    out_tmp: Path,
    worlds: Sequence[int],
    depths: Sequence[int],
    depth_worlds: Sequence[int],
    rebinds: int,
    faults: int,
    layers: int,
    log=print,
) -> tuple[list[dict], list[dict]]:
    data: list[dict] = []
    recs: list[dict] = []
    for world in worlds:
        d = sorted(set(depths if world in depth_worlds else []) | {layers})
        t0 = time.time()
        s = run_session(
            out_tmp / f"w{world}",
            RUNNER,
            jobs_for(world, d, rebinds, faults, layers),
            world_size=world,
            pg_timeout_s=300.0,
            control_deadline_s=300.0,
            timeout_s=1500.0,
            barrier=True,
        )
        for flavour in FLAVOURS:
            per_rank = s.job(f"rebind_{flavour}")
            for depth in d:
                cells = [r["by_depth"][str(depth)] for r in per_rank]
                data.append(
                    {
                        "flavour": flavour,
                        "world": world,
                        "depth": depth,
                        "slots": cells[0]["slots"],
                        "groups": cells[0]["groups"],
                        "rebind_median_us_rank0": cells[0]["median_s"] * 1e6,
                        "rebind_median_us_max_rank": max(c["median_s"] for c in cells) * 1e6,
                        "rebind_p90_us_max_rank": max(c["p90_s"] for c in cells) * 1e6,
                        "rebinds": cells[0]["n"],
                        "table_build_ms_max_rank": max(c["table_build_s"] for c in cells) * 1e3,
                    }
                )
            for i, row in enumerate(summarize_recoveries(s.job(f"recover_{flavour}"))):
                recs.append(
                    {
                        "flavour": flavour,
                        "world": world,
                        "depth": layers,
                        "fault": i,
                        **{k: v * 1e3 if k.endswith("_s") else v for k, v in row.items()},
                    }
                )
        log(f"  world {world}: {time.time() - t0:.0f}s (load {load_average()})")
    return data, recs


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def claim_rows(data: list[dict], recs: list[dict], layers: int) -> list[ClaimRow]:
    rows = []
    for flavour in FLAVOURS:
        cell = [r for r in data if r["flavour"] == flavour and r["depth"] == layers and r["world"] >= 4]
        if not cell:
            cell = [r for r in data if r["flavour"] == flavour and r["depth"] == layers]
        lo = min(r["rebind_median_us_max_rank"] for r in cell)
        hi = max(r["rebind_median_us_max_rank"] for r in cell)
        worlds = sorted(r["world"] for r in cell)
        rows.append(
            ClaimRow(
                claim=f"reference-rebinding time, {flavour}, {layers} layers, worlds {worlds[0]}-{worlds[-1]} "
                "(median; slowest rank)",
                paper=f"{PAPER_REBIND_MS[0]}-{PAPER_REBIND_MS[1]} ms",
                ours=f"{lo / 1e3:.4f}-{hi / 1e3:.4f} ms ({lo:.1f}-{hi:.1f} us)",
                paper_value=sum(PAPER_REBIND_MS) / 2,
                ours_value=(lo + hi) / 2e3,
                better="lower",
                reason="the table of every slot is built once at attach; a rebind is one dict store per slot",
            )
        )
        spread = hi / lo if lo else float("nan")
        slowest = max(cell, key=lambda r: r["rebind_median_us_max_rank"])["world"]
        fastest = min(cell, key=lambda r: r["rebind_median_us_max_rank"])["world"]
        slots = sorted({int(r["slots"]) for r in cell})
        rows.append(
            ClaimRow(
                claim=f"rebinding constant across world sizes ({flavour}): max/min of the medians",
                paper=f"{_PAPER_SPREAD:.2f} ({PAPER_REBIND_MS[1]}/{PAPER_REBIND_MS[0]})",
                ours=f"{spread:.2f}",
                paper_value=_PAPER_SPREAD,
                ours_value=spread,
                better="lower",
                tolerance=0.5,
                reason=(
                    f"the work is the same at every world size ({'/'.join(map(str, slots))} slots, set by the "
                    f"number of FSDP units); the medians move with how 4-16 processes share 2 cores, and not "
                    f"upwards with the world size: slowest at world {slowest}, fastest at world {fastest}"
                ),
            )
        )
    for flavour in FLAVOURS:
        by_world = {}
        for r in recs:
            if r["flavour"] == flavour:
                by_world.setdefault(r["world"], []).append(r)
        parts = ", ".join(f"w{w}: {_median(v, 'total_s'):.0f} ms" for w, v in sorted(by_world.items()))
        rows.append(
            ClaimRow(
                claim=f"end-to-end recovery after detection ({flavour}, {layers} layers), median over faults, "
                "slowest rank",
                paper="",
                ours=parts,
                reason=(
                    "the paper reports no end-to-end figure; ours grows with the world size because every "
                    "rendezvous and collective is a scheduler hand-off among N processes on 2 cores"
                ),
            )
        )
    return rows


def plots(out: Path, data: list[dict], recs: list[dict], prov, layers: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for flavour, marker in zip(FLAVOURS, "os"):
        rows = sorted((r for r in data if r["flavour"] == flavour and r["depth"] == layers), key=lambda r: r["world"])
        ax.plot(
            [r["world"] for r in rows],
            [r["rebind_median_us_max_rank"] for r in rows],
            marker=marker,
            label=f"ours, {flavour} (median, slowest rank)",
        )
    lo_us, hi_us = (round(x * 1e3) for x in PAPER_REBIND_MS)
    ax.fill_between(
        list(PAPER_REBIND_WORLDS),
        lo_us,
        hi_us,
        color="tab:red",
        alpha=0.3,
        label=f"paper: {lo_us}-{hi_us} us ({PAPER_REBIND_WORLDS[0]}-{PAPER_REBIND_WORLDS[1]} GPUs)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("rebinding time (us, log)")
    ax.set_title(f"Rebinding time vs world size, {layers}-layer decoder")
    ax.legend(fontsize=8)
    stamp_figure(fig, prov)
    fig.savefig(out / "rebind_vs_world.png", dpi=120)
    plt.close(fig)
    files.append("rebind_vs_world.png")

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for flavour, marker in zip(FLAVOURS, "os"):
        for world, ls in zip(sorted({r["world"] for r in data}), ("-", "--", ":", "-.")):
            rows = sorted(
                (r for r in data if r["flavour"] == flavour and r["world"] == world), key=lambda r: r["depth"]
            )
            if len(rows) < 2:
                continue
            ax.plot(
                [r["depth"] for r in rows],
                [r["rebind_median_us_max_rank"] for r in rows],
                marker=marker,
                linestyle=ls,
                label=f"{flavour}, world {world}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("decoder layers (FSDP units = layers + root)")
    ax.set_ylabel("rebinding time (us)")
    ax.set_title("Rebinding time vs model depth (linear in the number of cached references)")
    ax.legend(fontsize=8)
    stamp_figure(fig, prov)
    fig.savefig(out / "rebind_vs_depth.png", dpi=120)
    plt.close(fig)
    files.append("rebind_vs_depth.png")

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for flavour, marker in zip(FLAVOURS, "os"):
        worlds = sorted({r["world"] for r in recs if r["flavour"] == flavour})
        for key, ls in (("total_s", "-"), ("after_last_detect_s", ":")):
            meds = [_median([r for r in recs if r["flavour"] == flavour and r["world"] == w], key) for w in worlds]
            ax.plot(worlds, meds, marker=marker, linestyle=ls, label=f"{flavour}: {key[:-2].replace('_', ' ')}")
    ax.axhline(50, color="0.5", linestyle="--", linewidth=1, label="target at world 4: 50 ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("world size (ranks, all on 2 CPU cores)")
    ax.set_ylabel("recovery time after detection (ms, median over faults)")
    ax.set_title(f"End-to-end recovery vs world size, {layers} layers (paper: not reported)")
    ax.legend(fontsize=8)
    stamp_figure(fig, prov)
    fig.savefig(out / "recovery_vs_world.png", dpi=120)
    plt.close(fig)
    files.append("recovery_vs_world.png")
    return files


# The figures' precision in this experiment's CSVs.
write_csv = partial(_driver.write_csv, float_spec=".4f")


def table_md(data: list[dict], recs: list[dict], claims: list[ClaimRow], prov, layers: int, runtime_s: float) -> str:
    lines = [
        f"# Rebinding and recovery scaling ({layers}-layer mistral_tiny-width decoder)",
        "",
        paper_vs_ours_table(claims),
        "",
        "## Rebinding time (us), median of the rebinds on each rank, slowest rank",
        "",
        "| flavour | world | layers | slots | median us | p90 us | table build ms (once, at attach) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(data, key=lambda r: (r["flavour"], r["depth"], r["world"])):
        lines.append(
            f"| {r['flavour']} | {r['world']} | {r['depth']} | {r['slots']} | "
            f"{r['rebind_median_us_max_rank']:.1f} | {r['rebind_p90_us_max_rank']:.1f} | "
            f"{r['table_build_ms_max_rank']:.1f} |"
        )
    lines += [
        "",
        "## End-to-end recovery after detection (ms), median over faults [max]",
        "",
        "| flavour | world | faults | agreement | rebuild | rebind | first collective | **total** | "
        "after last detection | detection spread | retire (after) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault((r["flavour"], r["world"]), []).append(r)

    def cell(rows, k):
        vals = [r[k] for r in rows if r[k] == r[k]]
        return f"{statistics.median(vals):.1f} [{max(vals):.0f}]" if vals else "n/a"

    for (flavour, world), rows in sorted(groups.items()):
        lines.append(
            f"| {flavour} | {world} | {len(rows)} | {cell(rows, 'agreement_s')} | {cell(rows, 'rebuild_s')} | "
            f"{cell(rows, 'rebind_s')} | {cell(rows, 'first_collective_s')} | **{cell(rows, 'total_s')}** | "
            f"{cell(rows, 'after_last_detect_s')} | {cell(rows, 'detect_all_s')} | {cell(rows, 'retire_s')} |"
        )
    lines += [
        "",
        "## Reading the figures",
        "",
        "- Rebinding is O(slots): the slot count grows with the number of FSDP units (2 per FSDP2 unit: "
        "the mesh info's group and the mesh's group registry) and is independent of the world size, so "
        "the time is flat in the world size and linear in the depth. The paper's 0.5 ms, constant in the "
        "world size, is consistent with a traversal of the module tree at every rebind; ours builds that "
        "table once at attach (the 'table build' column) and never walks the model again.",
        "- End-to-end recovery: each phase is the slowest rank's; 'total' is a rank's own detection to "
        "its first good collective on the new generation, slowest rank. It includes waiting for the "
        "ranks that detect later, which 'after last detection' excludes. 'Detection spread' is the "
        "injection to the last rank catching the fault: a rank busy computing notices at its next "
        "collective. All ranks share 2 CPU cores with other jobs, so every rendezvous and collective "
        "costs scheduler hand-offs that grow with the number of processes; on one rank per core (or per "
        "GPU) these would not grow with N the same way.",
        "- Faults are real: a rank shuts down its own gloo TCP connections right before the chosen "
        "collective; every rank raises and the guard recovers in memory.",
        *_driver.closing_lines(runtime_s, prov),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = _driver.parser(__doc__, NAME, "worlds 2 and 4, fewer rebinds and faults, into a temp dir")
    ap.add_argument("--worlds", default=None, help="comma-separated world sizes (default 2,4,8,16; --quick 2,4)")
    ap.add_argument("--rebinds", type=int, default=None, help="rebinds per cell (default 1000; --quick 200)")
    ap.add_argument("--faults", type=int, default=None, help="faults per world and flavour (default 3; --quick 2)")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args(argv)
    worlds = [int(w) for w in (args.worlds or ("2,4" if args.quick else "2,4,8,16")).split(",")]
    rebinds = args.rebinds or (200 if args.quick else 1000)
    faults = args.faults or (2 if args.quick else 3)
    depths = [2, 4, 8, 16, 32] if not args.quick else [2, 8]
    depth_worlds = [2, 4]
    out = _driver.output_dir(args, NAME)
    command = _driver.command(argv, NAME)
    timing = _driver.Timing()
    setup = {
        "worlds": ",".join(map(str, worlds)),
        "rebinds": rebinds,
        "faults": faults,
        "layers": args.layers,
        "depths": ",".join(map(str, depths)),
    }
    # Written first too, so that an interrupted run still says what it was.
    write_provenance(out, command, {**setup, "load_avg_start": timing.load_start})
    print(
        f"{NAME}: worlds {worlds}, depths {depths} (at worlds {depth_worlds}), {rebinds} rebinds, "
        f"{faults} faults per world and flavour -> {out}"
    )
    with tempfile.TemporaryDirectory(prefix=f"{NAME}_") as tmp:
        data, recs = measure(Path(tmp), worlds, depths, depth_worlds, rebinds, faults, args.layers)
    runtime = timing.elapsed_s
    write_provenance(out, command, {**setup, **timing.extra()})
    prov = load_provenance(out)
    write_csv(out / "data.csv", data)
    write_csv(out / "recoveries.csv", recs)
    claims = claim_rows(data, recs, args.layers)
    plots(out, data, recs, prov, args.layers)
    (out / "table.md").write_text(table_md(data, recs, claims, prov, args.layers, runtime))
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
