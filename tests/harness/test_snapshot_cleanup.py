"""No snapshot directory outlives its run: after a rank kill (healed in memory), a Ctrl-C of the parent,
a host loss, and, for a parent that was itself SIGKILLed, after the stale cleanup command.

Each run gets ``ACCELPACT_SNAPSHOT_ROOT`` = a base under tmp_path; the parent gives its host(s) roots
``<base>/<prefix>-h<host>`` below it. The interrupted runs wait until a rank has written a complete
snapshot (a marker exists) before they are interrupted, so there is something to leave behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_test_helpers import TINY, harness_env, read_row, worker_processes

REPO = Path(__file__).resolve().parents[2]


def _env(base: Path) -> dict[str, str]:
    return {**harness_env(), "ACCELPACT_SNAPSHOT_ROOT": str(base)}


def _start(tmp_path: Path, base: Path, extra: list[str]) -> subprocess.Popen:
    args = [*TINY, "strategy=accelpact_heal", "train.steps=400", *extra, f"hydra.run.dir={tmp_path / 'run'}"]
    from harness_test_helpers import harness_cmd

    return subprocess.Popen(
        harness_cmd(args, tmp_path),
        cwd=tmp_path,
        env=_env(base),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_snapshot(base: Path, proc: subprocess.Popen, timeout_s: float = 240) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(base.glob("ap*-h*/*/rank*/slot*/marker.json"))
        if found:
            return found[0]
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no snapshot under {base} after {timeout_s} s")


def _no_leftovers(base: Path, tmp_path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while worker_processes(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker_processes(str(tmp_path)) == []
    assert sorted(p.name for p in base.iterdir()) == [] if base.exists() else True


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); test_kill checks a killed run leaves nothing
def test_ctrl_c_of_the_parent_leaves_no_snapshots(tmp_path):
    base = tmp_path / "shm"
    proc = _start(tmp_path, base, [])
    try:
        marker = _wait_for_snapshot(base, proc)
        assert marker.relative_to(base).parts[0].endswith("-h0")  # the run's own root below the base
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    _no_leftovers(base, tmp_path)


@pytest.mark.slow
def test_a_killed_parent_leaves_snapshots_that_the_stale_cleanup_removes(tmp_path):
    base = tmp_path / "shm"
    proc = _start(tmp_path, base, [])
    try:
        marker = _wait_for_snapshot(base, proc)
        os.kill(proc.pid, signal.SIGKILL)  # no teardown at all
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    prefix = marker.relative_to(base).parts[0].split("-")[0]
    assert (base / f"{prefix}-h0").exists()
    cli = [sys.executable, "-m", "harness.faults.netns"]
    listed = subprocess.run([*cli, "list"], env=_env(base), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert prefix in listed.stdout.split(), listed
    left = subprocess.run(
        [*cli, "leftovers", prefix], env=_env(base), capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert f"snapshots {base / (prefix + '-h0')}" in left.stdout
    done = subprocess.run(
        [*cli, "cleanup", prefix], env=_env(base), capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0 and f"removed snapshots {base / (prefix + '-h0')}" in done.stdout, done
    # Ranks orphaned by the parent (if any still run: they stop once their control store is gone) are
    # found by their job tag and killed before their root is removed.
    _no_leftovers(base, tmp_path)


@pytest.mark.slow
def test_a_rank_kill_healed_in_memory_leaves_no_snapshots(tmp_path):
    base = tmp_path / "shm"
    run_dir = tmp_path / "kill"
    args = [
        *TINY,
        "train.steps=10",
        "strategy=accelpact_heal",
        "fault=kill",
        "fault.ranks=[1]",
        "fault.at_step=5",
        f"hydra.run.dir={run_dir}",
    ]
    from harness_test_helpers import harness_cmd

    done = subprocess.run(
        harness_cmd(args, tmp_path), cwd=tmp_path, env=_env(base), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert read_row(run_dir)["status"] == "ok"
    _no_leftovers(base, tmp_path)


def _netns_ok() -> tuple[bool, str]:
    from harness.faults.netns import namespaces_available

    return namespaces_available()


_OK, _WHY = _netns_ok()


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(not _OK, reason=_WHY)
def test_host_loss_heals_from_buddy_replicas_bit_identically_and_leaves_nothing(tmp_path):
    """cluster=local_hosts, 4 ranks on 2 hosts: host 1 (ranks 2, 3) is lost at step 5; its replacements heal
    from the replicas on host 0, the run ends bit-identical to the fault-free run on the same hosts."""
    from harness_test_helpers import harness_cmd

    base = tmp_path / "shm"
    common = [
        *TINY,
        "train.steps=10",
        "strategy=accelpact_heal",
        "cluster=local_hosts",
        "cluster.world_size=4",
        "cluster.hosts=2",
    ]
    rows = {}
    for name, fault in (
        ("ref", ["fault=none"]),
        ("host_loss", ["fault=host_loss", "fault.ranks=[3]", "fault.at_step=5", "fault.phase=vote"]),
    ):
        done = subprocess.run(
            harness_cmd([*common, *fault, f"hydra.run.dir={tmp_path / name}"], tmp_path),
            cwd=tmp_path,
            env=_env(base),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        rows[name] = read_row(tmp_path / name)
    assert rows["host_loss"]["status"] == "ok" and rows["host_loss"]["fallback"] is False
    assert rows["host_loss"]["state_hash"] == rows["ref"]["state_hash"]
    import json

    heals = [
        json.loads(line)
        for p in (tmp_path / "host_loss" / "events").glob("*.jsonl")
        for line in p.read_text().splitlines()
        if '"heal"' in line
    ]
    assert {h["rank"]: h["source"] for h in heals if h.get("role") == "replacement"} == {2: "buddy", 3: "buddy"}
    _no_leftovers(base, tmp_path)
