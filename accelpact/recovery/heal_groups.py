"""Which process groups a heal's replacement builds: the union of every survivor's groups (pure logic).

A survivor knows only the data-plane groups it is a member of. On a 1-D mesh over the world that is
every group a replacement needs, but not under HSDP: on a 2x2 mesh ``[[0, 1], [2, 3]]`` rank 0 holds
the world group, its replicate group ``(0, 2)`` and its shard group ``(0, 1)``; the replacement of
rank 1 needs ``(1, 3)``, which only ranks 1 and 3 hold. So each survivor posts its groups (and, in the
reconfigure regime, where each group's store is) at the heal's roll call, and every survivor writes
the same plan: the union, in one order.

The order matters: a gloo group's constructor blocks until every member connects, so two ranks that
build two shared groups in opposite orders wait for each other forever. Every rank builds its groups
in the order it found them (its model's parameters, mesh dimension by mesh dimension), and so do the
survivors when they rebuild; the union keeps that order by sorting on the earliest position any
survivor listed a group at (then its name, for a total order).

No torch here: the entries are the plan's JSON dicts (accelpact.recovery.heal writes them, and
accelpact.recovery.rejoin reads them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accelpact.errors import StateDivergedError

__all__ = ["GroupsPost", "merge_group_posts"]

# A survivor's post: {"groups": [spec dict, ...], "data_plane": "rebind" | "reconfigure",
# "group_stores": [address dict, ...] (reconfigure only, aligned with "groups"), "group_count": int}
GroupsPost = Mapping[str, Any]


def merge_group_posts(posts: Mapping[int, GroupsPost]) -> dict[str, Any]:
    """The plan's group part from every survivor's post (survivor rank -> post): the same on every rank.

    ``groups``: the union by name, in first-listed order; ``data_plane``: "reconfigure" only when every
    survivor can join in place (otherwise everyone rebuilds and rebinds, as one survivor must);
    ``group_stores`` (reconfigure only): each group's store; ``group_count``: the highest c10d group
    counter (a replacement continues it, so that groups created after the heal get the same names).
    StateDivergedError when two survivors describe one group name differently.
    """
    if not posts:
        raise ValueError("no survivor posted its groups")
    first_at: dict[str, tuple[int, str]] = {}
    spec_of: dict[str, dict[str, Any]] = {}
    store_of: dict[str, Any] = {}
    modes = set()
    for rank in sorted(posts):
        post = posts[rank]
        groups: Sequence[dict[str, Any]] = post.get("groups", [])
        stores = post.get("group_stores")
        modes.add(post.get("data_plane", "rebind"))
        for i, spec in enumerate(groups):
            name = spec["name"]
            known = spec_of.get(name)
            if known is not None and _identity(known) != _identity(spec):
                raise StateDivergedError(
                    f"survivors describe process group {name!r} differently: {known} vs {spec} (rank {rank}); "
                    "every rank must create its groups in the same order (new_group / init_device_mesh), so that "
                    "one name means one set of ranks"
                )
            spec_of.setdefault(name, spec)
            first_at[name] = min(first_at.get(name, (i, name)), (i, name))
            if stores is not None and i < len(stores):
                store_of.setdefault(name, stores[i])
    names = sorted(spec_of, key=lambda n: first_at[n])
    merged: dict[str, Any] = {
        "groups": [spec_of[n] for n in names],
        "group_count": max(int(p.get("group_count", 0)) for p in posts.values()),
    }
    if modes == {"reconfigure"} and all(n in store_of for n in names):
        merged["data_plane"] = "reconfigure"
        merged["group_stores"] = [store_of[n] for n in names]
    else:
        merged["data_plane"] = "rebind"
    return merged


def _identity(spec: Mapping[str, Any]) -> tuple[Any, ...]:
    return (spec["name"], spec["backend"], tuple(spec["ranks"]), bool(spec["is_default"]))
