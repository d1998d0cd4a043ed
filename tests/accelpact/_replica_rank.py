"""A rank process for the replica tests: pushes synthetic snapshot slots to its buddy, or fetches one back.

``python -m tests.accelpact._replica_rank CONFIG.json``; the config names the control store, the
rank, the mode (``push`` or ``fetch``) and where to write the result. A synthetic slot is the
contract's layout (payload files, then ``marker.json``) filled with bytes that depend on the rank
and step, so a fetched copy can be compared with what was pushed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from accelpact.control import ControlChannel, ControlConfig
from accelpact.snapshot.replica import Replication, control_bind_address


def payload(rank: int, step: int, nbytes: int) -> bytes:
    seed = hashlib.sha256(f"{rank}/{step}".encode()).digest()
    return (seed * (nbytes // len(seed) + 1))[:nbytes]


def write_slot(slot: Path, token: str, rank: int, world: int, step: int, nbytes: int) -> dict:
    """A synthetic slot in the snapshot format (accelpact.snapshot.slots): the marker of a stale slot is
    removed first, then two payload files, then the marker with their sizes and CRC-32s."""
    from accelpact.snapshot.slots import Marker, combined_checksum, crc32_file, invalidate, write_marker

    slot.mkdir(parents=True, exist_ok=True)
    invalidate(slot)
    (slot / "shard.bin").write_bytes(payload(rank, step, nbytes))
    (slot / "extra.json").write_text(json.dumps({"step": step, "rank": rank}))
    files = {}
    for name in ("shard.bin", "extra.json"):
        n, crc = crc32_file(slot / name)
        files[name] = {"nbytes": n, "crc32": crc}
    marker = Marker(
        job_token=token,
        rank=rank,
        world_size=world,
        step=step,
        generation=0,
        nbytes=sum(f["nbytes"] for f in files.values()),
        checksum=combined_checksum(files),
        files=files,
    )
    write_marker(slot, marker)
    return marker.to_dict()


def digest_dir(slot: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(slot.iterdir()) if p.is_file()}


def main(path: str) -> int:
    cfg = json.loads(Path(path).read_text())
    rank, world, token = cfg["rank"], cfg["world_size"], cfg["token"]
    host = cfg.get("host", "127.0.0.1")
    chan = ControlChannel.connect(
        ControlConfig(host=host, port=cfg["port"], rank=rank, world_size=world, job_token=token, deadline_s=60)
    )
    rep = Replication(
        chan,
        rank=rank,
        world_size=world,
        root=cfg["root"],
        bind_host=control_bind_address(host),
        topology=cfg.get("topology"),
    )
    out: dict = {"rank": rank, "buddy": rep.buddy}
    if cfg["mode"] == "push":
        own = Path(cfg["root"]) / token / f"rank{rank}"
        for i, step in enumerate(cfg["steps"]):
            slot = own / f"slot{i % 2}"
            write_slot(slot, token, rank, world, step, cfg["nbytes"])
            rep.push(slot, json.loads((slot / "marker.json").read_text()))
            rep.flush(120)  # one push per step, as when a step outlasts the copy
        out["stats"] = rep.stats()
        Path(cfg["out"]).write_text(json.dumps(out))
        chan.get(chan.key("test", "done"), deadline_s=cfg.get("serve_s", 120))  # keep serving until told
    else:
        dest = Path(cfg["dest"])
        marker = rep.fetch(cfg["src"], dest, cfg.get("step"))
        out.update(marker=marker, error=rep.last_error, files=digest_dir(dest) if marker else None)
        Path(cfg["out"]).write_text(json.dumps(out))
    rep.close()
    chan.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
