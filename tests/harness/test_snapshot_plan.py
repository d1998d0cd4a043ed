"""Snapshots in the memory plan and at start: 2 own slots + 2 buddy replicas per rank are stated in the
plan (sized from the model's parameter count), a plan they push over the host's memory is refused before
training, a shared-memory filesystem too small for them is refused with the sizes and the fix, and the
snapshot settings are validated. The last test mounts a real 8 MiB tmpfs and runs the CLI against it."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest
from harness_test_helpers import harness_cmd, harness_env

from harness.app.config import compose, load_catalogue, to_run_config
from harness.app.validate import ConfigError, check_values, validate
from harness.machine import GiB, Machine, snapshot_space
from harness.parent.memory_plan import FP32, SNAPSHOT_META_BYTES, plan
from harness.strategies.accelpact_heal import SPEC


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue()


def _run(*overrides: str):
    return to_run_config(compose(["experiment=smoke", *overrides]))


BIG = Machine(cpu_cores=8, mem_available=64 * GiB, shm_free=32 * GiB)


def test_plan_states_two_own_slots_and_two_replicas_per_rank(catalogue):
    run = _run("strategy=accelpact_heal", "cluster.world_size=2")
    assert run.strategy.snapshot.every == 1
    counts = catalogue.counts(run.model)
    p = plan(run, BIG, counts)
    rows = dict(p.rows)
    slot = 3 * -(-counts.total // 2) * FP32 + SNAPSHOT_META_BYTES  # params + 2 AdamW moments, one shard
    assert rows["snapshots: 2 own slots (shared memory)"] == 2 * slot
    assert rows["snapshots: 2 buddy replicas (shared memory)"] == 2 * slot
    assert p.snapshot_per_rank == 4 * slot
    assert "snapshots: 2 buddy replicas" in p.table()
    off = plan(_run("strategy=accelpact_heal", "strategy.snapshot.every=0"), BIG, counts)
    assert off.snapshot_per_rank == 0 and off.per_host == p.per_host - 4 * slot * p.ranks_on_host
    no_rep = plan(_run("strategy=accelpact_heal", "strategy.snapshot.replicas=false"), BIG, counts)
    assert no_rep.snapshot_per_rank == 2 * slot
    assert plan(_run("strategy=cold_restart"), BIG, counts).snapshot_per_rank == 0


def test_a_plan_that_snapshots_push_over_host_memory_is_refused_before_training(catalogue):
    run = _run("strategy=accelpact_heal", "model=mistral_small")
    counts = catalogue.counts(run.model)
    without = plan(_run("strategy=accelpact_heal", "model=mistral_small", "strategy.snapshot.every=0"), BIG, counts)
    with_snap = plan(run, BIG, counts)
    # A host with room for the run but not for its snapshots.
    host = Machine(
        cpu_cores=8, mem_available=int((without.per_host + with_snap.per_host) / 2 / 0.85), shm_free=32 * GiB
    )
    assert plan(
        dataclasses.replace(
            run,
            strategy=dataclasses.replace(run.strategy, snapshot=dataclasses.replace(run.strategy.snapshot, every=0)),
        ),
        host,
        counts,
    ).fits
    assert not plan(run, host, counts).fits
    with pytest.raises(ConfigError) as info:
        validate(run, host, catalogue, ["strategy=accelpact_heal", "model=mistral_small"])
    assert "needs" in str(info.value) and "GiB of host memory" in str(info.value)
    assert info.value.memory_plan is not None and "snapshots: 2 own slots" in info.value.memory_plan.table()


def test_shared_memory_too_small_is_refused_with_the_sizes_and_the_fix(catalogue):
    run = _run("strategy=accelpact_heal")
    tiny = Machine(cpu_cores=8, mem_available=64 * GiB, shm_free=1 << 20, shm_path="/dev/shm")
    with pytest.raises(ConfigError) as info:
        validate(run, tiny, catalogue)
    msg = str(info.value)
    assert msg.startswith("snapshots need ") and "in /dev/shm (2 rank(s) x " in msg
    assert "0.00 GiB free there: DOES NOT FIT" in msg and "`strategy.snapshot.every=0`" in msg
    validate(_run("strategy=accelpact_heal", "strategy.snapshot.every=0"), tiny, catalogue)  # off: no shm needed
    validate(run, dataclasses.replace(tiny, shm_free=None), catalogue)  # not probed: the plan alone decides


@pytest.mark.parametrize(
    "override, needle",
    [
        ("strategy.snapshot.every=-1", "strategy.snapshot.every=-1 must be >= 0"),
        ("strategy.snapshot.push_every=0", "strategy.snapshot.push_every=0 must be >= 1"),
        ("strategy.hot_spares=-2", "strategy.hot_spares=-2 must be >= 0"),
        ("strategy.replacement_timeout_s=0", "strategy.replacement_timeout_s=0.0 must be positive"),
    ],
)
def test_snapshot_settings_are_checked(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        _check(_run("strategy=accelpact_heal", override))


def _check(run):
    """The value checks validation runs: the common ones, then the strategy's own (its spec's ``check``)."""
    check_values(run)
    SPEC.check(run)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("strategy.snapshot.max_tax=1.5", "strategy.snapshot.max_tax=1.5: give the budget as a fraction"),
        ("strategy.snapshot.max_bound=0", "strategy.snapshot.max_bound=0 is below the warm-up cadence"),
        ("strategy.snapshot.tax_warmup=0", "strategy.snapshot.tax_warmup=0: measure at least 1 step"),
    ],
)
def test_tax_budget_settings_are_checked_by_the_strategy(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.") + r".*max_tax=null"):
        SPEC.check(_run("strategy=accelpact_heal", override))
    SPEC.check(_run("strategy=accelpact_heal"))  # the default budget passes


def test_push_settings_need_replicas_and_default_to_every_snapshot():
    run = _run("strategy=accelpact_heal")
    assert (run.strategy.snapshot.push_every, run.strategy.snapshot.confirm_push) == (1, False)
    # every snapshot pushed during the warm-up; then the tax budget's cadence (docs/snapshots.md)
    assert (run.strategy.snapshot.max_tax, run.strategy.snapshot.max_bound) == (0.03, 16)
    SPEC.check(_run("strategy=accelpact_heal", "strategy.snapshot.max_tax=null"))
    with pytest.raises(ConfigError, match=r"push_every=2 .* replicas are off; try `strategy\.snapshot\.replicas=true`"):
        _check(_run("strategy=accelpact_heal", "strategy.snapshot.push_every=2", "strategy.snapshot.replicas=false"))
    _check(_run("strategy=accelpact_heal", "strategy.snapshot.push_every=4", "strategy.snapshot.confirm_push=true"))


def test_hot_spares_need_snapshots():
    fix = r"hot_spares=1 .* snapshots are off; try `strategy=accelpact_heal strategy\.snapshot\.every=1`"
    with pytest.raises(ConfigError, match=fix):
        check_values(_run("strategy=accelpact_heal", "strategy.hot_spares=1", "strategy.snapshot.every=0"))
    with pytest.raises(ConfigError, match=fix):  # a strategy without snapshot settings at all
        check_values(_run("strategy=cold_restart", "strategy.hot_spares=1"))
    check_values(_run("strategy=accelpact_heal", "strategy.hot_spares=1"))


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); mounts a tmpfs; the plan's unit tests stay
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_cli_refuses_a_real_tmpfs_too_small_for_the_snapshots(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(shm)], check=True)
    try:
        env = {**harness_env(), "ACCELPACT_SNAPSHOT_ROOT": str(shm / "accelpact")}
        assert snapshot_space.__doc__  # the probe walks up to the tmpfs mount from the missing root
        done = subprocess.run(
            harness_cmd(
                ["--validate-only", "experiment=smoke", "strategy=accelpact_heal", "model=mistral_small"], tmp_path
            ),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert f"in {shm / 'accelpact'} (2 rank(s) x" in line and "GiB free there: DOES NOT FIT" in line, line
        ok = subprocess.run(
            harness_cmd(
                [
                    "--validate-only",
                    "experiment=smoke",
                    "strategy=accelpact_heal",
                    "model=mistral_small",
                    "strategy.snapshot.every=0",
                ],
                tmp_path,
            ),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ok.returncode == 0, ok.stderr
    finally:
        subprocess.run(["umount", str(shm)], check=False)
