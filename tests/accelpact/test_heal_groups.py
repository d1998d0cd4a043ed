"""The heal plan's groups (accelpact.recovery.heal_groups) and a replacement's mesh layout
(accelpact.recovery.rejoin_mesh.dim_ranks): pure logic, on the groups of a real 2 x 2 HSDP mesh.

On ``init_device_mesh("cpu", (2, 2))`` rank r holds the world group, its replicate group (dimension 0)
and its shard group (dimension 1), found in that order. Before the union, the plan was one survivor's
list: the replacement of rank 1 never got its replicate group ``(1, 3)`` from rank 0, and the heal hung.
"""

from __future__ import annotations

import pytest

from accelpact.errors import StateDivergedError
from accelpact.recovery.heal_groups import merge_group_posts
from accelpact.recovery.rejoin_mesh import dim_ranks


def spec(name: str, ranks: tuple[int, ...], default: bool = False) -> dict:
    return {
        "name": name,
        "backend": "gloo",
        "ranks": list(ranks),
        "is_default": default,
        "tag": None,
        "desc": "",
        "timeout_s": None,
        "bound": False,
    }


WORLD = spec("0", (0, 1, 2, 3), default=True)
REPLICATE = {0: spec("1", (0, 2)), 2: spec("1", (0, 2)), 1: spec("2", (1, 3)), 3: spec("2", (1, 3))}
SHARD = {0: spec("3", (0, 1)), 1: spec("3", (0, 1)), 2: spec("4", (2, 3)), 3: spec("4", (2, 3))}


def post(rank: int, **extra) -> dict:
    return {"groups": [WORLD, REPLICATE[rank], SHARD[rank]], "data_plane": "rebind", "group_count": 5, **extra}


def test_the_union_gives_a_replacement_every_group_of_its_rank_in_mesh_order():
    merged = merge_group_posts({r: post(r) for r in (0, 2, 3)})  # rank 1 was lost
    names = [g["name"] for g in merged["groups"]]
    assert names == ["0", "1", "2", "3", "4"]
    mine = [g["name"] for g in merged["groups"] if 1 in g["ranks"]]
    assert mine == ["0", "2", "3"]  # world, then replicate (1, 3), then shard (0, 1): the order rank 1 built them
    assert merged["data_plane"] == "rebind" and merged["group_count"] == 5
    # Every survivor computes the same plan, whatever order the posts were read in.
    assert merged == merge_group_posts({r: post(r) for r in (3, 0, 2)})


def test_one_survivor_alone_lacks_the_replacements_replicate_group():
    """The defect the union mends: rank 0's own list has no group (1, 3)."""
    alone = merge_group_posts({0: post(0)})
    assert not any(g["ranks"] == [1, 3] for g in alone["groups"])


def test_reconfigure_only_when_every_survivor_can_join_in_place():
    stores = {r: [{"g": "0"}, {"g": REPLICATE[r]["name"]}, {"g": SHARD[r]["name"]}] for r in (0, 2, 3)}
    all_in_place = merge_group_posts({r: post(r, data_plane="reconfigure", group_stores=stores[r]) for r in (0, 2, 3)})
    assert all_in_place["data_plane"] == "reconfigure"
    assert [s["g"] for s in all_in_place["group_stores"]] == [g["name"] for g in all_in_place["groups"]]
    mixed = {r: post(r, data_plane="reconfigure", group_stores=stores[r]) for r in (0, 2)} | {3: post(3)}
    merged = merge_group_posts(mixed)
    assert merged["data_plane"] == "rebind" and "group_stores" not in merged


def test_one_name_for_two_rank_sets_is_refused():
    bad = post(2)
    bad["groups"] = [WORLD, spec("1", (1, 3)), SHARD[2]]  # rank 2 names (1, 3) what rank 0 names (0, 2)
    with pytest.raises(StateDivergedError, match="same order"):
        merge_group_posts({0: post(0), 2: bad})


@pytest.mark.parametrize(
    "shape,rank,dim,want",
    [
        ((2, 2), 1, 0, (1, 3)),
        ((2, 2), 1, 1, (0, 1)),
        ((2, 2), 2, 0, (0, 2)),
        ((2, 2), 3, 1, (2, 3)),
        ((4,), 2, 0, (0, 1, 2, 3)),
        ((2, 3), 4, 0, (1, 4)),
        ((2, 3), 4, 1, (3, 4, 5)),
        ((2, 2, 2), 5, 0, (1, 5)),
        ((2, 2, 2), 5, 1, (5, 7)),
        ((2, 2, 2), 5, 2, (4, 5)),
    ],
)
def test_dim_ranks_follows_init_device_mesh_row_major_layout(shape, rank, dim, want):
    import torch

    mesh = torch.arange(int(torch.tensor(shape).prod())).view(shape)
    rows = mesh.swapdims(-1, dim).reshape(-1, shape[dim]).tolist()  # init_device_mesh's groups of dim
    assert tuple(next(r for r in rows if rank in r)) == want
    assert dim_ranks(rank, shape, dim) == want
