"""The host's load around one run: sampled before it starts and every second while it runs, recorded in
its row, and one line printed when the load exceeds the cores the run uses. It never refuses a run.

Why: a run's measured goodput moves with its productive steps' speed, which on a shared host moves with
other processes' load (docs/goodput.md, "Load"). The row's load columns say what each run ran under.

- ``load_before``, ``load_mean``, ``load_max``: the 1-minute load average (/proc/loadavg via
  os.getloadavg) before the ranks start, and the mean and maximum of the samples while the run went;
- ``steal_pct``: CPU time stolen by the hypervisor over the run, as a share of all CPU time
  (/proc/stat's ``steal`` column; NaN where /proc/stat is missing);
- ``cores_used``: the cores the run's processes may use (its ranks on this host x torch threads per
  rank, at most the usable cores).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STAT = "/proc/stat"
EVERY_S = 1.0


def cpu_times(path: str = STAT) -> tuple[int, int] | None:
    """(steal ticks, total ticks) of the aggregate ``cpu`` line of /proc/stat; None where unreadable."""
    try:
        with open(path) as f:
            line = f.readline()
    except OSError:
        return None
    parts = line.split()
    if not parts or parts[0] != "cpu":
        return None
    ticks = [int(x) for x in parts[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user/nice.
    total = sum(ticks[:8])
    steal = ticks[7] if len(ticks) > 7 else 0
    return steal, total


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """Stolen CPU time between two ``cpu_times`` readings, in percent of all CPU time; NaN if unknown."""
    if before is None or after is None or after[1] <= before[1]:
        return math.nan
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def cores_used(world_size: int, threads_per_rank: int, usable: int) -> int:
    """The cores a run on this host can keep busy: its ranks' threads, at most the host's usable cores."""
    return max(1, min(world_size * max(1, threads_per_rank), usable))


def overload_line(load: float, cores: int) -> str | None:
    """The one line printed when ``load`` exceeds ``cores``; None otherwise."""
    if math.isnan(load) or load <= cores:
        return None
    return (
        f"load: the 1-min load average is {load:.1f}, above the {cores} core(s) this run uses; other "
        "processes slow its steps (its row records the load; a comparison's table names the cells it hit)"
    )


@dataclass
class LoadGuard:
    """Samples the load from ``start()`` to ``stop()``; ``stop()`` returns the row's load columns."""

    cores: int
    every_s: float = EVERY_S
    loadavg: Callable[[], float] = lambda: os.getloadavg()[0]
    stat: Callable[[], tuple[int, int] | None] = cpu_times
    say: Callable[[str], None] = lambda line: print(line, flush=True)
    samples: list[float] = field(default_factory=list)
    _before: float = math.nan
    _stat0: tuple[int, int] | None = None
    _warned: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LoadGuard:
        self._before = self.loadavg()
        self._stat0 = self.stat()
        self._check(self._before)
        self._thread = threading.Thread(target=self._run, name="load-guard", daemon=True)
        self._thread.start()
        return self

    def _check(self, load: float) -> None:
        line = overload_line(load, self.cores)
        if line and not self._warned:  # one line per run, not one per sample
            self._warned = True
            self.say(line)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            load = self.loadavg()
            self.samples.append(load)
            self._check(load)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        seen = [self._before, *self.samples]
        return {
            "load_before": round(self._before, 2),
            "load_mean": round(sum(self.samples) / len(self.samples), 2) if self.samples else round(self._before, 2),
            "load_max": round(max(seen), 2),
            "steal_pct": round(steal_share(self._stat0, self.stat()), 3),
            "cores_used": self.cores,
            "load_overloaded": self._warned,
        }


def for_run(run: Any) -> LoadGuard:
    """A guard for ``run`` (a RunConfig): its ranks on this host, each with the torch threads the launcher
    gives it (usable cores // ranks here, harness.parent.launcher)."""
    from harness.machine import usable_cores  # lazy: psutil

    usable = usable_cores()
    ranks_here = max(1, run.cluster.world_size // max(run.cluster.nodes, 1))
    return LoadGuard(cores=cores_used(ranks_here, max(1, usable // ranks_here), usable))
