"""How fast this host was while CI ran, so that a suite time can be read against the host, not alone.

    python3 .ci/host_speed.py probe --python .venv/bin/python > build/ci/host_speed.txt
    python3 .ci/host_speed.py share build/ci/cpu_before.txt build/ci/cpu_after.txt

The CI host is a shared 2-core VM whose speed changes from hour to hour: the same commit's default suite
took 15.5 min of pytest in one session and 9.1 min in the next, and every multi-process test scaled
alike (test_heal's post_vote run: 54.6-63.8 s, then 33.8 s). A suite time alone cannot tell that from a
regression, so CI prints two probes next to it:

- ``probe``: the best of 3 of two fixed workloads, before the suite. ``import torch`` in a fresh
  interpreter is what every rank process of the suite pays first (1.9-2.5 s on a fast hour here);
  a pure-Python loop is the interpreter's speed.
- ``share``: the CPU time the whole host spent between two ``/proc/stat`` samples, split into busy and
  steal (time the hypervisor gave another guest), as a share of both cores' wall time.

Standard library only, like ``slowest.py``: it runs with the system Python, outside the project's venv.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LOOP_N = 10_000_000
TRIES = 3


def _loop_s() -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(LOOP_N):
        total += i & 7
    return time.perf_counter() - t0


def _import_torch_s(python: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-c", "import torch"], check=True, capture_output=True)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class CpuSample:
    """One ``cpu`` line of /proc/stat: jiffies since boot, and when it was read."""

    wall: float
    busy: int  # user + nice + system + irq + softirq
    steal: int
    idle: int  # idle + iowait


def parse_cpu_line(line: str, wall: float) -> CpuSample:
    """The aggregate ``cpu`` line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    fields = line.split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        raise ValueError(f"not the aggregate cpu line of /proc/stat: {line!r}")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return CpuSample(wall, user + nice + system + irq + softirq, steal, idle + iowait)


def read_sample(path: Path) -> CpuSample:
    """A sample written by ``sample``: the cpu line, then the wall-clock time on the next line."""
    line, wall = path.read_text().splitlines()[:2]
    return parse_cpu_line(line, float(wall))


def shares(before: CpuSample, after: CpuSample) -> tuple[float, float, float]:
    """(seconds between the samples, busy share, steal share) of all cores' time in that span."""
    busy, steal, idle = after.busy - before.busy, after.steal - before.steal, after.idle - before.idle
    total = busy + steal + idle
    if total <= 0 or after.wall <= before.wall:
        raise ValueError("the second /proc/stat sample is not later than the first")
    return after.wall - before.wall, busy / total, steal / total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    probe = sub.add_parser("probe", help="time import torch and a pure-Python loop (best of 3)")
    probe.add_argument("--python", default=sys.executable, help="the interpreter whose torch to import")
    sample = sub.add_parser("sample", help="write the /proc/stat cpu line and the time to a file")
    sample.add_argument("out", type=Path)
    share = sub.add_parser("share", help="busy and steal share of the host's CPU between two samples")
    share.add_argument("before", type=Path)
    share.add_argument("after", type=Path)
    args = ap.parse_args(argv)

    if args.cmd == "probe":
        try:
            torch_s = min(_import_torch_s(args.python) for _ in range(TRIES))
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"host speed: could not import torch with {args.python}: {exc}", file=sys.stderr)
            return 1
        loop_s = min(_loop_s() for _ in range(TRIES))
        print(f"host speed (best of {TRIES}): import torch {torch_s:.2f} s, "
              f"pure-Python loop of {LOOP_N:,} {loop_s:.2f} s")
        return 0
    if args.cmd == "sample":
        line = Path("/proc/stat").read_text().splitlines()[0]
        args.out.write_text(f"{line}\n{time.time()}\n")
        return 0
    try:
        span, busy, steal = shares(read_sample(args.before), read_sample(args.after))
    except (OSError, ValueError) as exc:
        print(f"host cpu: no share to show ({exc})", file=sys.stderr)
        return 1
    print(f"host cpu over {span / 60:.1f} min: {busy:.0%} busy, {steal:.0%} steal (of all cores' time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
