"""A long-lived control TCPStore server, run inside a job's bridge namespace.

    ip netns exec <prefix>-br python -m harness.faults.store_server --host 10.x.y.254 --port 0 --tag <prefix>

It prints ``READY <host> <port>`` on stdout once it listens, then serves until its stdin reaches EOF (the
owner closed the pipe or died: no orphan outlives the topology) or it gets SIGTERM/SIGINT. While it
serves, each stdin line ``SET <key> <hex value>`` sets that key: the parent, in the root namespace,
writes death notices (accelpact.detection.liveness) this way without a route into the bridge namespace. It sits on the
control link only, which the data-plane faults never touch, so it keeps answering during an outage.
``--tag`` is unused by the server; it makes the process findable by its job prefix.
``start_in_namespace`` starts it that way and waits for its READY line (``NetnsTopology`` uses it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

from harness.faults.netns_host import TAG_ENV, NetnsError


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
                    store.set(parts[1].decode(), bytes.fromhex(parts[2].decode()))  # type: ignore[arg-type]  # bytes: fine
                except ValueError as exc:  # a malformed line must not take the job's store down
                    print(f"store_server: ignored a bad SET line: {exc}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
    del store
    return 0


def start_in_namespace(
    netns: str, host: str, tag: str, python: str = sys.executable, timeout_s: float = 60.0
) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    """Start this server inside ``netns`` listening on ``host`` (port chosen by the kernel); return the
    process (close its stdin to stop it) and the (host, port) it printed. NetnsError if it is not ready
    within ``timeout_s``."""
    return _start(["ip", "netns", "exec", netns], host, tag, python, timeout_s, NetnsError, f" in namespace {netns}")


def start_here(
    host: str, tag: str, python: str = sys.executable, timeout_s: float = 60.0
) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    """Start this server as a child process in this namespace (a store the parent can kill:
    ``fault=control_store_loss``); like :func:`start_in_namespace`, RuntimeError if not ready in time."""
    return _start([], host, tag, python, timeout_s, RuntimeError, "")


def _start(
    prefix: list[str], host: str, tag: str, python: str, timeout_s: float, error: type[Exception], where: str
) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    argv = [python, "-m", "harness.faults.store_server", "--host", host, "--port", "0", "--tag", tag]
    # The server imports this package: make it importable whatever the launcher's cwd is.
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, **({TAG_ENV: tag} if prefix else {})}  # the tag finds netns leftovers
    server = subprocess.Popen(
        [*prefix, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    # A reader thread keeps the deadline honest even if the server never prints.
    result: Future[str] = Future()

    def read_ready() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            if line.startswith("READY "):
                result.set_result(line)
                return
        result.set_result("")

    threading.Thread(target=read_ready, daemon=True, name=f"{tag}-store-ready").start()
    try:
        line = result.result(timeout=timeout_s)
    except TimeoutError:
        line = ""
    if not line:
        err = server.stderr.read()[-2000:] if server.poll() is not None and server.stderr is not None else ""
        raise error(f"control store server did not start{where} within {timeout_s} s{': ' + err if err else ''}")
    _, addr, port = line.split()
    return server, (addr, int(port))


if __name__ == "__main__":
    sys.exit(main())
