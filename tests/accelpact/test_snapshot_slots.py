"""Snapshot slots as files: markers, validation, the double buffer, crash safety, sizing, clean-up.

Single-process (a plain module and AdamW, no process group): the file logic is the same as under
FSDP2, which tests/accelpact/test_snapshot_fsdp2.py covers on 2 real ranks. The crash test SIGKILLs
a real process halfway through writing a slot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from accelpact.snapshot import (
    SnapshotConfig,
    SnapshotError,
    SnapshotMissingError,
    Snapshotter,
    remove_job,
    restore_latest,
)
from accelpact.snapshot.layout import check_token, slot_dir
from accelpact.snapshot.load import check_slot
from accelpact.snapshot.slots import read_marker
from accelpact.snapshot.state import check_supported

sys.path.insert(0, str(Path(__file__).parent))
from _snapshot_child import build, train_step

ROOT = Path(__file__).resolve().parents[2]


def _states_equal(a: torch.nn.Module, b: torch.nn.Module, oa: torch.optim.Optimizer, ob: torch.optim.Optimizer) -> bool:
    same = all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    return same and sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


@pytest.fixture
def trained(tmp_path):
    model, opt = build()
    snap = Snapshotter(model, opt, job_token="job-a", rank=0, world_size=1, config=SnapshotConfig(root=str(tmp_path)))
    for step in range(3):
        train_step(model, opt, step, snap)
    snap.flush()
    yield tmp_path, model, opt, snap
    snap.close()


def test_slots_alternate_and_hold_the_two_newest_steps(trained):
    root, _m, _o, snap = trained
    steps = {s: read_marker(slot_dir(root, "job-a", 0, s)).step for s in (0, 1)}
    assert steps == {0: 2, 1: 1}  # step 2 overwrote the older slot (step 0), never the newest
    assert snap.held_steps(verify=True) == [2, 1]
    marker = json.loads((slot_dir(root, "job-a", 0, 0) / "marker.json").read_text())
    for field in (
        "format",
        "job_token",
        "rank",
        "world_size",
        "step",
        "generation",
        "nbytes",
        "checksum",
        "written_at",
    ):
        assert field in marker
    assert marker["checksum"].startswith("crc32:") and marker["nbytes"] > 4 * 256 * 256 * 3


def test_a_slot_is_refused_for_another_token_rank_world_size_or_step(trained):
    root, _m, _o, _s = trained
    d = slot_dir(root, "job-a", 0, 0)
    assert check_slot(d, job_token="job-a", rank=0, world_size=1, step=2)[1] is None
    assert "job token" in check_slot(d, job_token="job-b", rank=0, world_size=1)[1]
    assert "rank 0, expected 1" in check_slot(d, job_token="job-a", rank=1, world_size=1)[1]
    assert "world size 1, expected 4" in check_slot(d, job_token="job-a", rank=0, world_size=4)[1]
    assert "step 2, expected 1" in check_slot(d, job_token="job-a", rank=0, step=1)[1]


def test_missing_step_names_the_held_steps(trained):
    _root, _m, _o, snap = trained
    with pytest.raises(SnapshotMissingError, match=r"no valid snapshot of step 0 .*held: \[2, 1\]") as info:
        snap.restore(0)
    assert info.value.held == [2, 1]


def test_a_corrupt_slot_is_refused_and_restore_latest_takes_the_other(trained):
    root, model, opt, snap = trained
    newest = slot_dir(root, "job-a", 0, 0)
    with open(newest / "shards.bin", "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 1]))
    assert "corrupt" in check_slot(newest, job_token="job-a", rank=0)[1]
    with pytest.raises(SnapshotError, match="crc32"):
        snap.restore(2)
    # The older slot (step 1) restores into a fresh model and optimizer; from there, step 2 again
    # reproduces the live model exactly.
    fresh, fopt = build()
    info = restore_latest(fresh, fopt, job_token="job-a", rank=0, config=SnapshotConfig(root=str(root)))
    assert (info.step, info.source) == (1, "own")
    train_step(fresh, fopt, 2, None)
    assert _states_equal(model, fresh, opt, fopt)


def test_no_snapshot_means_a_fresh_start(tmp_path):
    model, opt = build()
    assert restore_latest(model, opt, job_token="job-none", rank=0, config=SnapshotConfig(root=str(tmp_path))) is None


def test_sigkill_during_the_copy_leaves_the_newest_complete_snapshot(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    root = tmp_path / "shm"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_snapshot_child.py")), str(root), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        target = slot_dir(root, "killed-job", 0, 0)  # step 2 goes to the older slot, which holds step 0
        old = read_marker(target)
        assert old.step == 0
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "copying 2"
        deadline = time.time() + 30
        while (target / "marker.json").exists() and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the copy is now paused halfway (for 120 s)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not (target / "marker.json").exists()
    # The payload really was half rewritten: its bytes no longer match step 0's checksum.
    from accelpact.snapshot.slots import crc32_file

    assert crc32_file(target / "shards.bin")[1] != old.files["shards.bin"]["crc32"]
    fresh, fopt = build()
    info = restore_latest(fresh, fopt, job_token="killed-job", rank=0, config=SnapshotConfig(root=str(root)))
    assert info.step == 1 and info.extra_state == {"pos": "after"}
    saved = torch.load(out / "step1.pt", weights_only=True)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in saved["state"].items())
    ref = saved["optim"]["state"]
    got = fopt.state_dict()["state"]
    assert ref.keys() == got.keys() and all(torch.equal(ref[i][k], got[i][k]) for i in ref for k in ref[i])
    assert torch.equal(torch.get_rng_state(), saved["rng"])


def test_room_check_refuses_a_plan_that_does_not_fit_with_the_sizes(tmp_path):
    model, opt = build()
    with pytest.raises(SnapshotError, match=r"snapshots need .* GiB in .*4 x .* per rank.*DOES NOT FIT.*shm-size"):
        Snapshotter(
            model,
            opt,
            job_token="job-big",
            rank=0,
            world_size=1,
            config=SnapshotConfig(root=str(tmp_path), ranks_sharing_root=10**9),
        )


def test_close_remove_and_remove_job_leave_nothing(tmp_path):
    model, opt = build()
    for rank in (0, 1):
        snap = Snapshotter(
            model, opt, job_token="job-c", rank=rank, world_size=2, config=SnapshotConfig(root=str(tmp_path))
        )
        train_step(model, opt, 0, snap)
        snap.close(remove=rank == 0)
    assert not (tmp_path / "job-c" / "rank0").exists() and (tmp_path / "job-c" / "rank1").exists()
    assert remove_job(tmp_path, "job-c") and not (tmp_path / "job-c").exists()
    assert not remove_job(tmp_path, "job-c")


def test_bad_tokens_and_fsdp1_flat_parameters_are_refused():
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="cannot name a snapshot directory"):
            check_token(bad)

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._flat_param = torch.nn.Parameter(torch.zeros(4))

    with pytest.raises(SnapshotError, match="do not support FSDP1"):
        check_supported(Flat())


def test_the_cleanup_command_lists_and_removes_a_killed_jobs_snapshots(tmp_path, capsys):
    from accelpact.snapshot.__main__ import main as cli

    model, opt = build()
    snap = Snapshotter(
        model, opt, job_token="job-killed", rank=0, world_size=1, config=SnapshotConfig(root=str(tmp_path))
    )
    train_step(model, opt, 0, snap)
    snap.flush()  # no close: as a SIGKILLed job leaves it
    assert cli(["--root", str(tmp_path), "list"]) == 0
    assert "job-killed  ranks=rank0  newest_step=0" in capsys.readouterr().out
    cli(["--root", str(tmp_path), "cleanup", "--idle-s", "3600"])
    assert capsys.readouterr().out == ""  # written just now: not idle
    cli(["--root", str(tmp_path), "cleanup", "job-killed"])
    assert "removed" in capsys.readouterr().out and not (tmp_path / "job-killed").exists()


def test_restore_latest_fetches_the_buddys_replica_when_the_own_slots_are_gone(trained, tmp_path_factory):
    import shutil

    root, model, opt, snap = trained
    replicas = tmp_path_factory.mktemp("buddy")  # what a buddy would hold: copies of both slots
    for s in (0, 1):
        shutil.copytree(slot_dir(root, "job-a", 0, s), replicas / f"slot{s}")
    shutil.rmtree(root / "job-a" / "rank0")  # the host's shared memory is gone
    calls = []

    def fetch(src_rank, dest, step=None):
        calls.append((src_rank, step))
        held = {read_marker(replicas / f"slot{s}").step: replicas / f"slot{s}" for s in (0, 1)}
        src = held.get(step if step is not None else max(held))
        if src is None:
            return None
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)
        return json.loads((dest / "marker.json").read_text())

    fresh, fopt = build()
    info = restore_latest(fresh, fopt, job_token="job-a", rank=0, config=SnapshotConfig(root=str(root)), fetch=fetch)
    assert (info.step, info.source) == (2, "buddy") and calls == [(0, None)]
    assert _states_equal(model, fresh, opt, fopt)


def test_before_update_returns_only_once_the_previous_snapshot_is_complete(tmp_path):
    """The heal's at-most-one-step argument: a rank that passed before_update (the guard calls it ahead
    of the next vote) holds a valid slot of the previous step, even with a slow copy."""
    model, opt = build()
    snap = Snapshotter(
        model,
        opt,
        job_token="job-d",
        rank=0,
        world_size=1,
        config=SnapshotConfig(root=str(tmp_path), pause_mid_copy_s=0.5),
    )
    train_step(model, opt, 0, snap)
    assert snap.held_steps() == [0]
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(1))
    (model(x) + torch.randn(8, 256)).pow(2).mean().backward()
    snap.before_update()  # a copy of step 0 would still be paused here if it were not waited for
    opt.step()
    opt.zero_grad(set_to_none=True)
    snap.after_commit(1)
    snap.before_update()
    assert read_marker(slot_dir(tmp_path, "job-d", 0, 1)).step == 1 and snap.last_wait_s > 0.3
    snap.close(remove=True)


def test_a_slot_file_removed_and_recreated_under_a_live_mapping_gets_a_fresh_mapping(tmp_path):
    """The writer keeps each slot's payload mapped across steps; if the file is replaced underneath
    (a stale cleanup, an operator), the next snapshot must go into the new file, not the deleted inode."""
    from accelpact.snapshot.writer import PAYLOAD, PayloadMaps

    maps, slot = PayloadMaps(), tmp_path / "slot0"
    first = maps.get(slot, 64)
    assert maps.get(slot, 64) is first  # reused while the file is the mapped one
    (slot / PAYLOAD).unlink()
    (slot / PAYLOAD).write_bytes(bytes(64))  # the same size, a different inode
    second = maps.get(slot, 64)
    assert second is not first
    second.fill_(7)
    assert (slot / PAYLOAD).read_bytes() == bytes([7]) * 64  # the bytes land in the file on disk
