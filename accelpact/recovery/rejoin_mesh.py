"""A replacement's DeviceMesh, built from the survivors' groups it joined (HSDP and other N-D meshes).

Every rank created its mesh with ``init_device_mesh(device_type, mesh_shape)``, which creates one process
group per mesh row of each dimension, all ranks together. A replacement cannot do that again: the
survivors would have to create the same groups at the same moment. :func:`accelpact.rejoin` already built
the groups of this rank under the survivors' names (the union of every survivor's groups:
accelpact.recovery.heal_groups), so the mesh is assembled from them with ``DeviceMesh.from_group``; the
FSDP2 wrapping on top then talks to the survivors' groups, and a parameter's mesh on the replacement
names the same groups as on every survivor.

A row none of whose members survived (under HSDP, a whole replica lost with its host) is in no survivor's
plan. Its members are all replacements, each building the same mesh, so they build that row themselves
(``RejoinTicket._orphan_group``), under a name that only they use.

The layout is ``init_device_mesh``'s: ranks ``0 .. N-1`` in row-major order over ``mesh_shape``; along
dimension ``d`` a rank's group holds the ranks that differ from it only in coordinate ``d``, in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from accelpact.errors import AccelPactError

__all__ = ["mesh_from_groups", "dim_ranks"]


def dim_ranks(rank: int, mesh_shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """The global ranks of ``rank``'s group along ``dim`` of a row-major mesh of ``mesh_shape``."""
    strides = [math.prod(mesh_shape[i + 1 :]) for i in range(len(mesh_shape))]
    coords = [(rank // strides[i]) % mesh_shape[i] for i in range(len(mesh_shape))]
    base = rank - coords[dim] * strides[dim]
    return tuple(base + k * strides[dim] for k in range(mesh_shape[dim]))


def mesh_from_groups(
    groups: Mapping[str, Any],
    device_type: str,
    mesh_shape: tuple[int, ...],
    mesh_dim_names: tuple[str, ...] | None = None,
    orphan: Callable[[tuple[int, ...]], Any] | None = None,
) -> Any:
    """``init_device_mesh(device_type, mesh_shape, mesh_dim_names=...)``'s mesh from already-built groups.

    ``groups``: c10d name -> ProcessGroup (a :class:`~accelpact.recovery.rejoin.RejoinTicket`'s). An
    AccelPactError names what is missing when the survivors' groups do not contain this rank's group of
    some dimension (the survivors' mesh has another shape, or was not built with init_device_mesh).
    ``orphan(ranks)``: builds a row that no survivor could carry because none of its members survived (a
    whole replica lost with its host); None, or its None, leaves the error."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh_shape = tuple(int(n) for n in mesh_shape)
    if math.prod(mesh_shape) != world:
        raise AccelPactError(
            f"mesh_shape={mesh_shape} has {math.prod(mesh_shape)} ranks; the job has {world}: "
            "pass the shape every rank gave init_device_mesh"
        )
    if len(mesh_shape) == 1:  # init_device_mesh's 1-D mesh over the world is the default group itself
        return init_device_mesh(device_type, mesh_shape, mesh_dim_names=mesh_dim_names)
    ordered = {}  # name -> the group's global ranks in group-rank order
    for name, pg in groups.items():
        group_rank = c10d._world.pg_group_ranks.get(pg, {})
        ordered[name] = tuple(sorted(group_rank, key=group_rank.__getitem__))
    dims = []
    for d in range(len(mesh_shape)):
        want = dim_ranks(rank, mesh_shape, d)
        found = sorted(name for name, r in ordered.items() if r == want)
        built = orphan(want) if not found and orphan is not None else None
        if built is not None:
            dims.append(built)
            continue
        if not found:
            raise AccelPactError(
                f"rank {rank}: no group of the survivors holds ranks {list(want)} (dimension {d} of mesh "
                f"{mesh_shape}); the replacement joined {sorted(ordered.values())}. Pass the mesh_shape every "
                "rank gave init_device_mesh, and attach accelpact after fully_shard so the survivors' plan "
                "carries their mesh's groups"
            )
        if len(found) > 1:  # a collective on one of them would never meet the survivors' on the other
            raise AccelPactError(
                f"rank {rank}: groups {found} all hold ranks {list(want)} (dimension {d} of mesh {mesh_shape}); "
                "which one the survivors' mesh uses is not known here. Create each set of ranks' group once "
                "(the mesh's), and reach it through the mesh: mesh.get_group(dim)"
            )
        dims.append(groups[found[0]])
    mesh = torch.arange(world).view(mesh_shape)
    if mesh_dim_names is None:
        mesh_dim_names = tuple(f"dim{d}" for d in range(len(mesh_shape)))
    return DeviceMesh.from_group(dims, device_type, mesh=mesh, mesh_dim_names=mesh_dim_names)
