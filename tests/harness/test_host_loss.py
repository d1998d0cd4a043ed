"""fault=host_loss: every rank of one simulated host is SIGKILLed and the host's snapshot root deleted;
the lost ranks' snapshots survive as buddy replicas on the other host, fetched over the control link.

- pure: the registry entry and its config;
- netns: 4 replica ranks on 2 host namespaces (each host its own ACCELPACT_SNAPSHOT_ROOT, the replica
  server on its host's control address) push snapshots to their buddies; host 1 is lost through the
  fault's own parent action; its ranks are dead and its root is gone; a fresh process on host 1
  fetches rank 2's and rank 3's newest snapshots from host 0 bit-identically; the topology's
  teardown leaves nothing behind, the snapshot roots included.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.faults import registry

REPO = Path(__file__).resolve().parents[2]


def test_host_loss_is_a_registered_namespace_fault():
    spec = registry.get("host_loss")
    assert spec.where == "netns" and spec.needs_root and spec.parent_apply is not None
    assert "host_loss" in (REPO / "conf" / "fault" / "host_loss.yaml").read_text()
    assert "host_loss" in (REPO / "docs" / "fault_injection.md").read_text()


def _available() -> tuple[bool, str]:
    from harness.faults.netns import namespaces_available

    return namespaces_available()


_OK, _WHY = _available()


class _Driver:
    """The part of harness.faults.driver.FaultDriver that a parent-side action uses."""

    def __init__(self, topo, procs):
        self.topology, self.procs, self.events = topo, procs, []

    def topology_or_fail(self):
        return self.topology

    def record(self, req, **extra):
        self.events.append({**req, **extra})

    def signal(self, rank, sig):
        os.killpg(self.procs[rank].pid, sig)


def _wait_json(path: Path, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise AssertionError(
        f"{path} not written in {timeout_s} s; logs: "
        + " | ".join(p.read_text()[-800:] for p in path.parent.glob("*.log"))
    )


@pytest.mark.netns
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_host_loss_kills_the_host_deletes_its_shm_and_buddies_still_hold_its_snapshots(tmp_path, monkeypatch):
    from accelpact.control import new_job_token
    from harness.faults.host_loss import apply_host_loss
    from harness.faults.netns import NetnsTopology, leftovers
    from tests.accelpact._replica_rank import payload

    monkeypatch.setenv("ACCELPACT_SNAPSHOT_ROOT", str(tmp_path / "shm"))  # the base; each host a root below it
    token, world, nbytes = new_job_token(), 4, 1 << 20
    with NetnsTopology(world_size=world, hosts=2) as topo:
        host, port = topo.control_addr
        procs = {}
        for r in range(world):
            env = {**os.environ, **topo.rank_env(r), "PYTHONPATH": str(REPO)}
            assert env["LOCAL_WORLD_SIZE"] == "2" and env["ACCELPACT_REPLICA_ADDR"] == topo.layout.ctl_addr(r)
            cfg = {
                "host": host,
                "port": port,
                "token": token,
                "rank": r,
                "world_size": world,
                "root": env["ACCELPACT_SNAPSHOT_ROOT"],
                "mode": "push",
                "steps": [1, 2, 3],
                "nbytes": nbytes,
                "out": str(tmp_path / f"r{r}.out"),
                "serve_s": 300,
            }
            (tmp_path / f"r{r}.json").write_text(json.dumps(cfg))
            procs[r] = subprocess.Popen(
                topo.wrap_command(
                    r, [sys.executable, "-m", "tests.accelpact._replica_rank", str(tmp_path / f"r{r}.json")]
                ),
                env=env,
                cwd=REPO,
                start_new_session=True,
                stdout=open(tmp_path / f"r{r}.log", "wb"),
                stderr=subprocess.STDOUT,
            )
        try:
            outs = [_wait_json(tmp_path / f"r{r}.out") for r in range(world)]
            assert [o["buddy"] for o in outs] == [2, 3, 0, 1]  # same local rank on the next host
            assert all(o["stats"]["pushed"] == 3 for o in outs), outs
            roots = [topo.snapshot_root(h) for h in range(2)]
            assert (roots[1] / token / "rank2").is_dir() and (roots[0] / token / "replica" / "rank2").is_dir()

            driver = _Driver(topo, procs)
            apply_host_loss(driver, {"kind": "host_loss", "rank": 3, "step": 3, "phase": "vote", "index": 0})
            assert driver.events[0]["host_ranks"] == [2, 3] and driver.events[0]["host"] == 1
            for r in (2, 3):
                assert procs[r].wait(10) == -signal.SIGKILL
            assert procs[0].poll() is None and procs[1].poll() is None  # host 0 lives on
            assert not roots[1].exists()  # the host's shared memory went with it

            for src in (2, 3):  # a replacement on host 1 heals each lost rank from its buddy on host 0
                env = {**os.environ, **topo.rank_env(src), "PYTHONPATH": str(REPO)}
                cfg = {
                    "host": host,
                    "port": port,
                    "token": token,
                    "rank": src,
                    "world_size": world,
                    "root": env["ACCELPACT_SNAPSHOT_ROOT"],
                    "mode": "fetch",
                    "src": src,
                    "dest": str(roots[1] / token / f"rank{src}" / "slot0"),
                    "out": str(tmp_path / f"f{src}.out"),
                }
                (tmp_path / f"f{src}.json").write_text(json.dumps(cfg))
                done = subprocess.run(
                    topo.wrap_command(
                        src, [sys.executable, "-m", "tests.accelpact._replica_rank", str(tmp_path / f"f{src}.json")]
                    ),
                    env=env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
                res = json.loads((tmp_path / f"f{src}.out").read_text())
                assert res["marker"]["step"] == 3, res
                assert res["files"]["shard.bin"] == hashlib.sha256(payload(src, 3, nbytes)).hexdigest()
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    assert leftovers(topo.prefix) == []
    assert not any((tmp_path / "shm").glob(f"{topo.prefix}-*"))  # no host root left after teardown
