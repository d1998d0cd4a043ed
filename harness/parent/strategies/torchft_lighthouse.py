"""torchft's Lighthouse as the harness parent runs it: one process per job, started before the ranks.

``python -m harness.parent.strategies.torchft_lighthouse --bind HOST:0 ...`` runs the same Rust server that
torchft's ``torchft_lighthouse`` console script runs (``torchft._torchft.LighthouseServer``), with the
same flags, and prints one JSON line with the address it bound, so the parent can pass a kernel-chosen
port to the ranks (the console script only logs it). It dies with the parent (PR_SET_PDEATHSIG), so a
killed parent leaves no Lighthouse behind, and it exits on SIGTERM / SIGINT / SIGHUP.

Where it runs is ``harness.server_home``'s decision, as for NVRx's store: in the parent's network
namespace on ``cluster.master_addr`` when the ranks run there, else in the topology's bridge namespace on
the control network's bridge address (``netns=``), which every host reaches over its never-faulted
control link; a lost host's ranks lose only their own connections to it.

``Lighthouse`` is the parent's handle: start, address, log file, close.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from harness.server_home import ServerHome

READY_TIMEOUT_S = 60.0


class Lighthouse:
    """A Lighthouse process of one run; ``address`` is its ``http://host:port``."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, log_path: Path) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1].split("/")[0])

    @classmethod
    def start(
        cls,
        log_path: Path,
        host: str,
        min_replicas: int,
        join_timeout_ms: int,
        quorum_tick_ms: int,
        heartbeat_timeout_ms: int,
        python: str = sys.executable,
        netns: str | None = None,
    ) -> Lighthouse:
        """The Lighthouse listening on ``host`` (port chosen by the kernel), in network namespace ``netns``
        (None: the parent's)."""
        argv = [
            python,
            "-m",
            "harness.parent.strategies.torchft_lighthouse",
            "--bind",
            f"{host}:0",
            "--min_replicas",
            str(min_replicas),
            "--join_timeout_ms",
            str(join_timeout_ms),
            "--quorum_tick_ms",
            str(quorum_tick_ms),
            "--heartbeat_timeout_ms",
            str(heartbeat_timeout_ms),
            "--parent_pid",
            str(os.getpid()),
        ]
        argv = ServerHome(host, netns).command(argv)  # `ip netns exec` execs it: still this process's child
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")}
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
            )
        finally:
            log.close()
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(READY_TIMEOUT_S)
        if not line or not line[0].strip():
            proc.kill()
            proc.wait()
            raise RuntimeError(
                f"the torchft Lighthouse ({ServerHome(host, netns).describe()}) did not start within "
                f"{READY_TIMEOUT_S:.0f} s; see {log_path}"
            )
        bound = json.loads(line[0])["address"]  # "http://<this machine's hostname>:<port>"
        # The ranks dial the host it was bound to: the hostname need not resolve to that interface.
        return cls(proc, f"http://{host}:{bound.rsplit(':', 1)[1]}", log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.parent.strategies.torchft_lighthouse")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--min_replicas", type=int, required=True)
    parser.add_argument("--join_timeout_ms", type=int, default=60000)
    parser.add_argument("--quorum_tick_ms", type=int, default=100)
    parser.add_argument("--heartbeat_timeout_ms", type=int, default=5000)
    parser.add_argument("--parent_pid", type=int, default=0)
    args = parser.parse_args(argv)
    from accelpact.run import die_with_parent  # lazy: torch

    die_with_parent(args.parent_pid)
    from torchft._torchft import LighthouseServer  # lazy: torchft

    server = LighthouseServer(
        bind=args.bind,
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        quorum_tick_ms=args.quorum_tick_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"address": server.address(), "pid": os.getpid(), "t": time.time()}), flush=True)
    while not stop.wait(0.5):
        pass
    # Not server.shutdown(): in torchft 0.2.0 it never returned here (measured: still blocked after 30 s).
    # Ending the process closes the listening socket and every connection just the same.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
