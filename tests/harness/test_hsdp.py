"""HSDP 2x2 at world 4 (``cluster.replicate=2``), end to end: the sharding experiment=peers runs every strategy on.

Real runs (``python -m harness``, 4 gloo ranks, real faults), each compared bit for bit with one fault-free
HSDP reference: a socket reset under accelpact, cold_restart and NVRx's checkpoint_restore; a kill under
accelpact_heal (the heal's replacement builds its 2-D mesh from the survivors' groups) and GEMINI; a lost
host holding a whole replica under accelpact_heal (root: network namespaces); and
fault-free torchft with its replica groups as the replicate dimension.

All ``slow``: 4 ranks on this 2-core machine take 60-120 s a run under the usual load. The option and its
validation, and each rank's shard on a 2x2 mesh, are covered fast by test_hsdp_config.py; accelpact's
rebind on a 2-D mesh by tests/accelpact/test_patterns.py (its HSDP pattern).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_test_helpers import TINY, read_row, run_harness, worker_processes

from harness.events import read_events
from harness.identity import compare_runs, load_identity

pytestmark = pytest.mark.slow

STEPS = 8
FAULT_STEP = 5
HSDP = [
    *TINY,
    f"train.steps={STEPS}",
    "checkpoint=sync",
    "checkpoint.interval=4",
    "cluster.world_size=4",
    "cluster.replicate=2",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("hsdp")
    run_dir = tmp / "reference"
    done = run_harness([*HSDP, f"hydra.run.dir={run_dir}"], tmp, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp, run_dir


def _run(reference: tuple[Path, Path], name: str, *overrides: str) -> tuple[Path, dict]:
    tmp, ref_dir = reference
    run_dir = tmp / name
    done = run_harness([*HSDP, *overrides, f"hydra.run.dir={run_dir}"], tmp, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = read_row(run_dir)
    assert row["status"] == "ok", row["reason"]
    result = compare_runs(ref_dir, run_dir)
    assert result.equal, result.describe()
    assert worker_processes(str(tmp)) == []
    return run_dir, row


def test_the_reference_replicates_each_shard_across_the_replicate_dimension(reference):
    """Mesh [[0, 1], [2, 3]]: ranks 0 and 2 hold the same shards, ranks 0 and 1 different ones (plain FSDP
    over 4 ranks would give every rank its own quarter)."""
    records = load_identity(reference[1])
    assert [r["rank"] for r in records] == [0, 1, 2, 3] and all(r["ranks_agree"] for r in records)
    shards = [r["shards"] for r in records]
    assert shards[0] == shards[2] and shards[1] == shards[3]
    assert shards[0] != shards[1]


@pytest.mark.parametrize("strategy", ["accelpact", "cold_restart", "checkpoint_restore"])
def test_a_socket_reset_ends_bit_identical_to_the_hsdp_reference(reference, strategy):
    run_dir, row = _run(
        reference,
        f"{strategy}_reset",
        f"strategy={strategy}",
        "fault=socket_reset",
        f"fault.at_step={FAULT_STEP}",
        "fault.ranks=[1]",
    )
    events = read_events(run_dir)
    assert row["faults"] == 1
    if strategy == "accelpact":  # recovered in memory: rebuilt both mesh dimensions' groups, nothing replayed
        assert row["relaunches"] == 0 and row["replayed_steps"] == 0
        assert {e["rank"] for e in events if e["kind"] == "recovery"} == {0, 1, 2, 3}
    else:  # restarted (a relaunch, or NVRx's in-process restart) from the step-3 checkpoint: step 4 replayed
        assert row["replayed_steps"] >= 1
        assert [e for e in events if e["kind"] == "restore"]


def test_a_killed_rank_heals_in_memory_bit_identically(reference):
    run_dir, row = _run(
        reference,
        "heal_kill",
        "strategy=accelpact_heal",
        "fault=kill",
        f"fault.at_step={FAULT_STEP}",
        "fault.ranks=[1]",
    )
    events = read_events(run_dir)
    assert row["relaunches"] == 0 and row["fallback"] is False, row["fallback_reason"]
    assert not [e for e in events if e["kind"] == "restore"]
    healed = [e for e in events if e["kind"] == "heal"]
    assert {e["rank"] for e in healed} == {0, 1, 2, 3}
    assert {e["role"] for e in healed if e["rank"] == 1} == {"replacement"}


def test_a_lost_host_holding_a_whole_replica_heals_in_memory_bit_identically(reference):
    """Two hosts of two ranks: host 0 holds the replica [0, 1] whole, as HSDP across nodes usually places it.
    Its shard group has no survivor, so no survivor's plan carries it: the two replacements build it
    themselves (accelpact.recovery.rejoin_mesh) and heal from their buddies' replicas, with no disk read."""
    from harness.faults.netns import namespaces_available

    ok, why = namespaces_available()
    if not ok:
        pytest.skip(f"host loss needs network namespaces (root): {why}")
    run_dir, row = _run(
        reference,
        "heal_host_loss",
        "strategy=accelpact_heal",
        "cluster=local_hosts",
        "fault=host_loss",
        f"fault.at_step={FAULT_STEP}",
        "fault.ranks=[1]",
    )
    events = read_events(run_dir)
    assert row["relaunches"] == 0 and row["fallback"] is False, row["fallback_reason"]
    assert not [e for e in events if e["kind"] == "restore"]
    healed = [e for e in events if e["kind"] == "heal"]
    assert {e["role"] for e in healed if e["rank"] in (0, 1)} == {"replacement"}
    assert {e["rank"] for e in healed} == {0, 1, 2, 3}


def test_gemini_restarts_every_rank_from_its_in_memory_capture_bit_identically(reference):
    pytest.importorskip("lm_resiliency", reason="strategy=gemini needs the gemini extra: pip install -e '.[gemini]'")
    run_dir, row = _run(
        reference, "gemini_kill", "strategy=gemini", "fault=kill", f"fault.at_step={FAULT_STEP}", "fault.ranks=[1]"
    )
    assert row["relaunches"] == 1
    restores = [e for e in read_events(run_dir) if e["kind"] == "restore"]
    assert "gemini" in {e.get("source") for e in restores}


def test_fault_free_torchft_on_hsdp_groups_is_the_reference_bit_for_bit(reference):
    """torchft's replica groups as the replicate dimension (FSDP2 inside each, torchft's all-reduce across)
    compute what HSDP computes: without a fault the final state is the HSDP reference's."""
    pytest.importorskip("torchft")
    _run(reference, "torchft_none", "strategy=torchft", "strategy.group_size=2")
