"""The cost model against the committed measurement of the heal's tax (results/heal_tax/calibration.json).

``experiments/heal_tax.py`` measures, on this host, the parts' rates (copy, checksum, each side of a push,
alone on one thread) and the tax side by side at 2 model sizes x 2 tokens-per-step settings. Here the
``cpu_here`` platform takes the measured rates, predicts each cell's tax from nothing but the cell's state
bytes and its median unprotected step, and sets the prediction beside the cell's interval. Reading only.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def order_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(lo, hi, coverage): the order-statistic (sign-test) interval for the median of n trials, [x_(j),
    x_(n+1-j)] with the largest j whose exact coverage 1 - 2 P(Binomial(n, 1/2) <= j - 1) is at least
    ``level``; the range (j = 1, coverage 1 - 2^(1-n)) when no j reaches it (n <= 8 at 95%)."""
    xs = sorted(values)
    n = len(xs)

    def coverage(j: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0**n

    j = 1
    while j + 1 <= (n + 1) // 2 and coverage(j + 1) >= level:
        j += 1
    return xs[j - 1], xs[n - j], coverage(j)


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
    cpu_median: float = math.nan
    cpu_lo: float = math.nan
    cpu_hi: float = math.nan

    @property
    def inside(self) -> bool:
        return self.lo <= self.predicted <= self.hi

    @property
    def inside_cpu(self) -> bool:
        return self.cpu_lo <= self.predicted <= self.cpu_hi


def predict(platform: Platform, state_bytes: float, step_s: float, mode: str) -> float:
    p = platform if mode == "push" else platform.with_(push_gbps=_NO_PUSH)
    return tax(p, state_bytes, step_s, Cadence(1, 1, True)).fraction


def cell_rows(data: Mapping[str, Any], platform: Platform | None = None) -> list[CellRow]:
    platform = platform_from(data) if platform is None else platform
    rows = []
    for name, c in data["cells"].items():
        # The unprotected step at full speed: rank 0's CPU seconds per step with snapshots off (what a step
        # takes on a quiet host; wall time on this shared host also holds other jobs' share of the cores).
        step = statistics.median(c.get("off_cpu_s") or c["off_step_s"])
        for mode in MODES:
            xs = list(c["overhead"][mode])
            lo, hi, cov = order_interval(xs)
            cpu = list(c.get("cpu_overhead", {}).get(mode, [])) or [math.nan]
            clo, chi, _ = order_interval(cpu)
            rows.append(
                CellRow(
                    name,
                    mode,
                    int(c["tokens_per_step"]),
                    int(c["state_bytes"]),
                    step,
                    statistics.median(xs),
                    lo,
                    hi,
                    cov,
                    len(xs),
                    predict(platform, c["state_bytes"], step, mode),
                    statistics.median(cpu),
                    clo,
                    chi,
                )
            )
    return rows


def table_lines(data: Mapping[str, Any], rows: list[CellRow]) -> list[str]:
    r = data["rates"]
    out = [
        f"Parts alone (thread CPU, one thread, {data['parts'][0]['bytes'] >> 20} MiB, before and after the cells): "
        f"copy {r['copy_gbps']:.2f} GB/s, CRC-32 ({data['parts'][0]['crc']}) {r['checksum_gbps']:.2f} GB/s, "
        f"push send {r['push_send_gbps']:.2f} GB/s and receive {r['push_recv_gbps']:.2f} GB/s "
        f"({r['push_gbps']:.2f} GB/s per side; the model charges both sides, one host). Overlap 0: every core "
        "trains.",
        "",
        "| cell | tokens per step | state per rank (MB) | step, off: CPU s (the model's step) | mode | measured tax: step time, median "
        "[interval] (n, coverage) | CPU per step, median [interval] | model | inside: step time / CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        mode = "snapshots, no push" if x.mode == "snap" else "+ push every step (confirmed)"
        out.append(
            f"| {x.cell} | {x.tokens} | {x.state_bytes / 1e6:.1f} | {x.off_step_s:.3f} | {mode} | "
            f"{x.median * 100:+.1f}% [{x.lo * 100:+.1f}, {x.hi * 100:+.1f}] (n={x.n}, {x.coverage:.1%}) | "
            f"{x.cpu_median * 100:+.1f}% [{x.cpu_lo * 100:+.1f}, {x.cpu_hi * 100:+.1f}] | "
            f"{x.predicted * 100:+.1f}% | {'yes' if x.inside else 'NO'} / {'yes' if x.inside_cpu else 'NO'} |"
        )
    return out
