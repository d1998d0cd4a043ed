"""accelpact.run.workers, the rank-process code both launchers share (accelpact.run's agent and the harness's
parent), on real processes and a real TCPStore: a failed rank is reaped once per process, with a signed death
notice naming the pid that died; a replacement's own death is reaped again; ``stop`` ends ranks that ignore
SIGTERM or are SIGSTOPped, retired processes, idle spares and a rank's own children; and the order a
replacement is started in (hot spare, template fork, spawn), with the template's reason kept when it fails.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from accelpact.control import notice_auth
from accelpact.detection.liveness import notice_key
from accelpact.run.template import TemplateUnavailable
from accelpact.run.workers import HOT_SPARE, SPAWN, TEMPLATE, Notices, Workers, spawn, start_replacement

TOKEN = "workers-test"
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def _notice(store, rank: int) -> dict:
    return notice_auth.verify(store.get(notice_key(TOKEN, rank)), TOKEN)


def _wait_exit(proc, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"pid {proc.pid} did not exit"
        time.sleep(0.02)
    return proc.poll()


def test_a_failed_rank_is_reaped_once_with_a_notice_naming_its_pid(store, tmp_path: Path):
    w = Workers(Notices(store.set, TOKEN, by="test"))
    try:
        for rank in (0, 1):
            w.procs[rank] = spawn(SLEEP, dict(os.environ), tmp_path / f"rank{rank}.log")
        assert w.reap() == {}
        dead = w.procs[1]
        os.killpg(dead.pid, signal.SIGKILL)
        _wait_exit(dead)
        assert w.reap() == {1: -signal.SIGKILL}
        assert w.reap() == {}, "a death is reaped once per process"
        notice = _notice(store, 1)
        assert notice["pid"] == dead.pid and "SIGKILL" in notice["reason"] and notice["by"] == "test"
        # Its replacement is the rank's process now; the dead one is kept to be reaped at the end.
        new = w.replace(1, spawn(SLEEP, dict(os.environ), tmp_path / "rank1.log"))
        assert w.procs[1] is new and w.retired == [dead] and w.reap() == {}
        os.killpg(new.pid, signal.SIGTERM)
        _wait_exit(new)
        assert w.reap() == {1: -signal.SIGTERM} and _notice(store, 1)["pid"] == new.pid
        assert w.poll() == ([0], {1: -signal.SIGTERM})
    finally:
        w.stop(grace_s=1.0)


def test_a_rank_that_exits_0_is_not_a_death(store, tmp_path: Path):
    w = Workers(Notices(store.set, TOKEN, by="test"))
    w.procs[0] = spawn([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "rank0.log")
    _wait_exit(w.procs[0])
    assert w.reap() == {} and not store.check([notice_key(TOKEN, 0)])
    w.stop(grace_s=1.0)


def test_stop_ends_stubborn_stopped_retired_and_spare_processes_and_their_children(tmp_path: Path):
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(120)",
    ]
    parent_of_child = [
        sys.executable,
        "-c",
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(p.pid, flush=True); time.sleep(120)",
    ]
    w = Workers()
    w.procs[0] = spawn(stubborn, dict(os.environ), tmp_path / "rank0.log")
    w.procs[1] = spawn(SLEEP, dict(os.environ), tmp_path / "rank1.log")
    w.procs[2] = spawn(parent_of_child, dict(os.environ), tmp_path / "rank2.log")
    w.retired.append(spawn(SLEEP, dict(os.environ), tmp_path / "retired.log"))
    w.spares.append(spawn(SLEEP, dict(os.environ), tmp_path / "spare.log"))
    deadline = time.monotonic() + 60
    while not ((tmp_path / "rank0.log").read_text().strip() and (tmp_path / "rank2.log").read_text().strip()):
        assert time.monotonic() < deadline, "the test processes did not start"
        time.sleep(0.05)
    child = int((tmp_path / "rank2.log").read_text().split()[0])
    os.killpg(w.procs[1].pid, signal.SIGSTOP)  # a stopped rank cannot act on SIGTERM until continued
    everything = [*w.procs.values(), *w.retired, *w.spares]
    w.stop(grace_s=1.0)
    assert all(p.poll() is not None for p in everything), [(p.pid, p.poll()) for p in everything]
    assert everything[0].poll() == -signal.SIGKILL, "SIGTERM ignored: SIGKILL after the grace"
    assert everything[1].poll() == -signal.SIGTERM, "SIGSTOPped: continued, then ended by SIGTERM"
    time.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, (
        "a rank's child outlived its rank's session"
    )
    assert w.retired == [] and w.spares == []


def test_start_replacement_prefers_a_spare_then_the_template_then_a_spawn():
    said: list[str] = []
    spare, forked, spawned = object(), object(), object()

    def refuse():
        raise TemplateUnavailable("the template has 2 threads")

    assert start_replacement(1, lambda: spare, lambda: forked, lambda: spawned, said.append) == (spare, HOT_SPARE, "")
    assert start_replacement(1, lambda: None, lambda: forked, lambda: spawned, said.append) == (forked, TEMPLATE, "")
    assert start_replacement(1, lambda: None, None, lambda: spawned, said.append) == (spawned, SPAWN, "")
    assert said == []
    assert start_replacement(1, lambda: None, refuse, lambda: spawned, said.append) == (
        spawned,
        SPAWN,
        "the template has 2 threads",
    )
    assert said == ["replacement template unusable (the template has 2 threads): spawning a fresh process for rank 1"]


def test_a_notice_that_cannot_be_written_is_said_not_raised(tmp_path: Path):
    def broken(key: str, value: bytes) -> None:
        raise ConnectionResetError("store gone")

    said: list[str] = []
    w = Workers(Notices(broken, TOKEN, by="test"), say=said.append)
    w.procs[0] = spawn([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), tmp_path / "rank0.log")
    _wait_exit(w.procs[0])
    assert w.reap() == {0: 3}
    assert said == ["could not write the death notice of rank 0: store gone"]
    w.stop(grace_s=1.0)
