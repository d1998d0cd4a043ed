"""fault=kill_all: the whole job dies at once, and strategy=accelpact_heal restarts it from its snapshots.

- pure: the registry entry and its config, the relaunch policies, the results columns, and the strategies
  the harness refuses for it (torchft: no live replica group to heal from), with the fix named;
- real processes (``python -m harness``, 2 gloo ranks, mistral_tiny, a sync checkpoint after step 3): the
  parent SIGKILLs both ranks in step 5. accelpact_heal relaunches them and they resume from the newest
  snapshot both hold in shared memory: no checkpoint read, at most 1 step replayed, bit-identical to the
  fault-free reference (every parameter and optimizer shard, every step's loss). The same crash with rank
  1's own snapshots deleted by the parent (``HARNESS_KILL_ALL_LOSE_SNAPSHOTS=1:own``, what a lost host's
  shared memory would take) resumes rank 1 from its buddy's replica, still without the disk. With all its
  snapshots deleted (with replicas, its buddy's replica of them too) no complete, agreeing set is left: the
  relaunch reads the checkpoint from disk, ends bit-identical too, and a ``fallback`` event, a log line
  and the row say why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness_test_helpers import TINY, read_row, run_harness, worker_processes

from harness.events import read_events
from harness.faults import registry
from harness.identity import compare_runs

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
FAULT_STEP = 5
INTERVAL = 4  # a checkpoint after step 3: a disk restore replays step 4 (and the killed step 5)
BASE = [*TINY, f"train.steps={STEPS}", "checkpoint=sync", f"checkpoint.interval={INTERVAL}"]


# ---- pure -------------------------------------------------------------------------------------------
def test_kill_all_is_a_registered_parent_fault_that_kills_every_rank():
    spec = registry.get("kill_all")
    assert spec.where == "parent" and spec.kills_ranks and spec.kills_all and not spec.needs_root
    assert not registry.get("kill").kills_all and not registry.get("host_loss").kills_all
    assert "kind: kill_all" in (REPO / "conf" / "fault" / "kill_all.yaml").read_text()


def test_a_fault_that_kills_every_rank_must_say_it_kills_ranks():
    from harness.faults.spec import FaultSpec

    with pytest.raises(ValueError, match="kills_ranks=True"):
        FaultSpec("bad", "x", where="parent", parent_apply=lambda d, r: None, kills_all=True)


def test_a_whole_job_crash_is_a_group_restart_for_accelpact_heal_and_a_fallback_without_snapshots():
    from harness import strategies

    heal, plain = strategies.get("accelpact_heal"), strategies.get("accelpact")
    everyone = {0: -9, 1: -9}
    assert heal.relaunch(everyone, 1).startswith("group restart: every rank ([0, 1]) was killed")
    # Without snapshots the same crash is a fallback to the checkpoint, as before.
    assert plain.relaunch(everyone, 1).startswith("fallback to checkpoint restore")
    # A survivor that gave up: a fallback (the row says so), whose relaunch resumes from the snapshots first.
    assert heal.relaunch({0: 75, 1: -9}, 1) == (
        "fallback to a relaunch of every rank, resumed from the newest snapshot every rank holds (the checkpoint if "
        "they hold no agreeing set): rank(s) [1] killed by a signal, rank(s) [0] could not recover in memory"
    )
    assert heal.relaunch({0: 75, 1: 3}, 1).startswith("fallback to a relaunch")
    assert heal.relaunch({0: 1, 1: 3}, 1) is None  # failures of their own: no relaunch, as before
    assert heal.relaunch({0: 0, 1: 0}, None) is None
    for name in ("cold_restart", "checkpoint_restore"):
        assert strategies.get(name).relaunch(everyone, 1) is not None, name


def test_the_row_says_where_the_relaunch_resumed_from():
    from harness.report.results import detection_columns, heal_columns, restore_columns

    snap = {
        "kind": "restore",
        "t": 2.0,
        "rank": 0,
        "t_start": 1.0,
        "t_end": 2.0,
        "from_step": 4,
        "bytes": 100,
        "source": "snapshot",
    }
    disk = {"kind": "restore", "t": 3.0, "rank": 0, "t_start": 2.5, "t_end": 3.0, "from_step": 3, "bytes": 7000}
    assert restore_columns([snap, {**snap, "rank": 1}]) == {
        "restore_source": "snapshot",
        "restore_from_step": 4,
        "restore_disk_bytes": 0,
    }
    assert restore_columns([disk]) == {
        "restore_source": "checkpoint",
        "restore_from_step": 3,
        "restore_disk_bytes": 7000,
    }
    assert restore_columns([])["restore_source"] is None
    # After a heal that gave up, heal_source names where the relaunch resumed from.
    lost = {"kind": "fallback", "t": 1.5, "rank": 0, "reason": "no replacement", "detected_by": "heal"}
    assert heal_columns([lost, snap], fallback=True)["heal_source"] == "snapshot"
    assert heal_columns([lost, disk], fallback=True)["heal_source"] == "disk"
    assert heal_columns([lost], fallback=True)["heal_source"] == "disk"
    # A relaunched rank's fallback to the disk says why, but is no detection of the fault.
    fault = {"kind": "fault", "t": 1.0, "rank": -1, "fault": "kill_all", "step": 5, "ranks": [1]}
    fell = {"kind": "fallback", "t": 9.0, "rank": 0, "reason": "relaunch: ...", "detected_by": "relaunch"}
    assert detection_columns([fault, fell]) == {"detected_by": None, "detection_latency_s": None}


def test_no_replacement_template_is_started_when_nobody_is_left_to_heal_with():
    from harness.app.config import compose, to_run_config
    from harness.parent import template

    def run(fault):
        return to_run_config(
            compose(["experiment=smoke", "strategy=accelpact_heal", f"fault={fault}", "fault.at_step=3"])
        )

    assert template.wanted(run("kill")) and not template.wanted(run("kill_all"))


def test_torchft_is_refused_for_a_whole_job_crash_with_the_fix():
    from harness.app.capabilities import check_runnable
    from harness.app.config import compose, to_run_config
    from harness.schema import ConfigError

    run = to_run_config(
        compose(["experiment=smoke", "strategy=torchft", "cluster.world_size=2", "fault=kill_all", "fault.at_step=3"])
    )
    with pytest.raises(ConfigError, match="kills every rank at once") as err:
        check_runnable(run)
    assert "strategy=accelpact_heal,cold_restart,checkpoint_restore" in str(err.value)


# ---- real processes ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("kill_all")
    run_dir = tmp / "reference"
    done = run_harness([*BASE, f"hydra.run.dir={run_dir}"], tmp, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp, run_dir


def _losses(run_dir: Path) -> dict[tuple[int, int], float]:
    """(rank, step) -> the loss of that step's final execution on that rank."""
    final: dict[tuple[int, int], tuple[float, float]] = {}
    for e in read_events(run_dir):
        if e["kind"] == "step":
            key = (e["rank"], e["step"])
            if key not in final or e["t_start"] > final[key][0]:
                final[key] = (e["t_start"], e["loss"])
    return {k: v for k, (_, v) in final.items()}


def _kill_all(
    reference, name: str, env_extra: dict[str, str] | None = None, extra: tuple[str, ...] = ()
) -> tuple[Path, dict, list[dict]]:
    tmp, ref_dir = reference
    run_dir = tmp / name
    args = [
        *BASE,
        "strategy=accelpact_heal",
        "fault=kill_all",
        "fault.ranks=[1]",
        f"fault.at_step={FAULT_STEP}",
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    old = {k: os.environ.get(k) for k in (env_extra or {})}
    os.environ.update(env_extra or {})
    try:
        done = run_harness(args, tmp, timeout=500)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row, events = read_row(run_dir), read_events(run_dir)
    assert row["status"] == "ok", row["reason"]
    [fault] = [e for e in events if e["kind"] == "fault"]
    assert fault["fault"] == "kill_all" and fault["killed_ranks"] == [0, 1] and fault["step"] == FAULT_STEP
    # Every rank died at once: no replacement was started (no survivor to heal with), every rank relaunched.
    assert not [e for e in events if e["kind"] in ("replacement", "heal")]
    assert row["relaunches"] == 1
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()
    assert row["bit_identical"] in (None, True)
    assert _losses(run_dir) == _losses(ref_dir)
    assert worker_processes(str(tmp)) == []
    return run_dir, row, events


# Default suite: the acceptance of a whole-job restart from the snapshots (a reference and a run with a
# relaunch: ~1 min each at load 6 on the 2-core host; the reference is shared with the slow tests below).
@pytest.mark.timeout(900)
def test_a_whole_job_crash_resumes_from_the_snapshots_without_reading_the_disk(reference):
    run_dir, row, events = _kill_all(reference, "from_snapshots")
    restores = [e for e in events if e["kind"] == "restore"]
    assert {e["rank"] for e in restores} == {0, 1}
    assert {e.get("source") for e in restores} == {"snapshot"}, restores  # no checkpoint read
    [step] = {e["from_step"] for e in restores}  # the same step on every rank
    # The kill came in step 5: step 4's snapshot (or step 3's, if 4's copy had not completed) is the newest
    # every rank holds; at most the one step after it, 4, had committed before and is replayed.
    assert step in (FAULT_STEP - 1, FAULT_STEP - 2), step
    assert row["replayed_steps"] <= 1 and row["replayed_steps"] == FAULT_STEP - 1 - step, row["replayed_steps"]
    assert row["restore_source"] == "snapshot" and row["restore_disk_bytes"] == 0
    assert row["fallback"] is False, row["fallback_reason"]
    assert "group restart" in row["relaunch_reasons"]
    replays = {e["step"] for e in events if e["kind"] == "step" and e.get("replay")}
    assert replays == set(range(step + 1, FAULT_STEP)), replays


@pytest.mark.slow  # a run with a relaunch: ~1 min on the loaded 2-core host
@pytest.mark.timeout(900)
def test_a_rank_whose_own_snapshots_are_gone_resumes_from_its_buddys_replica(reference):
    from harness.faults.kill_all import LOSE_SNAPSHOTS

    # Rank 1's own slots go (a lost host's shared memory would take them); the replica on rank 0 stays.
    # Confirmed pushes: the replica of step 4 (or 3, while 4's push awaits its acknowledgement) is there.
    run_dir, row, events = _kill_all(
        reference, "buddy_replica", {LOSE_SNAPSHOTS: "1:own"}, ("strategy.snapshot.confirm_push=true",)
    )
    restores = {e["rank"]: e for e in events if e["kind"] == "restore"}
    assert set(restores) == {0, 1} and {e.get("source") for e in restores.values()} == {"snapshot"}, restores
    assert restores[1]["slot"] == "buddy" and restores[0]["slot"] == "own", restores
    [step] = {e["from_step"] for e in restores.values()}
    assert row["replayed_steps"] <= 1 and row["replayed_steps"] == FAULT_STEP - 1 - step
    assert row["restore_source"] == "snapshot" and row["restore_disk_bytes"] == 0
    assert row["fallback"] is False, row["fallback_reason"]


@pytest.mark.slow  # a run with a failed heal and a relaunch: ~1.5 min on the loaded 2-core host
@pytest.mark.timeout(900)
def test_the_relaunch_after_a_heal_that_gave_up_resumes_from_the_snapshots_too(reference):
    from harness.rank.strategies.heal import DIE_BEFORE_JOIN

    # fault=kill: rank 1's replacement fails on its own before joining, so the survivor gives up on the heal
    # and the parent relaunches every rank: they resume from the snapshots both ranks left, not from disk.
    tmp, ref_dir = reference
    run_dir = tmp / "heal_gave_up"
    old = os.environ.get(DIE_BEFORE_JOIN)
    os.environ[DIE_BEFORE_JOIN] = "1:exit"
    try:
        done = run_harness(
            [
                *BASE,
                "strategy=accelpact_heal",
                "fault=kill",
                "fault.ranks=[1]",
                "fault.phase=vote",
                f"fault.at_step={FAULT_STEP}",
                f"hydra.run.dir={run_dir}",
            ],
            tmp,
            timeout=600,
        )
    finally:
        os.environ.pop(DIE_BEFORE_JOIN, None) if old is None else os.environ.__setitem__(DIE_BEFORE_JOIN, old)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row, events = read_row(run_dir), read_events(run_dir)
    assert row["status"] == "ok" and row["fallback"] is True and row["relaunches"] == 1, row
    assert row["relaunch_reasons"].startswith("fallback to a relaunch of every rank"), row["relaunch_reasons"]
    restores = [e for e in events if e["kind"] == "restore"]
    assert {e["rank"] for e in restores} == {0, 1} and {e.get("source") for e in restores} == {"snapshot"}, restores
    assert row["heal_source"] == "snapshot" and row["restore_disk_bytes"] == 0, row["heal_source"]
    assert row["replayed_steps"] <= 1
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()
    assert _losses(run_dir) == _losses(ref_dir)
    assert worker_processes(str(tmp)) == []


@pytest.mark.slow  # a run with a relaunch: ~1.5 min on the loaded 2-core host
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "replicas,error",
    [
        ("true", "BuddyLostError"),  # rank 1's own snapshots and its buddy's replica of them are gone
        ("false", "SnapshotsDisagreeError"),  # no replicas: rank 0 holds snapshots, rank 1 none
    ],
)
def test_a_whole_job_crash_without_an_agreeing_set_of_snapshots_reads_the_disk_and_says_why(reference, replicas, error):
    from harness.faults.kill_all import LOSE_SNAPSHOTS

    run_dir, row, events = _kill_all(
        reference,
        f"lost_snapshots_replicas_{replicas}",
        {LOSE_SNAPSHOTS: "1"},
        (f"strategy.snapshot.replicas={replicas}",),
    )
    [fault] = [e for e in events if e["kind"] == "fault"]
    assert fault["lost_snapshots"] == ["1"]
    restores = [e for e in events if e["kind"] == "restore"]
    assert {e["rank"] for e in restores} == {0, 1} and not [e for e in restores if e.get("source")]
    assert {e["from_step"] for e in restores} == {INTERVAL - 1}  # the checkpoint
    fallbacks = [e for e in events if e["kind"] == "fallback"]
    assert {e["rank"] for e in fallbacks} == {0, 1} and {e["detected_by"] for e in fallbacks} == {"relaunch"}
    for e in fallbacks:  # named: rank 1 holds nothing (and, with replicas, neither does its buddy for it)
        assert e["reason"].startswith("relaunch: no complete, agreeing set of snapshots"), e["reason"]
        assert e["error"] == error and f"{error}: " in e["reason"], e["reason"]
        assert "1: []" in e["reason"], e["reason"]  # the steps each rank held: rank 1 none
    assert row["fallback"] is True and "no complete, agreeing set of snapshots" in row["fallback_reason"]
    assert row["restore_source"] == "checkpoint" and row["restore_disk_bytes"] > 0
    assert row["replayed_steps"] == FAULT_STEP - INTERVAL  # step 4, committed once, runs again
    logs = (run_dir / "logs" / "rank0.log").read_text(errors="replace")
    assert "no complete, agreeing set of snapshots" in logs
