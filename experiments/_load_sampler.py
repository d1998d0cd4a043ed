"""The host's 1-minute load average sampled in the background, so each run of a long experiment can say
what load it ran under.

Runs of one comparison go one after another; on a shared 2-core host the load moved from 4 to 18 within
one comparison, and a run's median step moved with it (1.0 s vs 1.5 s for the same fault-free model).
A load figure at the start of the whole experiment cannot tell those runs apart; one per run can.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LoadSampler", "read_samples", "mean_load"]


class LoadSampler:
    """Appends ``{"t": unix time, "load1": 1-min load}`` to ``path`` every ``every_s`` until stopped."""

    def __init__(self, path: Path, every_s: float = 5.0) -> None:
        self.path, self.every_s = path, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        with self.path.open("a") as f:
            while True:
                f.write(json.dumps({"t": round(time.time(), 1), "load1": round(os.getloadavg()[0], 2)}) + "\n")
                f.flush()
                if self._stop.wait(self.every_s):
                    return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_samples(path: Path) -> list[tuple[float, float]]:
    """(time, load1) pairs of a sampler's file; none if it does not exist (runs made before sampling)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            out.append((float(d["t"]), float(d["load1"])))
        except (ValueError, KeyError):
            continue
    return out


def mean_load(samples: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float, int]:
    """Mean 1-min load of the samples taken in [start, end], and how many there were (nan, 0 if none)."""
    inside = [load for t, load in samples if start <= t <= end]
    return (sum(inside) / len(inside), len(inside)) if inside else (math.nan, 0)
