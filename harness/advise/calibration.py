"""The cost model against the committed measurement of the heal's tax (results/heal_tax/calibration.json).

``experiments/heal_tax.py`` measures, on this host, the parts' rates (copy, checksum, each side of a push,
alone on one thread) and the tax side by side at 2 model sizes x 2 tokens-per-step settings. Here the
``cpu_here`` platform takes the measured rates, predicts each cell's tax from nothing but the cell's state
bytes and its median unprotected step, and sets the prediction beside the cell's interval. Reading only.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.advise.cost import CPU_HERE, Cadence, Platform, tax

__all__ = ["RESULTS", "load", "platform_from", "CellRow", "cell_rows", "table_lines", "order_interval"]

RESULTS = Path(__file__).resolve().parents[2] / "results" / "heal_tax" / "calibration.json"
MODES = ("snap", "push")
_NO_PUSH = 1e12  # GB/s: a push that costs nothing, for the "snapshots, no push" mode


def load(path: Path = RESULTS) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m experiments.heal_tax` or restore it from git")
    return json.loads(path.read_text())


def platform_from(data: Mapping[str, Any]) -> Platform:
    """``cpu_here`` with the committed measured rates."""
    r = data["rates"]
    return CPU_HERE.with_(copy_gbps=r["copy_gbps"], checksum_gbps=r["checksum_gbps"], push_gbps=r["push_gbps"])


def order_interval(values: list[float]) -> tuple[float, float, float]:
    """(min, max, coverage): the range of n trials contains their median with probability 1 - 2^(1-n)."""
    return min(values), max(values), 1.0 - 2.0 ** (1 - len(values))


@dataclass(frozen=True)
class CellRow:
    cell: str
    mode: str  # "snap": snapshots, no push; "push": + a confirmed push every step
    tokens: int
    state_bytes: int
    off_step_s: float
    median: float
    lo: float
    hi: float
    coverage: float
    n: int
    predicted: float

    @property
    def inside(self) -> bool:
        return self.lo <= self.predicted <= self.hi


def predict(platform: Platform, state_bytes: float, step_s: float, mode: str) -> float:
    p = platform if mode == "push" else platform.with_(push_gbps=_NO_PUSH)
    return tax(p, state_bytes, step_s, Cadence(1, 1, True)).fraction


def cell_rows(data: Mapping[str, Any], platform: Platform | None = None) -> list[CellRow]:
    platform = platform_from(data) if platform is None else platform
    rows = []
    for name, c in data["cells"].items():
        step = statistics.median(c["off_step_s"])
        for mode in MODES:
            xs = list(c["overhead"][mode])
            lo, hi, cov = order_interval(xs)
            rows.append(CellRow(name, mode, int(c["tokens_per_step"]), int(c["state_bytes"]), step,
                                statistics.median(xs), lo, hi, cov, len(xs),
                                predict(platform, c["state_bytes"], step, mode)))
    return rows


def table_lines(data: Mapping[str, Any], rows: list[CellRow]) -> list[str]:
    r = data["rates"]
    out = [f"Parts alone (thread CPU, one thread, {data['parts'][0]['bytes'] >> 20} MiB, before and after the cells): "
           f"copy {r['copy_gbps']:.2f} GB/s, CRC-32 ({data['parts'][0]['crc']}) {r['checksum_gbps']:.2f} GB/s, "
           f"push send {r['push_send_gbps']:.2f} GB/s and receive {r['push_recv_gbps']:.2f} GB/s "
           f"({r['push_gbps']:.2f} GB/s per side; the model charges both sides, one host). Overlap 0: every core "
           "trains.", "",
           "| cell | tokens per step | state per rank (MB) | step, off (s) | mode | measured tax, median [range] (n, coverage) "
           "| model | inside |", "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        mode = "snapshots, no push" if x.mode == "snap" else "+ push every step (confirmed)"
        out.append(f"| {x.cell} | {x.tokens} | {x.state_bytes / 1e6:.1f} | {x.off_step_s:.3f} | {mode} | "
                   f"{x.median * 100:+.1f}% [{x.lo * 100:+.1f}, {x.hi * 100:+.1f}] (n={x.n}, {x.coverage:.1%}) | "
                   f"{x.predicted * 100:+.1f}% | {'yes' if x.inside else 'NO'} |")
    return out
