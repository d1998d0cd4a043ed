"""What the stall watchdog's looks cost a rank while a step runs: CPU seconds per second of its thread (not a test).

The watchdog looks every ``tick_s`` (50 ms) while a guarded attempt runs. Gathering the evidence of a stall
(a /proc scan of the process's sockets and their send queues, a store read of every peer's heartbeat) is
needed only in the last ``lookback_s`` before the stall threshold; before that the look is one store check
(has a peer posted at the next generation?). This compares the two, alternated in blocks on one real
TCPStore, with the process holding ``--fds`` extra open files (a torch rank has 80-200) and ``--peers``
peers: "lookback" (the watchdog as built) against "every tick" (the evidence gathered at every look, as
before). CPU time is the process's, measured while the main thread sleeps, so host load barely moves it.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_watchdog_cost.py --blocks 6 --block-s 3
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--block-s", type=float, default=3.0)
    ap.add_argument("--fds", type=int, default=120)
    ap.add_argument("--peers", type=int, default=3)
    args = ap.parse_args()
    import torch.distributed as dist

    from accelpact.detection import watchdog as wd
    from accelpact.detection.liveness import LivenessConfig, heartbeat_key

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=30))
    for r in range(1, args.peers + 1):
        store.set(heartbeat_key("tok", r), b"1 2 3")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(args.fds)]
    dog = wd.StallWatchdog(
        "127.0.0.1",
        port,
        "tok",
        0,
        args.peers + 1,
        stall_timeout_s=10.0,
        liveness=LivenessConfig(0.5, 4),
        abort=lambda: None,
        inodes=lambda: {1, 2, 3},
    )
    dog._steps.extend([0.2] * 8)  # a step history: the watchdog is past its warm-up
    built = dog.lookback_s
    dog.start()
    cpu: dict[str, list[float]] = {"lookback": [], "every tick": []}
    for block in range(2 * args.blocks):
        name = ("lookback", "every tick")[(block + block // 2) % 2]
        dog.lookback_s = built if name == "lookback" else (lambda: float("inf"))  # type: ignore[method-assign]
        # Restart the attempt well inside the threshold every second, as steps of 1 s would.
        c0, t_end = time.process_time(), time.monotonic() + args.block_s
        while time.monotonic() < t_end:
            dog.begin_attempt(0)
            time.sleep(min(1.0, max(0.0, t_end - time.monotonic())))
            dog.end_attempt(completed=False)
        cpu[name].append((time.process_time() - c0) / args.block_s)
    dog.stop(wait_s=1.0)
    for fd in held:
        os.close(fd)
    print(
        f"stall watchdog, one rank's thread while attempts run ({len(os.listdir('/proc/self/fd'))} fds now, "
        f"{args.peers} peers, {args.blocks} blocks of {args.block_s:.0f} s each, alternated; load "
        f"{os.getloadavg()[0]:.1f}): CPU seconds per second, median over blocks"
    )
    for name, vals in cpu.items():
        print(
            f"  {name:10s} {statistics.median(vals) * 100:.2f}% of a core  (blocks: "
            + ", ".join(f"{v * 100:.2f}" for v in vals)
            + ")"
        )


if __name__ == "__main__":
    main()
