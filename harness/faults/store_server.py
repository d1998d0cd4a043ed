"""A long-lived control TCPStore server, run inside a job's bridge namespace.

    ip netns exec <prefix>-br python -m harness.faults.store_server --host 10.x.y.254 --port 0 --tag <prefix>

It prints ``READY <host> <port>`` on stdout once it listens, then serves until its stdin reaches EOF (the
owner closed the pipe or died: no orphan outlives the topology) or it gets SIGTERM/SIGINT. While it
serves, each stdin line ``SET <key> <hex value>`` sets that key: the parent, in the root namespace,
writes death notices (accelpact.liveness) this way without a route into the bridge namespace. It sits on the
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
        for line in sys.stdin.buffer:  # blocks; the loop ends at EOF
            parts = line.split()
            if len(parts) == 3 and parts[0] == b"SET":
                try:
                    store.set(parts[1].decode(), bytes.fromhex(parts[2].decode()))
                except ValueError as exc:  # a malformed line must not take the job's store down
                    print(f"store_server: ignored a bad SET line: {exc}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
