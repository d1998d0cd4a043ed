"""The reconfigure data-plane path's logic with fakes: path choice, the all-or-nothing fallback, the
identity rebuild. Real groups and real faults are in test_reconfigure.py (torch >= 2.15 only)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch.distributed as dist

from accelpact.backends import GlooBackend, reconfigure
from accelpact.backends.reconfigure import Fallback, ReconfigurePath
from accelpact.comm import GroupSpec
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

    def get(self, key: str) -> bytes:
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, timeout=10):
                raise TimeoutError(key)
            return self.data[key]


def _spec(name: str, ranks: tuple[int, ...]) -> GroupSpec:
    return GroupSpec(name=name, backend="gloo", ranks=ranks, is_default=name == "0", tag=None, desc=name,
                     timeout=None)


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
    for r, name, uuid, handles in calls:
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


def test_choose_path_names_why(fake_api, monkeypatch):
    Pg, _, _ = fake_api
    b = GlooBackend()
    good = Pg(0, "0")
    b.choose_path("auto", [good], range(1))
    assert b.path["path"] == "reconfigure" and b.reconfigure is not None
    b.choose_path("rebuild", [good], range(1))
    assert b.path == {"path": "rebuild", "why": "data_plane='rebuild' was asked for"} and b.reconfigure is None
    bad = Pg(0, "1")
    bad.ok = False
    b.choose_path("auto", [good, bad], range(1))
    assert b.path["path"] == "rebuild" and "'1' does not support reconfigure" in b.path["why"]
    with pytest.raises(AccelPactError, match="data_plane='auto'"):
        b.choose_path("reconfigure", [bad], range(1))
    with pytest.raises(AccelPactError, match="expected one of"):
        b.choose_path("fast", [good], range(1))


def test_without_the_api_the_path_is_rebuild_and_says_the_torch_version(monkeypatch):
    for name in ("_supports_reconfigure", "_get_reconfigure_handle", "_reconfigure"):
        monkeypatch.delattr(dist, name, raising=False)
    why = reconfigure.unsupported_reason([object()])
    assert why is not None and "torch 2.15 added it" in why


def test_rebuild_groups_on_the_reconfigure_path_returns_the_live_groups(fake_api, monkeypatch):
    """No new group, no rebind: the backend's rebuild is an identity when every rank reconfigured."""
    Pg, _, _ = fake_api
    b = GlooBackend()
    live = [Pg(0, "0")]
    b.choose_path("auto", live, range(1))
    rebuilt: list[Any] = []
    monkeypatch.setattr("accelpact.comm.rebuild_group", lambda *a, **k: rebuilt.append(a) or object())
    from accelpact.backends.base import Backend

    got = Backend.rebuild_groups(b, live, [_spec("0", (0,))], FakeStore(), 0)
    assert got[0] is live[0] and rebuilt == [] and b.last_path["path"] == "reconfigure"


def test_rebuild_groups_falls_back_to_new_groups_and_says_why(fake_api, monkeypatch):
    Pg, _, fail = fake_api
    fail.add((0, "0"))
    b = GlooBackend()
    live = [Pg(0, "0")]
    b.choose_path("auto", live, range(1))
    new = object()
    monkeypatch.setattr("accelpact.comm.rebuild_group", lambda *a, **k: new)
    monkeypatch.setattr("accelpact.backends.base._fallback_store", lambda store: store)
    from accelpact.backends.base import Backend

    got = Backend.rebuild_groups(b, live, [_spec("0", (0,))], FakeStore(), 0)
    assert got == [new] and b.last_path["path"] == "rebuild"
    assert b.last_path["why"].startswith("reconfigure failed, fell back: rank 0")
