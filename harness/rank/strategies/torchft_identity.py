"""Final-state identity of a torchft replica group, in the layout of the fault-free reference.

The reference (``strategy=none``) shards every tensor with FSDP2 over its mesh: the whole world, or under
HSDP (``cluster.replicate``) the ranks of one replica; its identity records hold each rank's shard hashes
(``harness.identity``). A torchft replica group holds a full replica (sharded over the group's own
ranks only), so with another cut its shards are not those of the reference. To make the bit-for-bit
comparison meaningful, each rank gathers the group's full tensors and hashes them cut the way FSDP2 cuts
them on the reference's mesh (``torch.chunk`` on dim 0 over its shard dimension, missing chunks empty),
then writes the record of its global rank. The values compared are the same bits; only the cut is the
reference's.
"""

from __future__ import annotations

import hashlib
from typing import Any

from harness.identity import full_state_hash, tensor_digest


def world_chunks(full: Any, world: int) -> list[Any]:
    """``full`` cut as FSDP2's Shard(0) cuts it over ``world`` ranks (its ``_chunk_with_empty``)."""
    import torch  # lazy: torch

    chunks = list(torch.chunk(full, world, dim=0))
    while len(chunks) < world:
        chunks.append(full.new_empty((0, *full.shape[1:])))
    return chunks


def _full(t: Any) -> Any:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def replica_identity(model: Any, optimizer: Any, steps_committed: int, rank: int, reference: Any) -> dict[str, Any]:
    """Collective over the replica group's default process group. The record of global rank ``rank``, cut as
    the reference's mesh ``reference`` (a ``harness.rank.mesh.MeshLayout``) cuts it."""
    import torch.distributed as dist  # lazy: torch

    world = reference.replicate * reference.shard
    per_rank: list[dict[str, str]] = [{} for _ in range(world)]

    def add(key: str, value: Any) -> None:
        if hasattr(value, "full_tensor"):  # sharded like a parameter: cut as the reference cuts it
            digests = [tensor_digest(chunk) for chunk in world_chunks(_full(value), reference.shard)]
            for r in range(world):
                per_rank[r][key] = digests[reference.shard_index(r)]
        elif hasattr(value, "shape"):  # a plain tensor (Adam's step): every rank holds the same one
            digest = tensor_digest(value)
            for shards in per_rank:
                shards[key] = digest
        else:
            digest = hashlib.sha256(repr(value).encode()).hexdigest()
            for shards in per_rank:
                shards[key] = digest

    names = {}
    for name, p in model.named_parameters():
        add(f"param/{name}", p)
        names[id(p)] = name
    for p, state in optimizer.state.items():
        name = names.get(id(p), f"<unnamed:{id(p)}>")
        for key, value in sorted(state.items()):
            add(f"optim/{name}/{key}", value)
    state_hash = full_state_hash(per_rank)
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, (state_hash, steps_committed))
    return {
        "rank": rank,
        "world_size": world,
        "steps_committed": steps_committed,
        "shards": per_rank[rank],
        "state_hash": state_hash,
        "ranks_agree": all(v == views[0] for v in views),  # within the group; across groups: equal hashes
    }
