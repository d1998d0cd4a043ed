"""Final-state identity: hashes of every parameter and optimizer-state shard, per rank and combined.

At the end of a run every rank hashes its local shards (``param/<name>``, ``optim/<name>/<key>``),
the ranks exchange those hashes (all_gather_object), and each computes the same full-state hash
from all of them. ``ranks_agree`` records that every rank derived the same full-state hash and the
same committed step count. Each rank writes ``<run_dir>/identity/rank<R>.json``.

``compare_runs(reference, run)`` (CLI: ``python -m harness.identity REF_RUN RUN``) checks a run's
final state bit for bit against a fault-free reference run with the same seed, step count and world
size, naming every tensor shard that differs. This is the stronger check: ranks agreeing with each
other does not catch a divergence all ranks share (docs/design.md, "Two silent-divergence traps").

Common ground: the ranks hash and write (torch only inside those functions), the parent's results row
and the reports read and compare; so it lives below both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IDENTITY_DIR = "identity"


def tensor_digest(t: Any) -> str:
    """sha256 of a tensor's dtype, shape and raw bytes (DTensors: the local shard)."""
    import torch  # lazy: torch

    local = t.to_local() if hasattr(t, "to_local") else t
    local = local.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{local.dtype}:{tuple(local.shape)}:".encode())
    if local.numel():
        h.update(local.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def shard_hashes(model: Any, optimizer: Any) -> dict[str, str]:
    """This rank's shard hashes, keyed ``param/<name>`` and ``optim/<name>/<state key>``."""
    out: dict[str, str] = {}
    names = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = tensor_digest(p)
        names[id(p)] = name
    for p, state in optimizer.state.items():
        name = names.get(id(p), f"<unnamed:{id(p)}>")
        for key, value in sorted(state.items()):
            if hasattr(value, "shape"):
                out[f"optim/{name}/{key}"] = tensor_digest(value)
            else:
                out[f"optim/{name}/{key}"] = hashlib.sha256(repr(value).encode()).hexdigest()
    return out


def full_state_hash(per_rank: Sequence[dict[str, str]]) -> str:
    """One hash over every rank's shard hashes, in rank order then key order."""
    h = hashlib.sha256()
    for rank, shards in enumerate(per_rank):
        for key in sorted(shards):
            h.update(f"{rank}\t{key}\t{shards[key]}\n".encode())
    return h.hexdigest()


def compute_identity(model: Any, optimizer: Any, steps_committed: int) -> dict[str, Any]:
    """Collective: every rank must call it. Returns this rank's identity record."""
    import torch.distributed as dist  # lazy: torch

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = shard_hashes(model, optimizer)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    state_hash = full_state_hash(gathered)
    views: list[Any] = [None] * world
    dist.all_gather_object(views, (state_hash, steps_committed))
    return {
        "rank": rank,
        "world_size": world,
        "steps_committed": steps_committed,
        "shards": mine,
        "state_hash": state_hash,
        "ranks_agree": all(v == views[0] for v in views),
    }


def write_identity(run_dir: str | Path, record: dict[str, Any]) -> Path:
    path = Path(run_dir) / IDENTITY_DIR / f"rank{record['rank']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def load_identity(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every rank's identity record of a run, in rank order ([] when the run wrote none)."""
    records = [json.loads(p.read_text()) for p in (Path(run_dir) / IDENTITY_DIR).glob("rank*.json")]
    return sorted(records, key=lambda r: r["rank"])


def summarize(run_dir: str | Path) -> dict[str, Any]:
    """state_hash and ranks_agree of a run as the parent sees it (None when ranks wrote nothing)."""
    records = load_identity(run_dir)
    if not records:
        return {"state_hash": None, "ranks_agree": None}
    hashes = {r["state_hash"] for r in records}
    complete = len(records) == records[0]["world_size"]
    agree = complete and len(hashes) == 1 and all(r["ranks_agree"] for r in records)
    return {"state_hash": records[0]["state_hash"] if len(hashes) == 1 else None, "ranks_agree": agree}


@dataclass
class IdentityComparison:
    equal: bool
    reference_hash: str | None
    run_hash: str | None
    differing: list[str] = field(default_factory=list)  # "rank<R>:<shard key>"
    problems: list[str] = field(default_factory=list)

    def describe(self, limit: int = 20) -> str:
        if self.equal:
            return f"identical: state hash {self.run_hash}"
        lines = [f"DIFFERENT: reference {self.reference_hash} vs run {self.run_hash}"]
        lines += self.problems
        if self.differing:
            lines.append(f"{len(self.differing)} shard(s) differ:")
            lines += [f"  {d}" for d in self.differing[:limit]]
            if len(self.differing) > limit:
                lines.append(f"  ... and {len(self.differing) - limit} more")
        return "\n".join(lines)


def compare_runs(reference_dir: str | Path, run_dir: str | Path) -> IdentityComparison:
    """Bit-for-bit comparison of two runs' final states, naming each differing shard."""
    ref, run = load_identity(reference_dir), load_identity(run_dir)
    problems: list[str] = []
    if not ref:
        problems.append(f"reference {reference_dir} has no identity records (did it finish?)")
    if not run:
        problems.append(f"run {run_dir} has no identity records (did it finish?)")
    if problems:
        return IdentityComparison(False, None, None, problems=problems)
    if ref[0]["world_size"] != run[0]["world_size"]:
        problems.append(
            f"world sizes differ ({ref[0]['world_size']} vs {run[0]['world_size']}): shards are not comparable"
        )
    if ref[0]["steps_committed"] != run[0]["steps_committed"]:
        problems.append(f"step counts differ ({ref[0]['steps_committed']} vs {run[0]['steps_committed']})")
    differing: list[str] = []
    ref_by_rank = {r["rank"]: r["shards"] for r in ref}
    run_by_rank = {r["rank"]: r["shards"] for r in run}
    for rank in sorted(set(ref_by_rank) | set(run_by_rank)):
        a, b = ref_by_rank.get(rank, {}), run_by_rank.get(rank, {})
        # Parameters first: they are what a reader looks for first in a truncated list.
        for key in sorted(set(a) | set(b), key=lambda k: (not k.startswith("param/"), k)):
            if a.get(key) != b.get(key):
                differing.append(f"rank{rank}:{key}")
    ref_hash, run_hash = summarize(reference_dir)["state_hash"], summarize(run_dir)["state_hash"]
    equal = not problems and not differing and ref_hash is not None and ref_hash == run_hash
    return IdentityComparison(equal, ref_hash, run_hash, differing, problems)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.identity",
        description="Compare a run's final state with a fault-free reference run, bit for bit.",
    )
    parser.add_argument("reference", help="run directory of the fault-free reference run")
    parser.add_argument("run", help="run directory to check")
    args = parser.parse_args(argv)
    result = compare_runs(args.reference, args.run)
    print(result.describe())
    return 0 if result.equal else 1


if __name__ == "__main__":
    sys.exit(main())
