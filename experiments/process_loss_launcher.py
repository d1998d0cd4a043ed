"""The heal in a user's own job, under ``python -m accelpact.run``: template vs spawned replacement, and HSDP.

Runs ``examples/train_heal.py`` (a torchrun-style FSDP2 script with an LR scheduler) through the launcher
users run instead of torchrun, SIGKILLs rank 1 mid-step, and measures the heal per trial:

- ``template``: world 2, the replacement forked from the agent's preloaded template (the default);
- ``spawn``: world 2, the replacement started as a new interpreter (``--replacement spawn``);
- ``hsdp_2x2``: world 4 on a (replicate 2, shard 2) mesh, template replacement.

The configurations are interleaved trial by trial (the host is shared and its load moves), and each healed
run is compared tensor by tensor with a fault-free run of its layout. Reported per configuration: the
median over trials with its order-statistic interval (harness.report.intervals; coverage stated) of the survivors'
death-to-resumed time and its parts, and of the replacement's launch-to-ready time.

    python -m experiments.process_loss_launcher --trials 5

Writes ``results/process_loss/launcher.md`` and ``launcher.json`` with the command, git sha and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CONFIGS", "main"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_heal.py"
STEPS, KILL_AT = 6, 3
KILL = ["--kill-at", str(KILL_AT), "--kill-rank", "1"]
# name -> (ranks, agent arguments, script arguments); "ref" runs are the fault-free references.
CONFIGS: dict[str, tuple[int, list[str], list[str]]] = {
    "template": (2, [], KILL),
    "spawn": (2, ["--replacement", "spawn"], KILL),
    "hsdp_2x2": (4, [], ["--hsdp", "2", *KILL]),
}
REFERENCES: dict[str, tuple[int, list[str], list[str]]] = {
    "ref_2": (2, [], []),
    "ref_hsdp_2x2": (4, [], ["--hsdp", "2"]),
}
REFERENCE_OF = {"template": "ref_2", "spawn": "ref_2", "hsdp_2x2": "ref_hsdp_2x2"}
METRICS = {  # column -> (role, field of the heal's RESULT entry)
    "survivor: death to resumed (s)": ("survivor", "total_s"),
    "survivor: waiting for the replacement (s)": ("survivor", "replacement_start_s"),
    "survivor: heal after arrival (s)": ("survivor", "heal_transfer_s"),
    "replacement: launch to ready (s)": ("replacement", "total_s"),
}


def run_job(scratch: Path, name: str, ranks: int, agent_args: list[str], script_args: list[str]) -> dict[str, Any]:
    """One ``accelpact.run`` job; every rank's RESULT lines and the job's wall time."""
    job = scratch / name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        str(ranks),
        "--rdzv-id",
        f"plx{os.getpid()}{name}",
        "--log-dir",
        str(job / "logs"),
        "--snapshot-root",
        str(scratch / "shm"),
        *agent_args,
        str(EXAMPLE),
        "--steps",
        str(STEPS),
        "--out",
        str(job / "out"),
        *script_args,
    ]
    job.mkdir(parents=True)
    t0 = time.monotonic()
    with (job / "agent.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=900).returncode
    wall = time.monotonic() - t0
    if rc != 0:
        raise RuntimeError(f"{name} failed (exit {rc}):\n{(job / 'agent.log').read_text()[-3000:]}")
    results = {}
    for rank in range(ranks):
        lines = (job / "logs" / f"rank{rank}.log").read_text().splitlines()
        results[rank] = [json.loads(x.split("RESULT ", 1)[1]) for x in lines if x.startswith("RESULT ")]
    return {"wall_s": wall, "results": results, "out": str(job / "out"), "ranks": ranks}


def bit_identical(ref: dict[str, Any], run: dict[str, Any]) -> bool:
    """Every rank's parameter shards and optimizer tensors equal the fault-free run's."""
    import torch

    for rank in range(ref["ranks"]):
        a = torch.load(Path(ref["out"]) / f"rank{rank}.pt", weights_only=True)["state"]
        b = torch.load(Path(run["out"]) / f"rank{rank}.pt", weights_only=True)["state"]
        if sorted(a) != sorted(b) or not all(torch.equal(a[k], b[k]) for k in a):
            return False
    return True


def heal_figures(run: dict[str, Any]) -> dict[str, Any]:
    """The survivors' (rank 0's) and the replacement's heal entries of one healed run."""
    survivor = run["results"][0][-1]["heals"]
    replacement = run["results"][1][-1]["heals"]
    if len(survivor) != 1 or len(replacement) != 1:
        raise RuntimeError(f"expected one heal on each side, got survivor {survivor}, replacement {replacement}")
    return {
        "survivor": survivor[0],
        "replacement": replacement[0],
        "bytes_read_from_disk": survivor[0]["bytes_read_from_disk"] + replacement[0]["bytes_read_from_disk"],
        "data_plane": replacement[0]["data_plane"]["path"],
    }


def table(trials: dict[str, list[dict[str, Any]]]) -> list[str]:
    from harness.report.intervals import order_statistic

    lines = [
        "| configuration | " + " | ".join(METRICS) + " | bit-identical | bytes read from disk | data plane |",
        "|---|" + "---|" * (len(METRICS) + 3),
    ]
    for name, runs in trials.items():
        cells = [order_statistic([r[role][key] for r in runs]).text(".2f") for role, key in METRICS.values()]
        same = sum(r["bit_identical"] for r in runs)
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {same}/{len(runs)} | "
            f"{max(r['bytes_read_from_disk'] for r in runs)} | {', '.join(sorted({r['data_plane'] for r in runs}))} |"
        )
    if trials.get("template") and trials.get("spawn"):  # paired by trial: the same moment's load
        pairs = [
            s["survivor"]["total_s"] / t["survivor"]["total_s"] for t, s in zip(trials["template"], trials["spawn"])
        ]
        lines += [
            "",
            f"spawn / template, survivors' death to resumed, paired by trial: {order_statistic(pairs).text('.2f')}.",
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.provenance import REPO_ROOT, collect, current_command, provenance_markdown

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {list(CONFIGS)}")
    ap.add_argument("--results", type=Path, default=REPO_ROOT / "results" / "process_loss")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, states)")
    args = ap.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or args.trials < 1:
        ap.error(f"--configs {unknown} unknown (choose from {list(CONFIGS)}) or --trials {args.trials} < 1")
    prov = collect(
        current_command(argv, "experiments.process_loss_launcher"),
        {"trials": args.trials, "steps": STEPS, "kill_at": KILL_AT, "configs": names},
    )
    scratch = Path(tempfile.mkdtemp(prefix="accelpact-plx-"))
    loads: list[float] = []
    try:
        refs = {r: run_job(scratch, r, *REFERENCES[r]) for r in sorted({REFERENCE_OF[n] for n in names})}
        trials: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for t in range(args.trials):
            for n in names:
                run = run_job(scratch, f"{n}_t{t}", *CONFIGS[n])
                loads.append(os.getloadavg()[0])
                trials[n].append(
                    {
                        **heal_figures(run),
                        "bit_identical": bit_identical(refs[REFERENCE_OF[n]], run),
                        "wall_s": run["wall_s"],
                    }
                )
                print(
                    f"trial {t} {n}: survivor {trials[n][-1]['survivor']['total_s']:.2f} s, "
                    f"bit-identical {trials[n][-1]['bit_identical']}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    lines = [
        "# The heal under `python -m accelpact.run`: template vs spawned replacement, and HSDP",
        "",
        f"`examples/train_heal.py` (FSDP2, TinyLM, AdamW with a linear-warm-up LR scheduler, {STEPS} steps) under "
        "the launcher; rank 1 SIGKILLs itself in step "
        f"{KILL_AT} between forward and backward. Per configuration, {args.trials} trials interleaved with the "
        "others; each cell is the median over trials with its order-statistic interval for the median ([min, max] of n "
        "trials covers 1 - 2^(1-n)). Survivor figures "
        "are rank 0's heal event: from the death notice to training again (waiting for the replacement to arrive, "
        "then the heal after arrival: rebuild, agree, load, first collective). The replacement's figure runs from "
        "the agent starting it to its first step. Every healed run is compared with a fault-free run of its "
        "layout (all ranks' parameter shards and optimizer tensors).",
        "",
        *table(trials),
        "",
        f"1-min load average after each run: min {min(loads):.1f}, max {max(loads):.1f} (a 2-core host shared "
        "with other jobs).",
        "",
        provenance_markdown(prov),
    ]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "launcher.md").write_text("\n".join(lines) + "\n")
    (args.results / "launcher.json").write_text(
        json.dumps({"provenance": prov.to_dict(), "trials": trials, "loads": loads}, indent=1, default=str)
    )
    print("\n".join(lines))
    return 0 if all(r["bit_identical"] for runs in trials.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
