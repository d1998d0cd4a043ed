"""HSDP (``cluster.replicate``): the mesh layout, its validation, the memory plan, and each rank's initial shard.

Fast units. The runs on a real 2x2 mesh (every strategy of experiment=peers, faults, bit-identity against
the fault-free HSDP reference) are in test_hsdp.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.app.validate import ConfigError, check_values
from harness.machine import GiB, Machine
from harness.parent.memory_plan import plan
from harness.rank.mesh import MESH_DIM_NAMES, mesh_layout
from harness.schema import ClusterConfig, ModelConfig, RunConfig, StrategyConfig
from harness.strategies.torchft_config import TorchftConfig


def _run(world: int, replicate: int, strategy: str = "none", group_size: int = 1) -> RunConfig:
    return RunConfig(
        cluster=ClusterConfig(world_size=world, replicate=replicate),
        strategy=TorchftConfig(name=strategy, group_size=group_size) if strategy == "torchft" else StrategyConfig(),
    )


def test_layout_is_init_device_mesh_row_major_order():
    hsdp = mesh_layout(4, 2)
    assert hsdp.shape == (2, 2) and hsdp.dim_names == MESH_DIM_NAMES
    # [[0, 1], [2, 3]]: ranks 0 and 2 hold the same shard, in replicas 0 and 1.
    assert [hsdp.shard_index(r) for r in range(4)] == [0, 1, 0, 1]
    assert [hsdp.replica_index(r) for r in range(4)] == [0, 0, 1, 1]
    flat = mesh_layout(4)
    assert flat.shape == (4,) and flat.dim_names is None
    assert [flat.shard_index(r) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        mesh_layout(4, 3)


@pytest.mark.parametrize(
    "world,replicate,fix",
    [
        (4, 3, "cluster.replicate=2"),
        (4, 0, "cluster.replicate=1"),
        (4, 8, "cluster.replicate=4"),
        (6, 4, "cluster.replicate=3"),
    ],
)
def test_a_replicate_that_does_not_divide_the_world_is_refused_naming_the_fix(world, replicate, fix):
    with pytest.raises(ConfigError) as err:
        check_values(_run(world, replicate))
    message = str(err.value)
    assert "\n" not in message and f"`{fix}`" in message and f"cluster.world_size={world}" in message
    check_values(_run(world, int(fix.rsplit("=", 1)[1])))  # the suggested fix validates


@pytest.mark.parametrize("world,replicate", [(4, 2), (4, 4), (4, 1), (2, 2)])
def test_a_replicate_that_divides_the_world_is_accepted(world, replicate):
    check_values(_run(world, replicate))


def test_torchft_replica_groups_must_be_the_replicate_dimension():
    from harness.strategies.torchft_check import check_runnable

    with pytest.raises(ConfigError) as err:
        check_runnable(_run(4, 2, "torchft", group_size=1))
    assert "`strategy.group_size=2`" in str(err.value) and "\n" not in str(err.value)
    pytest.importorskip("torchft")
    check_runnable(_run(4, 2, "torchft", group_size=2))
    check_runnable(_run(4, 1, "torchft", group_size=2))  # plain FSDP reference: torchft's groups are its own


def test_the_memory_plan_shards_within_a_replica_only():
    machine = Machine(cpu_cores=64, mem_available=512 * GiB)
    model = ModelConfig(num_layers=2)
    flat = plan(dataclasses.replace(_run(4, 1), model=model), machine)
    hsdp = plan(dataclasses.replace(_run(4, 2), model=model), machine)
    row = "parameters (fp32, sharded)"
    assert dict(hsdp.rows)[row] == pytest.approx(2 * dict(flat.rows)[row], rel=1e-3)


@pytest.fixture
def fake_world():
    """A one-process 'fake' process group of 4 ranks: enough to build a 2x2 DeviceMesh and shard a model
    (no collective runs while the parameters get their initial values)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(rank: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_each_rank_starts_with_its_shard_of_the_seeded_full_value(fake_world, rank):
    """Under HSDP every parameter is Replicate() x Shard(0): rank r holds chunk r % 2 of the same seeded
    full value a 1-D mesh would cut (so the initial model does not depend on the mesh)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from harness.models import build_model, full_init_value

    fake_world(rank)
    layout = mesh_layout(4, 2)
    # Dimension names of this rank's own: DTensor caches specs by mesh equality (which ignores the rank),
    # and this one process plays every rank in turn.
    mesh = init_device_mesh("cpu", layout.shape, mesh_dim_names=(f"replicate{rank}", f"shard{rank}"))
    model = build_model(
        ModelConfig(num_layers=1, vocab_size=64, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2),
        seed=3,
        mesh=mesh,
        device=torch.device("cpu"),
    )
    checked = 0
    for name, param in model.named_parameters():
        assert [p.is_shard() for p in param.placements] == [False, True], name
        full = full_init_value(name, param.shape, 3, torch.device("cpu"))
        expected = torch.chunk(full, layout.shard, dim=0)[layout.shard_index(rank)]
        assert torch.equal(param.to_local(), expected), name
        checked += 1
    assert checked > 5
