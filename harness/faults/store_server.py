"""A long-lived control TCPStore server, run inside a job's bridge namespace.

    ip netns exec <prefix>-br python -m harness.faults.store_server --host 10.x.y.254 --port 0 --tag <prefix>

It prints ``READY <host> <port>`` on stdout once it listens, then serves until its stdin reaches EOF (the
owner closed the pipe or died: no orphan outlives the topology) or it gets SIGTERM/SIGINT. It sits on the
control link only, which the data-plane faults never touch, so it keeps answering during an outage.
``--tag`` is unused by the server; it makes the process findable by its job prefix.
"""

from __future__ import annotations

import argparse
import datetime
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port; the chosen one is printed")
    parser.add_argument("--tag", default="", help="job prefix, so leftovers can be found")
    args = parser.parse_args(argv)

    import torch.distributed as dist  # late: --help must not pay for torch

    store = dist.TCPStore(
        args.host,
        args.port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    print(f"READY {args.host} {store.port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while sys.stdin.buffer.read(4096):  # blocks; returns b"" at EOF
            pass
    except KeyboardInterrupt:
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
