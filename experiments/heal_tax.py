"""The heal's per-step tax at 2 model sizes x 2 tokens-per-step settings, and the parts the cost model needs.

Calibrates ``harness.advise.cost`` (the advisor's cost model of per-step protection) on this host:

1. **Parts, alone.** In this process, on one thread, over a 64 MiB buffer: the snapshot copy (a torch copy
   into a kept shared mapping of a /dev/shm file, as accelpact's writer does), the CRC-32 the snapshot
   seals with (``accelpact.snapshot.checksum``), and a push over loopback TCP with the replica wire's own
   ``send_files`` / ``recv_files`` (the sender's and the receiver's thread CPU). Thread CPU seconds per
   GB, median of the repeats, measured before and after the cells; the rates are the medians of both.
2. **The tax, side by side.** Per cell, ``experiments.process_loss_push_every.cost_trials``: one pair of
   real gloo FSDP2 ranks (each its own simulated host) cycles blocks of steps with snapshots off,
   snapshots without pushes, and snapshots with a confirmed buddy push every step; a trial's tax is a
   block's mean step over the same cycle's "off" block's, minus 1.

Each cell's interval is the order-statistic (sign-test) interval for the median of its trials, printed with
its exact coverage (with n <= 8 trials that is the range, [min, max], coverage 1 - 2^(1-n); n = 7: 98.4%). The model's prediction for a cell uses only the parts' rates (1), the cell's
state bytes and its median "off" step; ``tests/scale/test_heal_tax_calibration.py`` checks that it falls
inside each cell's interval, from the committed file, without running anything.

    python -m experiments.heal_tax --trials 7
    python -m experiments.heal_tax --trials 11 --steps 8 --advised 4x1 2x2   # cadences at the default model
    python -m experiments.heal_tax --trials 15 --steps 8 --advised 4x1 2x1 --budget 0.03   # + the heal's default

``--budget MAX_TAX`` adds the heal as a user gets it by default: every=1, push_every=1 thinned by the runtime's
tax budget (``SnapshotConfig.max_tax``), whose warm-up and agreement run first in unmeasured blocks.

Writes ``results/heal_tax/calibration.md`` and ``calibration.json`` with the command, git sha and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CELLS", "measure_parts", "main"]

_TINY = {"vocab": 4096, "hidden": 256, "inter": 768, "layers": 4, "heads": 8, "kv_heads": 4}
_WIDE = {**_TINY, "hidden": 512, "inter": 1536}
# (name, model fields): 2 widths x 2 tokens per step (seq x batch = 128 or 512 tokens per rank).
CELLS: tuple[tuple[str, dict[str, int]], ...] = (
    ("tiny_t128", {**_TINY, "seq": 64, "batch": 2}),
    ("tiny_t512", {**_TINY, "seq": 256, "batch": 2}),
    ("wide_t128", {**_WIDE, "seq": 64, "batch": 2}),
    ("wide_t512", {**_WIDE, "seq": 256, "batch": 2}),
)
PART_BYTES = 64 << 20


def _cpu(fn: Any) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def measure_parts(nbytes: int = PART_BYTES, repeats: int = 7) -> dict[str, Any]:
    """Thread CPU per GB of the copy, the checksum, and each side of a loopback push (medians of ``repeats``)."""
    import torch

    from accelpact.snapshot._replica_wire import FileMaps, recv_files, send_files
    from accelpact.snapshot.checksum import IMPLEMENTATION, crc32

    shm = Path(tempfile.mkdtemp(prefix="accelpact-heal-tax-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        src = torch.randn(nbytes // 4).view(torch.uint8)
        path = shm / "slot.bin"
        with open(path, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, nbytes)
        dst = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        dst.copy_(src)  # first touch of the mapping, not timed (the writer keeps its mappings across steps)
        arr = dst.numpy()
        copy = [_cpu(lambda: dst.copy_(src)) for _ in range(repeats)]  # noqa: F821 - run before the del below
        crc = [_cpu(lambda: crc32(arr)) for _ in range(repeats)]  # noqa: F821 - ditto

        # A push: the wire's own sendfile out of the slot file, recv_into a kept mapping on the other side.
        dest = shm / "replica"
        dest.mkdir()
        maps = FileMaps()
        files = [("slot.bin", nbytes)]
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        recv_cpu: list[float] = []

        def receiver() -> None:
            conn, _ = srv.accept()
            with conn:
                for _ in range(repeats + 1):
                    recv_cpu.append(_cpu(lambda: recv_files(conn, dest, files, maps)))
                    conn.sendall(b"k")

        t = threading.Thread(target=receiver, daemon=True)
        t.start()
        send_cpu = []
        with socket.create_connection(srv.getsockname()) as sock:
            for _ in range(repeats + 1):
                send_cpu.append(_cpu(lambda: send_files(sock, shm, files)))
                sock.recv(1)
        t.join(60)
        srv.close()
        del dst, arr
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    gb = nbytes / 1e9
    return {
        "bytes": nbytes,
        "crc": IMPLEMENTATION,
        "copy_gbps": gb / statistics.median(copy),
        "checksum_gbps": gb / statistics.median(crc),
        "push_send_gbps": gb / statistics.median(send_cpu[1:]),
        "push_recv_gbps": gb / statistics.median(recv_cpu[1:]),
        "raw_s": {"copy": copy, "checksum": crc, "send": send_cpu[1:], "recv": recv_cpu[1:]},
    }


def combine_parts(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The rates the model uses: medians over the part measurements; a push costs both sides, so its rate per
    side is 2 / (1/send + 1/recv)."""
    med = {
        k: statistics.median(r[k] for r in runs)
        for k in ("copy_gbps", "checksum_gbps", "push_send_gbps", "push_recv_gbps")
    }
    med["push_gbps"] = 2.0 / (1.0 / med["push_send_gbps"] + 1.0 / med["push_recv_gbps"])
    return med


def advised(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``--advised``: the default model (tiny at 128 tokens) with snapshots off, snapshots alone, a snapshot and
    a push every step, each given cadence and, with ``--budget``, the heal's default (the runtime's tax budget),
    interleaved; writes ``advised.md`` / ``advised.json``."""
    from experiments.process_loss_push_every import cost_trials
    from experiments.provenance import collect, current_command, provenance_markdown
    from harness.advise.calibration import load, order_interval, platform_from
    from harness.advise.cost import Cadence, tax

    cadences = [tuple(int(x) for x in c.split("x")) for c in args.advised]
    if any(len(c) != 2 or min(c) < 1 for c in cadences) or any(args.steps % (e * k) for e, k in cadences):
        raise SystemExit(
            f"--advised {args.advised}: give EVERYxPUSH_EVERY pairs (e.g. 4x1 2x2) whose products "
            f"divide --steps {args.steps}"
        )
    name, model = CELLS[0]
    prov = collect(
        current_command(argv, "experiments.heal_tax"),
        {
            "trials": args.trials,
            "steps_per_block": args.steps,
            "cell": name,
            "cadences": cadences,
            "confirm_push": True,
            "budget": args.budget,
        },
    )
    # The model's rates come from the calibration beside the results: read them before minutes of runs.
    platform = platform_from(load(args.results / "calibration.json"))
    t0, loads = time.monotonic(), [os.getloadavg()[0]]
    scratch = Path(tempfile.mkdtemp(prefix="accelpact-heal-tax-"))
    try:
        cost = cost_trials(
            scratch / name, [1], args.steps, args.trials, model=model, cadences=cadences, budget=args.budget
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    loads.append(os.getloadavg()[0])
    step = statistics.median(cost["off_cpu_s"])
    modes: dict[str, tuple[int, int] | None] = {
        "snap": None,
        "k1": (1, 1),
        **{f"e{e}k{k}": (e, k) for e, k in cadences},
    }
    chosen = cost.get("budget") or {}
    if args.budget:
        modes["budget"] = (int(chosen["every"]), int(chosen["push_every"])) if chosen else (1, 1)
    lines = [
        "# The heal's per-step tax at the advisor's cadences, side by side",
        "",
        f"Default model ({name}: mistral_tiny-shaped, 4 layers, hidden 256, seq 64 x batch 2, "
        f"{cost['state_bytes'] / 1e6:.1f} MB of state per rank) on 2 gloo FSDP2 ranks, {args.trials} trials; "
        f"blocks of {args.steps} steps cycled through every configuration; a trial's tax is a block's mean "
        "step (or rank 0's CPU per step) over the same cycle's \"off\" block's, minus 1. Intervals: "
        "order-statistic interval for the median with its exact coverage. Model: harness.advise.cost with the "
        f"rates of results/heal_tax/calibration.json, step {step:.3f} s (CPU, off).",
        "",
        "| configuration | step time, median [interval] (coverage) | CPU per step, median [interval] | model |",
        "|---|---|---|---|",
    ]
    for mode, cad in modes.items():
        c = cost["configs"][mode]
        lo, hi, cov = order_interval(c["overhead"])
        clo, chi, _ = order_interval(c["cpu_overhead"])
        what = (
            "snapshots every step, no push"
            if cad is None
            else "every=1, push_every=1 (no budget)"
            if mode == "k1"
            else f"heal default: max_tax={args.budget:g}, which chose every={cad[0]}, push_every={cad[1]}"
            + ("" if chosen else " (no decision: the warm-up cadence)")
            if mode == "budget"
            else f"every={cad[0]}, push_every={cad[1]}"
        )
        pred = tax(
            platform if cad else platform.with_(push_gbps=1e12),
            cost["state_bytes"],
            step,
            Cadence(*(cad or (1, 1)), True),
        ).fraction
        lines.append(
            f"| {what} | {statistics.median(c['overhead']) * 100:+.1f}% [{lo * 100:+.1f}, {hi * 100:+.1f}] "
            f"({cov:.1%}) | {statistics.median(c['cpu_overhead']) * 100:+.1f}% [{clo * 100:+.1f}, "
            f"{chi * 100:+.1f}] | {pred * 100:+.1f}% |"
        )
    lines += [
        "",
        f"Load average before / after: {loads[0]:.1f} / {loads[1]:.1f}. Run time "
        f"{(time.monotonic() - t0) / 60:.1f} min.",
        "",
        provenance_markdown(prov),
    ]
    (args.results / "advised.json").write_text(
        json.dumps({"provenance": prov.to_dict(), "cost": cost, "loads": loads}, indent=1, default=str)
    )
    (args.results / "advised.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from experiments.process_loss_push_every import cost_trials
    from experiments.provenance import REPO_ROOT, collect, current_command

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=7, help="interleaved off/snapshot/push cycles per cell (>= 5)")
    ap.add_argument("--steps", type=int, default=8, help="steps per block")
    ap.add_argument("--cells", nargs="+", default=[c for c, _ in CELLS], choices=[c for c, _ in CELLS])
    ap.add_argument("--results", type=Path, default=REPO_ROOT / "results" / "heal_tax")
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite calibration.md from the committed calibration.json (runs nothing)",
    )
    ap.add_argument(
        "--advised",
        nargs="+",
        metavar="EVERYxPUSH_EVERY",
        help="measure these cadences (e.g. 4x1 2x2) beside the heal's default at the default model",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MAX_TAX",
        help="with --advised: measure the tax budget too (the heal's default, strategy.snapshot.max_tax=0.03)",
    )
    args = ap.parse_args(argv)
    if args.advised:
        return advised(args, argv)
    if args.render_only:
        print(write_report(json.loads((args.results / "calibration.json").read_text()), args.results))
        return 0
    if args.trials < 2 or args.steps < 1:
        ap.error(f"--trials {args.trials} must be at least 2 (5 or more for the committed run) and --steps >= 1")
    prov = collect(
        current_command(argv, "experiments.heal_tax"),
        {"trials": args.trials, "steps_per_block": args.steps, "cells": args.cells, "confirm_push": True},
    )
    t0 = time.monotonic()
    parts = [measure_parts()]
    print(f"parts before: { ({k: round(v, 2) for k, v in parts[0].items() if k.endswith('gbps')}) }", flush=True)
    cells: dict[str, Any] = {}
    loads = [os.getloadavg()[0]]
    scratch = Path(tempfile.mkdtemp(prefix="accelpact-heal-tax-"))
    try:
        for name, model in CELLS:
            if name not in args.cells:
                continue
            cost = cost_trials(scratch / name, [1], args.steps, args.trials, model=model)
            loads.append(os.getloadavg()[0])
            cells[name] = {
                "model": model,
                "tokens_per_step": model["seq"] * model["batch"],
                "state_bytes": cost["state_bytes"],
                "off_step_s": cost["off_step_s"],
                "off_cpu_s": cost["off_cpu_s"],
                "overhead": {"snap": cost["configs"]["snap"]["overhead"], "push": cost["configs"]["k1"]["overhead"]},
                "cpu_overhead": {
                    "snap": cost["configs"]["snap"]["cpu_overhead"],
                    "push": cost["configs"]["k1"]["cpu_overhead"],
                },
                "blocked_max_s": {
                    "snap": cost["configs"]["snap"]["blocked_max_s"],
                    "push": cost["configs"]["k1"]["blocked_max_s"],
                },
                "wall_s": cost["wall_s"],
            }
            print(
                f"{name}: {cost['wall_s']:.0f} s; off {statistics.median(cost['off_step_s']):.3f} s; "
                f"snap {[round(x * 100, 1) for x in cells[name]['overhead']['snap']]}; "
                f"push {[round(x * 100, 1) for x in cells[name]['overhead']['push']]}",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    parts.append(measure_parts())
    data = {
        "provenance": prov.to_dict(),
        "parts": parts,
        "rates": combine_parts(parts),
        "cells": cells,
        "loads": loads,
        "runtime_s": time.monotonic() - t0,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "calibration.json").write_text(json.dumps(data, indent=1, default=str))
    (args.results / "provenance.json").write_text(json.dumps(prov.to_dict(), indent=1, default=str))
    print(write_report(data, args.results))
    return 0


def write_report(data: dict[str, Any], results: Path) -> str:
    """``calibration.md`` from the measurement (also ``--render-only``: from the committed json)."""
    from experiments.provenance import Provenance, provenance_markdown
    from harness.advise.calibration import cell_rows, table_lines

    prov = Provenance.from_dict(data["provenance"])
    extra = prov.extra
    rows = cell_rows(data)
    loads = data["loads"]
    lines = [
        "# The heal's per-step tax: measured side by side, and the cost model's prediction",
        "",
        f"2 gloo FSDP2 ranks (each its own simulated host) on this 2-core host, {extra['trials']} trials per cell; "
        f"blocks of {extra['steps_per_block']} steps cycled: snapshots off / snapshots, no push / snapshots + a "
        "confirmed buddy push every step. A trial's tax is its block's mean step over the same cycle's \"off\" block's, "
        f"minus 1. Interval: the order-statistic interval for the median, with its exact coverage (the range when n <= 8). "
        "CPU: the same ratio for rank 0's process CPU seconds per step (every thread).",
        "",
        *table_lines(data, rows),
        "",
        f"Interval widths: step time {min(r.hi - r.lo for r in rows) * 100:.0f}-"
        f"{max(r.hi - r.lo for r in rows) * 100:.0f} points, CPU per step "
        f"{min(r.cpu_hi - r.cpu_lo for r in rows) * 100:.0f}-{max(r.cpu_hi - r.cpu_lo for r in rows) * 100:.0f} "
        f"points. The model is inside {sum(r.inside for r in rows)} of {len(rows)} step-time intervals and "
        f"{sum(r.inside_cpu for r in rows)} of {len(rows)} CPU intervals.",
        "",
        f"1-min load average before and after each cell: {', '.join(f'{x:.1f}' for x in loads)}. "
        f"Run time {data['runtime_s'] / 60:.1f} min.",
        "",
        provenance_markdown(prov),
    ]
    (results / "calibration.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
