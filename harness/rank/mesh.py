"""The device mesh a rank shards its model over: plain FSDP over the world, or HSDP (``cluster.replicate``).

``cluster.replicate=R`` cuts the world into R replicas of ``world_size / R`` ranks each: the mesh is
``(replicate, shard)`` in ``init_device_mesh``'s row-major order, so ranks ``0 .. S-1`` form replica 0,
``S .. 2S-1`` replica 1, and so on. FSDP2 shards every parameter over the shard dimension and all-reduces
its gradient across the replicate dimension. R = 1 is a 1-D mesh over the world (plain FSDP).

:func:`mesh_layout` is pure arithmetic, free of torch.distributed (torchft's identity record cuts its
state with it as the reference's mesh does); :func:`build_mesh` makes the mesh in a rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MESH_DIM_NAMES = ("replicate", "shard")


@dataclass(frozen=True)
class MeshLayout:
    """The shape of a rank's data-parallel mesh and what each rank's coordinates are in it."""

    replicate: int
    shard: int

    @property
    def shape(self) -> tuple[int, ...]:
        """``init_device_mesh``'s shape: 1-D over the world without replication, else (replicate, shard)."""
        return (self.shard,) if self.replicate == 1 else (self.replicate, self.shard)

    @property
    def dim_names(self) -> tuple[str, ...] | None:
        return None if self.replicate == 1 else MESH_DIM_NAMES

    def shard_index(self, rank: int) -> int:
        """Which of the ``shard`` pieces of every parameter global rank ``rank`` holds."""
        return rank % self.shard

    def replica_index(self, rank: int) -> int:
        return rank // self.shard


def mesh_layout(world_size: int, replicate: int = 1) -> MeshLayout:
    """The layout of ``world_size`` ranks in ``replicate`` replicas; ValueError when it does not divide."""
    if replicate < 1 or world_size % replicate:
        raise ValueError(f"replicate={replicate} must be at least 1 and divide world_size={world_size}")
    return MeshLayout(replicate, world_size // replicate)


def build_mesh(device_type: str, layout: MeshLayout, rejoin: Any = None) -> Any:
    """The DeviceMesh of ``layout`` on the default process group's ranks.

    ``rejoin``: a heal's replacement joined the survivors' groups (what the strategy's rejoin hook returned);
    when it offers ``device_mesh``, the mesh is built from those groups, since ``init_device_mesh`` would
    create new groups the survivors never join."""
    if rejoin is not None and hasattr(rejoin, "device_mesh"):
        return rejoin.device_mesh(device_type, layout.shape, layout.dim_names)
    from torch.distributed.device_mesh import init_device_mesh  # lazy: torch

    return init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.dim_names)
