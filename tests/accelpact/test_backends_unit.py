"""Unit tests of the backend seam's pure logic: registry lookup, NCCL configuration and fault
classification, and NCCL abort bookkeeping with fake process groups (no CUDA on this machine).

The real gloo path (socket reset, rebuild, first collective) is exercised end to end by the
recovery tests; the NCCL path only by benchmarks/gpu_check.py on a GPU machine.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from accelpact.backends import BACKENDS, GlooBackend, NcclBackend, all_fault_markers, backend_for, is_comm_fault
from accelpact.backends.nccl import error_handling_problem
from accelpact.backends.vote_buffer import VoteBuffer
from accelpact.errors import AccelPactError, CommFault, RankLostError

GLOO_RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:30857"
NCCL_REMOTE = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or "
    "there was a network error, NCCL version 2.27.5\nncclRemoteError: A call failed possibly due to a "
    "network error or a remote process exiting prematurely."
)
NCCL_TIMEOUT = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) "
    "ran for 600000 milliseconds before timing out."
)
NCCL_USAGE = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, invalid usage, "
    "NCCL version 2.27.5\nncclInvalidUsage: This usually reflects invalid usage of NCCL library."
)


def test_registry_names_match_classes():
    # the built-in two, plus whatever a plugin registered in this process (test_plugins adds a toy one
    # when the suite collects it)
    assert {"gloo", "nccl"} <= set(BACKENDS)
    for name, cls in BACKENDS.items():
        assert cls.name == name


def test_backend_for_unknown_backend_names_the_supported_ones(monkeypatch):
    import torch.distributed.distributed_c10d as c10d

    class FakePG:
        group_name = "7"

    pg = FakePG()
    monkeypatch.setitem(c10d._world.pg_map, pg, ("ucc", None))
    with pytest.raises(AccelPactError, match="'ucc'.*gloo, nccl"):
        backend_for(pg)
    monkeypatch.setitem(c10d._world.pg_map, pg, ("nccl", None))
    assert isinstance(backend_for(pg), NcclBackend)
    monkeypatch.setitem(c10d._world.pg_map, pg, ("gloo", None))
    assert isinstance(backend_for(pg), GlooBackend)


def test_backend_for_unregistered_group_says_when_to_attach():
    with pytest.raises(AccelPactError, match="attach accelpact after init_process_group"):
        backend_for(object())


@pytest.mark.parametrize(
    "env, ok",
    [
        ({}, False),  # torch's default is 3: tears the process down
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, False),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, False),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}, True),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, True),
        ({"NCCL_ASYNC_ERROR_HANDLING": "2"}, True),  # the deprecated alias
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "NCCL_ASYNC_ERROR_HANDLING": "2"}, False),  # TORCH_ wins
    ],
)
def test_nccl_error_handling_check(env, ok):
    problem = error_handling_problem(env)
    assert (problem is None) == ok, problem
    if not ok:
        assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=2" in problem  # names the fix


def test_nccl_configure_sets_a_default_and_never_overrides():
    env: dict[str, str] = {}
    NcclBackend.configure(env)
    assert env == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"} and error_handling_problem(env) is None
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    NcclBackend.configure(env)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_nccl_fault_classification():
    nccl, gloo = NcclBackend(), GlooBackend()
    assert nccl.is_comm_fault(RuntimeError(NCCL_REMOTE))
    assert nccl.is_comm_fault(RuntimeError(NCCL_TIMEOUT))
    assert nccl.is_comm_fault(RuntimeError("NCCL communicator was aborted on rank 0."))
    assert not nccl.is_comm_fault(RuntimeError(NCCL_USAGE))  # a new communicator would fail again
    assert not nccl.is_comm_fault(dist.DistBackendError(NCCL_USAGE))
    assert not nccl.is_comm_fault(RuntimeError("NCCL error: unhandled cuda error, NCCL version 2.27.5"))
    assert nccl.is_comm_fault(dist.DistBackendError(NCCL_REMOTE))
    assert not nccl.is_comm_fault(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not nccl.is_comm_fault(RankLostError("rank 1 gone", ranks=(1,)))
    assert nccl.is_comm_fault(CommFault("injected"))
    # Each backend knows its own transport's words; generic socket errors count for both.
    assert gloo.is_comm_fault(RuntimeError(GLOO_RESET)) and not nccl.is_comm_fault(RuntimeError(GLOO_RESET))
    assert not gloo.is_comm_fault(RuntimeError(NCCL_TIMEOUT))
    for b in (gloo, nccl):
        assert b.is_comm_fault(RuntimeError("recv: Connection reset by peer"))


def test_backend_free_classification_knows_every_backend():
    assert set(GlooBackend.fault_markers) | set(NcclBackend.fault_markers) == set(all_fault_markers())
    assert is_comm_fault(RuntimeError(GLOO_RESET)) and is_comm_fault(RuntimeError(NCCL_TIMEOUT))
    assert not is_comm_fault(RuntimeError("ProcessGroupGloo::allreduce: unsupported layout"))


class _FakeNcclBackend:
    def __init__(self, fail: bool = False) -> None:
        self.aborted = 0
        self.fail = fail

    def abort(self) -> None:
        if self.fail:
            raise RuntimeError("communicator already destroyed")
        self.aborted += 1


class _FakeGroup:
    """Stands in for a ProcessGroup: only what NcclBackend touches."""

    def __init__(self, backend: _FakeNcclBackend | None, device: torch.device | None = None) -> None:
        self._backend = backend
        self.bound_device_id = device
        self.group_name = "0"

    def _get_backend(self, device: torch.device) -> _FakeNcclBackend:
        assert device.type == "cuda"
        if self._backend is None:
            raise RuntimeError("No backend type associated with device type cuda")
        return self._backend


def test_nccl_abort_aborts_every_live_communicator_and_skips_dead_ones():
    live, dead = _FakeNcclBackend(), _FakeNcclBackend(fail=True)
    b = NcclBackend()
    b.track([_FakeGroup(live, torch.device("cuda", 1)), _FakeGroup(dead), _FakeGroup(None)])
    assert b.abort() == 1 and live.aborted == 1
    assert b.abort() == 1 and live.aborted == 2  # idempotent from the caller's view: never raises
    assert b.device == torch.device("cuda", 1)  # the bound device, not the current one


def test_nccl_abandon_aborts_and_keeps_until_timeout():
    comm = _FakeNcclBackend()
    b = NcclBackend()
    b.abandon([_FakeGroup(comm)], work=object(), pg_timeout=datetime.timedelta(seconds=60))
    assert comm.aborted == 1
    b.forget_expired()
    assert b.abandoned_generations == 1  # still inside its timeout
    b.abandon([_FakeGroup(_FakeNcclBackend())], work=None, pg_timeout=datetime.timedelta(seconds=-10))
    b.forget_expired()
    assert b.abandoned_generations == 1  # the expired one is dropped, the live one kept


def test_gloo_abort_before_track_names_the_order():
    with pytest.raises(RuntimeError, match="track"):
        GlooBackend().abort()


def test_nccl_vote_raises_a_comm_fault_unless_every_rank_contributed(monkeypatch):
    """An aborted NCCL vote returns to the CPU without a result: only the sum proves completion."""

    class FakeWork:
        def wait(self) -> bool:
            return True

    class FakePG:
        group_name = "0"

        def size(self) -> int:
            return 4

    arrived = {"n": 4}

    def fake_all_reduce(buf, group=None, async_op=False):
        buf.fill_(arrived["n"])
        return FakeWork()

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    b = NcclBackend()
    assert b.vote(VoteBuffer("cpu"), FakePG()) == 4  # every rank's 1 arrived
    arrived["n"] = 3
    with pytest.raises(CommFault, match="did not complete") as ei:
        b.vote(VoteBuffer("cpu"), FakePG())
    assert b.is_comm_fault(ei.value)


_ATTACH_SCRIPT = r"""
import sys
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.fsdp import fully_shard
import accelpact, accelpact.backends as B
from accelpact.backends.gloo import GlooBackend
from accelpact.errors import AccelPactError

calls = []

class Recording(GlooBackend):
    @classmethod
    def configure(cls, environ=None):
        calls.append("configure")

    def check(self, pg):
        calls.append("check")
        super().check(pg)

    def vote(self, buf, pg, wait=None):
        calls.append("vote")
        return super().vote(buf, pg, wait)

class Refusing(GlooBackend):
    def check(self, pg):
        raise AccelPactError("set FOO=1 before init_process_group")

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = nn.Linear(4, 4)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

B.BACKENDS["gloo"] = Refusing
try:
    accelpact.attach(model, opt, object())
    sys.exit("attach accepted a group its backend refused")
except AccelPactError as exc:
    assert "FOO=1" in str(exc), exc

B.BACKENDS["gloo"] = Recording
guard = accelpact.attach(model, opt, object(), injection_clock=lambda t: None)
assert calls == ["check", "configure"], calls
assert guard.injection_clock is not None and isinstance(guard.backend, Recording)

def step_fn(x):
    loss = model(x).sum()
    loss.backward()
    return loss.detach()

guard.step(step_fn, torch.ones(2, 4))
assert calls == ["check", "configure", "vote"] and guard.committed_step == 0, (calls, guard.committed_step)
print("OK")
"""


def test_attach_goes_through_the_registered_backend(tmp_path):
    """attach checks the user's groups BEFORE configuring (configuring first would hide NCCL error
    handling that kills the process), refuses what the backend refuses, and votes through it.
    Runs in a subprocess: a real 1-rank gloo group, kept out of the pytest process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run(
        [sys.executable, "-c", _ATTACH_SCRIPT], capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path)
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_an_abandoned_generation_is_kept_until_its_pg_timeout_then_dropped(monkeypatch):
    import weakref

    from accelpact.backends import keepalive

    class Group:  # stands in for the abandoned generation's process group
        pass

    now = [1000.0]
    monkeypatch.setattr(keepalive.time, "monotonic", lambda: now[0])
    backend = GlooBackend()
    group = Group()
    ref = weakref.ref(group)
    backend.abandon([group], work=None, pg_timeout=datetime.timedelta(seconds=15))
    del group
    now[0] += 15.0  # the collective's timeout, but not its 5 s margin: still kept
    backend.forget_expired()
    assert backend.abandoned_generations == 1 and ref() is not None
    now[0] += 5.1
    backend.forget_expired()
    assert backend.abandoned_generations == 0 and ref() is None


def test_an_abandoned_generation_outlives_the_backend_that_abandoned_it(monkeypatch):
    """A closed guard's backend is freed by the next garbage collection (the guard and its backend form a
    cycle). Had it kept the abandoned groups, that collection would destroy them while their collective
    still ran, and gloo's destructor would wait out the PG timeout (a 2-minute stall, seen in CI)."""
    import gc
    import weakref

    from accelpact.backends import keepalive

    class Group:
        pass

    now = [1000.0]
    monkeypatch.setattr(keepalive.time, "monotonic", lambda: now[0])
    backend = GlooBackend()
    backend.cycle = backend  # as a guard's closures make it
    group = Group()
    ref = weakref.ref(group)
    backend.abandon([group], work=None, pg_timeout=datetime.timedelta(seconds=15))
    del group, backend
    gc.collect()
    assert ref() is not None  # still kept: its collective may still run
    now[0] += 20.1
    GlooBackend().forget_expired()  # any later guard's recovery or committed step lets it go
    assert ref() is None


@pytest.mark.parametrize("value", [0, 1, 5, 2**62 + 12345, -(2**40)])
def test_vote_buffer_writes_and_reads_the_tensor_the_vote_reduces(value):
    """The numpy view and the tensor are one memory: what set() writes the all-reduce sends, and what the
    all-reduce writes get() reads, at the full 63-bit width the position vote uses."""
    buf = VoteBuffer("cpu")
    buf.set(value)
    assert buf.tensor.dtype == torch.int64 and buf.tensor.item() == value
    buf.tensor.add_(3)  # as an all-reduce writes into it
    assert buf.get() == value + 3


def test_vote_buffer_without_numpy_goes_through_the_tensor(monkeypatch):
    def no_numpy(self):
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    buf = VoteBuffer("cpu")
    buf.set(2**61)
    buf.tensor.add_(1)
    assert buf.get() == 2**61 + 1
