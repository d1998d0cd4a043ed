"""torch 2.15's process-group reconfigure as measured in results/reconfigure: what it changes in AccelPact's
recovery, read from that experiment's raw.json (benchmarks/bench_reconfigure.py).

Two figures feed the simulator, both measured side by side with the 2.13 rebind path in the same session:
- the heal of a SIGKILLed rank, death -> every rank resumed (``heal/2.15`` vs ``heal/2.13``,
  ``death_to_resumed_s``): their ratio scales the heal's size-independent parts calibrated on
  results/process_loss (which ran on 2.13, the rebind path);
- the rebind after a transient fault (``recovery/w<N>/reconfigure``, ``rebind_s``): reconfigure keeps the
  same ProcessGroup objects, so nothing is rebound (microseconds, against 15 us for the rebind path).
What reconfigure does NOT change here: the communicator build. Its ``rebuild_s`` (handle exchange +
``_reconfigure``) took longer than the rebind path's rendezvous at 2 and 4 ranks (results/reconfigure), so the
simulator keeps
``harness.scale.scaling.comm_init_s`` for it: no measurement says a reconfigure avoids NCCL's per-rank
bootstrap at scale.
"""

from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from harness.fleet.config import ScaleConfigError

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "results" / "reconfigure" / "raw.json"


@dataclass(frozen=True)
class Reconfigure:
    heal_ratio: float  # heal death -> resumed, 2.15 reconfigure / 2.13 rebind (medians)
    heal_215_s: float
    heal_213_s: float
    heal_trials: int
    rebind_s: float  # median rebind on the reconfigure path, every world and fault
    sha: str
    source: str


@functools.lru_cache(maxsize=2)
def measured_reconfigure(raw: str = str(RAW)) -> Reconfigure:
    path = Path(raw)
    if not path.exists():
        raise ScaleConfigError(
            f"{path} is missing: the reconfigure variant's costs come from it; run "
            "benchmarks/bench_reconfigure.py (see results/reconfigure/table.md) or restore it"
        )
    d = json.loads(path.read_text())
    try:
        new = [t["death_to_resumed_s"] for t in d["heal/2.15"]]
        old = [t["death_to_resumed_s"] for t in d["heal/2.13"]]
        rebind = [
            x for k, v in d.items() if k.startswith("recovery/") and k.endswith("/reconfigure") for x in v["rebind_s"]
        ]
    except (KeyError, TypeError) as err:
        raise ScaleConfigError(
            f"{path}: no {err} in it: the reconfigure variant reads heal/2.13, heal/2.15 "
            "(death_to_resumed_s) and recovery/w<N>/reconfigure (rebind_s)"
        ) from None
    if not new or not old or not rebind:
        raise ScaleConfigError(f"{path}: an empty heal or recovery list: rerun benchmarks/bench_reconfigure.py")
    h15, h13 = statistics.median(new), statistics.median(old)
    try:
        shown = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(path)
    return Reconfigure(
        h15 / h13,
        h15,
        h13,
        min(len(new), len(old)),
        statistics.median(rebind),
        str(d.get("sha", "")),
        f"{shown} (git {d.get('sha', '?')}): heal/2.15 vs heal/2.13 death_to_resumed_s, "
        "recovery/w*/reconfigure rebind_s",
    )
