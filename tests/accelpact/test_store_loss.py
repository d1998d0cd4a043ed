"""Loss of the control store on real processes: two gloo ranks train while the process hosting their
control store (a separate ``harness.faults.store_server``, as the harness parent or torchrun's agent
would host it) is SIGKILLed, or killed and restarted at the same address.

- between faults: training finishes normally; each rank says once that the store stopped answering;
- at a fault: each rank raises ControlStoreLostError naming the store's address and its last
  committed step, within the control deadline (no hang);
- restarted at the same address: the ranks re-register (heartbeat, then that generation's reports)
  and recover the fault in memory, bit-identical to the fault-free run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from accelpact.testing.compare import bit_differences
from accelpact.testing.session import run_session

RUNNER = "experiments.workloads.fsdp_scenarios:run"
MODEL = {"layers": 2, "hidden": 64, "inter": 192}
STEPS = 12
KILL_AT = 2  # the store dies once rank 0 finished this step
FAULT_AT = 9
DEADLINE_S = 10.0
LOST_LINE = "stopped answering the heartbeat"


class StoreHost:
    """A control store in its own process, killable and restartable at the same port."""

    def __init__(self, port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.faults.store_server", "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        self.port = int(ready[2])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _train(name: str, faults: list[dict]) -> dict:
    return {
        "name": name,
        "kind": "train",
        "flavour": "fsdp2",
        "steps": STEPS,
        "model": MODEL,
        "faults": faults,
        "track_resources": True,
        "progress": True,
        "resources_barrier": False,
        "pause_s": 0.4,
    }


def _after_step(out: Path, step: int, action, timeout_s: float = 240.0) -> threading.Thread:
    """Run ``action()`` once rank 0's progress file shows ``step`` done (in a thread)."""

    def watch() -> None:
        path = out / "progress.faults.rank0.jsonl"
        end = time.time() + timeout_s
        while time.time() < end:
            if path.exists() and any(json.loads(x).get("step", -1) >= step for x in path.read_text().splitlines() if x):
                action()
                return
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _session(out: Path, host: StoreHost, jobs: list[dict]):
    return run_session(
        out,
        RUNNER,
        jobs,
        world_size=2,
        pg_timeout_s=30.0,
        control_deadline_s=DEADLINE_S,
        barrier=True,
        check=False,
        control_addr=("127.0.0.1", host.port),
        timeout_s=600,
    )


def _logs(out: Path) -> list[str]:
    return [(out / f"log.rank{r}.txt").read_text(errors="replace") for r in range(2)]


RESET_ALL = [{"step": FAULT_AT, "phase": "forward_allgather_first", "ranks": [0, 1]}]


def test_store_lost_between_faults_training_finishes_and_each_rank_says_so_once(tmp_path: Path):
    host = StoreHost()
    _after_step(tmp_path, KILL_AT, host.kill)
    s = _session(tmp_path, host, [_train("faults", [])])
    host.kill()
    for r in range(2):
        res = s.result("faults", r)
        assert res is not None and res.get("error") is None, f"rank {r}: {res and res.get('error')}\n{s.logs[r]}"
        assert len(res["losses"]) == STEPS
    for r, log in enumerate(_logs(tmp_path)):
        assert log.count(LOST_LINE) == 1, f"rank {r} reported the loss {log.count(LOST_LINE)} times:\n{log[-2000:]}"
        assert f"127.0.0.1:{host.port}" in log


@pytest.mark.slow
def test_store_lost_at_a_fault_each_rank_names_the_store_and_its_last_commit(tmp_path: Path):
    host = StoreHost()
    killed_at: list[float] = []
    _after_step(tmp_path, KILL_AT, lambda: (host.kill(), killed_at.append(time.time())))
    t0 = time.time()
    s = _session(tmp_path, host, [_train("faults", RESET_ALL)])
    assert killed_at, "the store was never killed"
    # The fault comes (FAULT_AT - KILL_AT) paused steps after the kill; then at most the control deadline
    # (plus start-up of the new generation's store client) must pass: generous on a loaded host.
    bound = (FAULT_AT - KILL_AT) * 0.4 + DEADLINE_S + 60
    assert s.wall_s - (killed_at[0] - t0) < bound, f"ranks took {s.wall_s:.0f} s: a hang?"
    for r in range(2):
        err = (s.result("faults", r) or {}).get("error")
        assert err is not None, f"rank {r} finished although its store was gone at a fault:\n{s.logs[r]}"
        assert err["type"] == "ControlStoreLostError", err
        assert f"control store at 127.0.0.1:{host.port} is lost" in err["message"], err["message"]
        assert err["last_committed_step"] == FAULT_AT - 1
        assert f"last committed step is {FAULT_AT - 1}" in err["message"]


@pytest.mark.slow
def test_store_restarted_at_the_same_address_ranks_reregister_and_recover(tmp_path: Path):
    host = StoreHost()
    port = host.port
    box = {}

    def restart() -> None:
        host.kill()
        box["new"] = StoreHost(port)

    _after_step(tmp_path, KILL_AT, restart)
    ref = {"name": "ref", "kind": "train", "flavour": "fsdp2", "guard": False, "steps": STEPS, "model": MODEL}
    s = _session(tmp_path, host, [_train("faults", RESET_ALL), ref])
    assert "new" in box, "the store was never restarted"
    box["new"].kill()
    for r in range(2):
        res = s.result("faults", r)
        assert res is not None and res.get("error") is None, f"rank {r}: {res and res.get('error')}\n{s.logs[r]}"
        assert [e["step"] for e in res["events"]] == [FAULT_AT], res["events"]
    diffs, _ = bit_differences(s, "faults", "ref")
    assert diffs == [], diffs[:5]
    for _r, log in enumerate(_logs(tmp_path)):
        assert log.count(LOST_LINE) <= 1 and log.count("answers again") == log.count(LOST_LINE), log[-2000:]
