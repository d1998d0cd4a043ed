"""accelpact.run's heal of a SIGKILLed rank: replacement forked from the template vs a spawned process, side by side.

    PYTHONPATH=$PWD python benchmarks/bench_launcher_heal.py --trials 3

Each trial starts two jobs AT ONCE (so both see the same machine load): ``python -m accelpact.run
--nproc-per-node 2 examples/train_heal.py --kill-at 3`` with ``--replacement template`` and with
``--replacement spawn``. Rank 1 SIGKILLs itself mid-step; the survivor's heal event gives
caught -> healed (``total_s``), caught -> the replacement arrived (``replacement_start_s``) and the
rest (``heal_transfer_s``). In the same run it times a bare ``python -c "import torch"``. Prints the
medians, the spawn/template ratio and the git sha; not a test (no thresholds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_heal.py"


def start(mode: str, work: Path, trial: int) -> subprocess.Popen:
    run = work / f"{mode}{trial}"
    run.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        "2",
        "--replacement",
        mode,
        "--log-dir",
        str(run / "logs"),
        "--snapshot-root",
        str(work / "shm"),
        str(EXAMPLE),
        "--steps",
        "6",
        "--kill-at",
        "3",
    ]
    return subprocess.Popen(cmd, stdout=(run / "agent.log").open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def survivor_heal(run: Path) -> dict:
    for line in (run / "logs" / "rank0.log").read_text().splitlines():
        if line.startswith("RESULT "):
            [heal] = json.loads(line.split("RESULT ", 1)[1])["heals"]
            return heal
    raise RuntimeError(f"no RESULT in {run}/logs/rank0.log:\n{(run / 'agent.log').read_text()[-2000:]}")


def bare_torch_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    rows: dict[str, list[dict]] = {"template": [], "spawn": []}
    bare = []
    with tempfile.TemporaryDirectory(prefix="bench_launcher_") as tmp:
        work = Path(tmp)
        for trial in range(args.trials):
            procs = {mode: start(mode, work, trial) for mode in rows}
            for mode, p in procs.items():
                if p.wait(timeout=900) != 0:
                    print((work / f"{mode}{trial}" / "agent.log").read_text()[-3000:], file=sys.stderr)
                    return 1
                rows[mode].append(survivor_heal(work / f"{mode}{trial}"))
            bare.append(bare_torch_s())
            print(f"trial {trial}: " + ", ".join(f"{m} {rows[m][-1]['total_s']:.2f} s" for m in rows), flush=True)
    load = os.getloadavg()
    print(
        f"\naccelpact.run heal, caught -> healed on the survivor (git {sha}, {os.cpu_count()} cores, load "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the end, {args.trials} trials each, medians)"
    )
    print("| replacement | caught -> healed | caught -> replacement arrived | the rest |")
    print("|---|---|---|---|")
    med = {
        m: {k: statistics.median(r[k] for r in rows[m]) for k in ("total_s", "replacement_start_s", "heal_transfer_s")}
        for m in rows
    }
    for m in rows:
        print(
            f"| {m} | {med[m]['total_s']:.2f} s | {med[m]['replacement_start_s']:.2f} s | {med[m]['heal_transfer_s']:.2f} s |"
        )
    print(
        f"\nspawn / template: {med['spawn']['total_s'] / med['template']['total_s']:.2f}x; "
        f"bare `python -c 'import torch'` in the same run: {statistics.median(bare):.2f} s (median)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
