"""Buddy-replica transfer speed, side by side: zero-copy ``socket.sendfile`` against read + ``sendall``.

A holder process runs a ``ReplicaServer`` (its own process, as a buddy on another host would be); this
process pushes one synthetic snapshot slot of --mib MiB to it --rounds times with each sender in turn
(interleaved, so load from other processes hits both alike), over loopback TCP. Printed per sender:
the median push time and MB/s of the whole PUT (header, payload, the holder's CRC-32 check of what it
received, the rename into place, the ack), and the ratio of the two. Then, side by side the same way,
the holder's check on receipt: the full CRC-32 pass over every received replica (a second holder, as
before) against marker + sizes only (the default: the CRC-32s are checked when a replica is served,
and again by the loader). Then the end-to-end push of ``Replication`` (what training uses: sendfile)
and a GET back.

    .venv/bin/python benchmarks/bench_replica.py --mib 256 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
from accelpact.snapshot import _replica_wire as wire
from accelpact.snapshot.replica import Replication

HOLDER = """
import sys, time
from accelpact.control import ControlChannel, ControlConfig
from accelpact.snapshot.replica import Replication
from accelpact.snapshot.replica import check_replica
port, token, root, rank = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
chan = ControlChannel.connect(ControlConfig(host="127.0.0.1", port=port, rank=rank, world_size=3, job_token=token))
# rank 2 checks every received replica's CRC-32s (the former default); rank 1 marker and sizes only
crc = {"receive_check": check_replica(token, 3)} if rank == 2 else {}
rep = Replication(chan, rank=rank, world_size=3, root=root, bind_host="127.0.0.1", **crc)
chan.get(chan.key("bench", "done"), deadline_s=3600)
rep.close(remove=True)
"""


def _sendall_files(sock: socket.socket, slot: Path, files) -> None:
    """The copying sender: read each file into user space, then sendall."""
    for name, _size in files:
        with open(slot / name, "rb") as f:
            while True:
                chunk = f.read(8 << 20)
                if not chunk:
                    break
                sock.sendall(chunk)


def put(rep: Replication, slot: Path, marker: dict, sender, holder: int = 1) -> float:
    files = wire.payload_files(slot)
    t0 = time.perf_counter()
    with socket.create_connection(rep.addresses.resolve(holder), timeout=60) as sock:
        wire.send_frame(
            sock,
            {"op": "put", "src": 0, "step": marker["step"], "files": [list(f) for f in files], "marker": marker},
            rep.job_token,
        )
        sender(sock, slot, files)
        wire.send_frame(sock, {"commit": True}, rep.job_token)
        ack = wire.recv_frame(sock, rep.job_token)
    if not ack.get("ok"):
        raise RuntimeError(f"holder refused: {ack}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from tests.accelpact._replica_rank import write_slot  # a synthetic slot in the real snapshot format

    server, port = start_control_server()
    token = new_job_token()
    with tempfile.TemporaryDirectory(
        prefix="bench_replica_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    ) as tmp:
        root = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        holders = [
            subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(port), token, str(root / f"holder{r}"), str(r)], env=env
            )
            for r in (1, 2)
        ]
        chan = ControlChannel.connect(ControlConfig(host="127.0.0.1", port=port, rank=0, world_size=3, job_token=token))
        rep = Replication(chan, rank=0, world_size=3, root=root / "src", bind_host="127.0.0.1")
        try:
            for r in (1, 2):
                chan.get(chan.key("replica", "addr", str(r)), deadline_s=120)  # the holders are up and published
            slot = root / "src" / token / "rank0" / "slot0"
            marker = write_slot(slot, token, 0, 3, 1, args.mib << 20)
            nbytes = sum(size for _, size in wire.payload_files(slot))
            times: dict[str, list[float]] = {"sendfile": [], "sendall": []}
            for _ in range(args.rounds):
                times["sendfile"].append(put(rep, slot, marker, wire.send_files))
                times["sendall"].append(put(rep, slot, marker, _sendall_files))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"one slot of {nbytes / 2**20:.0f} MiB, {args.rounds} rounds each, interleaved; load "
                f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
            )
            for k, v in med.items():
                print(f"  {k:9s} median {v * 1000:8.1f} ms  {nbytes / v / 1e6:8.0f} MB/s")
            print(f"  sendall / sendfile time: {med['sendall'] / med['sendfile']:.2f}x")
            check: dict[str, list[float]] = {"crc on receipt": [], "sizes on receipt": []}
            for _ in range(args.rounds):
                check["crc on receipt"].append(put(rep, slot, marker, wire.send_files, holder=2))
                check["sizes on receipt"].append(put(rep, slot, marker, wire.send_files, holder=1))
            cmed = {k: statistics.median(v) for k, v in check.items()}
            print(f"holder's check on receipt, sendfile, {args.rounds} rounds each, interleaved:")
            for k, v in cmed.items():
                print(f"  {k:16s} median {v * 1000:8.1f} ms  {nbytes / v / 1e6:8.0f} MB/s")
            print(f"  sizes / crc time: {cmed['sizes on receipt'] / cmed['crc on receipt']:.2f}x")
            rep.push(slot, marker)
            rep.flush(600)
            got = rep.fetch(0, root / "back")
            print(f"Replication.push: {rep.stats()['push_mb_s']:.0f} MB/s; fetch back: step {got and got['step']}")
        finally:
            chan.set(chan.key("bench", "done"), b"1")
            rep.close()
            for h in holders:
                h.wait(60)
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
