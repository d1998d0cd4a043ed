"""The reconfigure data-plane path's logic with fakes: path choice, the all-or-nothing fallback, the
identity rebuild. Real groups and real faults are in test_reconfigure.py (torch >= 2.15 only)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch.distributed as dist

from accelpact.backends import GlooBackend, reconfigure
from accelpact.backends.generations import GroupSpec
from accelpact.backends.reconfigure import Fallback, ReconfigurePath
from accelpact.errors import AccelPactError


class FakeStore:
    """The get-blocks-until-set semantics of a c10d store, shared by threads acting as ranks."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()

    def set(self, key: str, value: str | bytes) -> None:
        with self.cv:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self.cv.notify_all()

    def check(self, keys: list[str]) -> bool:
        with self.cv:
            return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, timeout=10):
                raise TimeoutError(key)
            return self.data[key]


def _spec(name: str, ranks: tuple[int, ...]) -> GroupSpec:
    return GroupSpec(name=name, backend="gloo", ranks=ranks, is_default=name == "0", tag=None, desc=name, timeout=None)


def _run_ranks(fn, world: int) -> list[Any]:
    out: list[Any] = [None] * world

    def body(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out[r] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


@pytest.fixture
def fake_api(monkeypatch):
    """dist's reconfigure API as fakes: records every call; ``fail`` names (rank, group) pairs that raise."""
    calls: list[tuple[int, str, int, tuple[str, ...]]] = []
    fail: set[tuple[int, str]] = set()

    class Pg:
        def __init__(self, rank: int, name: str) -> None:
            self.rank, self.group_name = rank, name

    def handle(pg):
        return f"fake:{pg.rank}:{pg.group_name}"

    def reconf(uuid, handles, group=None, timeout=None):
        if (group.rank, group.group_name) in fail:
            raise RuntimeError("Connection refused (injected)")
        calls.append((group.rank, group.group_name, uuid, tuple(handles)))

        class Work:
            def wait(self) -> None:
                pass

        return Work()

    monkeypatch.setattr(dist, "_get_reconfigure_handle", handle, raising=False)
    monkeypatch.setattr(dist, "_reconfigure", reconf, raising=False)
    monkeypatch.setattr(dist, "_supports_reconfigure", lambda pg: getattr(pg, "ok", True), raising=False)
    return Pg, calls, fail


def test_every_rank_reconfigures_the_same_groups_with_one_uuid_per_group(fake_api):
    Pg, calls, _ = fake_api
    specs = [_spec("0", (0, 1, 2)), _spec("1", (0, 2))]
    store = FakeStore()
    groups = {r: [Pg(r, "0")] + ([Pg(r, "1")] if r != 1 else []) for r in range(3)}

    def rank(r: int):
        mine = [(g, s) for g, s in zip(groups[r], [s for s in specs if r in s.ranks])]
        return ReconfigurePath(range(3)).reconfigure([g for g, _ in mine], [s for _, s in mine], store, r)

    out = _run_ranks(rank, 3)
    for r in range(3):
        assert out[r] == groups[r] and all(a is b for a, b in zip(out[r], groups[r]))  # the SAME objects
    by_group: dict[str, set[int]] = {}
    for _r, name, uuid, handles in calls:
        by_group.setdefault(name, set()).add(uuid)
        ranks = [s for s in specs if s.name == name][0].ranks
        assert handles == tuple(f"fake:{x}:{name}" for x in ranks)  # group-rank order
    assert all(len(u) == 1 for u in by_group.values()), by_group  # one uuid per group, shared
    assert by_group["0"] != by_group["1"]  # and not shared between groups


def test_one_rank_failing_makes_every_rank_fall_back(fake_api):
    Pg, _, fail = fake_api
    fail.add((1, "0"))
    spec = _spec("0", (0, 1))
    store = FakeStore()
    out = _run_ranks(lambda r: ReconfigurePath(range(2)).reconfigure([Pg(r, "0")], [spec], store, r), 2)
    assert all(isinstance(o, Fallback) for o in out), out
    assert all("rank 1" in o.reason and "Connection refused" in o.reason for o in out)


class _Table:
    """The binding table's surface the data plane uses (a pure stand-in: this tests the plane's choice)."""

    def __init__(self, groups: list[Any]) -> None:
        self.groups = groups
        self.rebound: list[dict] = []

    def refresh_defaults(self) -> None:
        pass

    def rebind(self, mapping: dict) -> None:
        self.rebound.append(mapping)
        self.groups[:] = [mapping.get(g, g) for g in self.groups]


class _Control:
    def __init__(self, store: Any) -> None:
        self.store = store

    def data_plane_store(self, generation: int) -> Any:
        return self.store


def _plane(live: list[Any], store: Any = None, backend: Any = None):
    from accelpact.dataplane.reconfigure import ReconfigurePlane

    b = backend or GlooBackend()
    b.groups = list(live)
    specs = [_spec(getattr(g, "name", str(i)), (0,)) for i, g in enumerate(live)]
    return ReconfigurePlane(
        backend=b,
        table=_Table(list(live)),
        specs=specs,
        vote_index=0,
        control=_Control(store or FakeStore()),
        rank=0,
        group_timeout=None,
        verify_rebind=False,
        scan=lambda vote: None,
        peers=set(),
    )


class _Adopting(GlooBackend):
    """gloo's socket adoption needs real sockets; this checks the plane goes through ``reconfigured``."""

    def __init__(self) -> None:
        super().__init__()
        self.adopted = 0

    def reconfigured(self, reconfigure):  # type: ignore[no-untyped-def]
        self.adopted += 1
        self.groups = list(reconfigure())
        return list(self.groups)


def test_the_plane_names_its_path_and_why(fake_api):
    from accelpact.dataplane.registry import attach_data_plane  # noqa: F401 - the registry imports it

    Pg, _, _ = fake_api
    good = Pg(0, "0")
    assert _plane([good]).last_path["path"] == "reconfigure" and _plane([good]).join_mode() == "reconfigure"
    bad = Pg(0, "1")
    bad.ok = False
    plane = _plane([good, bad])
    assert plane.last_path["path"] == "rebind" and "'1' does not support reconfigure" in plane.last_path["why"]
    assert plane.unsupported is not None and plane.join_mode() == "rebind"


def test_explicit_reconfigure_refuses_at_attach_where_it_cannot(fake_api, monkeypatch):
    from accelpact.dataplane import registry
    from accelpact.dataplane.reconfigure import ReconfigurePlane

    Pg, _, _ = fake_api
    bad = Pg(0, "1")
    bad.ok = False
    monkeypatch.setattr(ReconfigurePlane, "attach", classmethod(lambda cls, *a, **k: _plane([bad])))
    with pytest.raises(AccelPactError, match="data_plane='auto'"):
        registry.attach_data_plane("reconfigure")
    assert registry.attach_data_plane("auto").last_path["path"] == "rebind"  # auto degrades, saying why
    with pytest.raises(AccelPactError, match="registered"):
        registry.attach_data_plane("fast")


def test_without_the_api_the_path_is_rebuild_and_says_the_torch_version(monkeypatch):
    for name in ("_supports_reconfigure", "_get_reconfigure_handle", "_reconfigure"):
        monkeypatch.delattr(dist, name, raising=False)
    why = reconfigure.unsupported_reason([object()])
    assert why is not None and "torch 2.15 added it" in why


def test_the_reconfigure_plane_returns_the_live_groups_and_rebinds_nothing(fake_api, monkeypatch):
    """No new group, no rebind: the plane's rebuild is an identity when every rank reconfigured."""
    Pg, _, _ = fake_api
    live = [Pg(0, "0")]
    backend = _Adopting()
    plane = _plane(live, backend=backend)
    rebuilt: list[Any] = []
    monkeypatch.setattr("accelpact.backends.generations.rebuild_group", lambda *a, **k: rebuilt.append(a) or object())
    old, new = plane.rebuild(1)
    assert new[0] is live[0] and old[0] is live[0] and rebuilt == [] and plane.table.rebound == []
    assert plane.last_path["path"] == "reconfigure" and backend.adopted == 1


def test_the_reconfigure_plane_falls_back_to_new_groups_and_says_why(fake_api, monkeypatch):
    Pg, _, fail = fake_api
    fail.add((0, "0"))
    live = [Pg(0, "0")]
    plane = _plane(live, backend=_Adopting())
    new = object()
    monkeypatch.setattr("accelpact.backends.generations.rebuild_group", lambda *a, **k: new)
    monkeypatch.setattr("accelpact.dataplane.reconfigure._fallback_store", lambda store: store)
    monkeypatch.setattr(GlooBackend, "rebuild_groups", lambda self, olds, specs, store, rank: [new])
    old, got = plane.rebuild(1)
    assert got == [new] and plane.table.rebound == [{live[0]: new}] and plane.last_path["path"] == "rebind"
    assert plane.last_path["why"].startswith("reconfigure failed, fell back: rank 0")
    assert plane.join_mode() == "rebind"  # later rounds (and heals) take the proven path


class _Named:
    def __init__(self, name: str) -> None:
        self.group_name = name


@pytest.mark.parametrize("creator_prefix", ["init", None])
def test_a_replacement_rebuilds_the_survivors_group_store_keys(monkeypatch, creator_prefix):
    """gloo's reconfigure meets on the group's own store keys: the plan's address must reproduce them
    exactly (a replacement on another prefix waited out the reconfigure's timeout)."""
    import datetime

    import torch.distributed.distributed_c10d as c10d

    tcp = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=10))
    creator = dist.PrefixStore(creator_prefix, tcp) if creator_prefix else tcp
    pg = _Named("3")
    monkeypatch.setitem(c10d._world.pg_map, pg, ("gloo", dist.PrefixStore("3/", creator)))  # as c10d keeps it
    addr = reconfigure.group_store_address(pg)
    assert (addr["host"], addr["port"]) == ("127.0.0.1", tcp.port)
    assert tcp.list_keys() == []  # the probe is cleaned up
    survivor = dist.PrefixStore("cpu/", c10d._world.pg_map[pg][1])
    replacement = dist.PrefixStore(
        "cpu/", dist.PrefixStore("3/", reconfigure.store_at(addr, datetime.timedelta(seconds=10)))
    )
    replacement.set("reconfigure/7/0/1", "from the replacement")
    assert survivor.get("reconfigure/7/0/1") == b"from the replacement"


def test_a_group_store_a_replacement_cannot_reach_falls_back_naming_it(monkeypatch):
    import torch.distributed.distributed_c10d as c10d

    pg = _Named("0")
    monkeypatch.setitem(c10d._world.pg_map, pg, ("gloo", dist.PrefixStore("0/", dist.HashStore())))
    with pytest.raises(Fallback, match="HashStore, not a TCPStore"):
        reconfigure.group_store_address(pg)


def test_a_replacement_that_cannot_reach_the_group_stores_tells_the_survivors_and_falls_back():
    """Its word goes where the survivors read every rank's result, so they rebuild in the same round."""
    store = FakeStore()
    with pytest.raises(Fallback, match="could not create its groups"):
        reconfigure.join_groups([_spec("0", (0, 1))], store, 1, group_stores=[])
    assert b"could not create its groups" in store.get("reconf/result/1")


def test_a_rank_that_gives_up_before_publishing_its_handle_ends_the_others_wait_at_once(fake_api):
    """A replacement that cannot create its groups never publishes a handle: the survivors fall back as
    soon as it posts why, not after the store's timeout (their fallback rendezvous with it must meet)."""
    import datetime
    import time

    Pg, _, _ = fake_api
    spec = _spec("0", (0, 1))
    store = FakeStore()
    t0 = time.monotonic()
    out = _run_ranks(
        lambda r: (
            ReconfigurePath(range(2), datetime.timedelta(seconds=60)).reconfigure([Pg(r, "0")], [spec], store, r)
            if r == 0
            else reconfigure.join_groups([spec], store, 1, group_stores=[])
        ),
        2,
    )
    assert all(isinstance(o, Fallback) for o in out), out
    assert "could not create its groups" in out[0].reason
    assert time.monotonic() - t0 < 8  # a detection bound: without the early exit, the fake store's 10 s wait
