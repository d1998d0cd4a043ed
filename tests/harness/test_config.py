"""Composition of every shipped config, schema type-checking, model sizes, validation rules."""

from __future__ import annotations

import dataclasses

import pytest

from harness.app.config import compose, group_options, load_catalogue, to_run_config
from harness.app.preflight import check_overrides, explain_compose_error
from harness.app.validate import ConfigError, check_values, validate
from harness.machine import GiB, Machine, probe
from harness.parent.memory_plan import plan
from harness.schema import Device, RunConfig, run_config_from_dict, to_dict

EXPERIMENTS = group_options("experiment")


@pytest.fixture(scope="module")
def catalogue():
    return load_catalogue()


def test_all_paper_experiments_ship():
    assert {"smoke", "mistral7b_age5", "mistral7b_age18", "decoder1b2_ckpt_overhead"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates_or_names_a_fitting_command(experiment, catalogue):
    run = to_run_config(compose([f"experiment={experiment}"]))
    assert run.name == experiment
    machine = probe(with_gpus=False)
    try:
        memory = validate(run, machine, catalogue, [f"experiment={experiment}"])
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message
        # The suggested command must itself compose and validate here, with the same protocol.
        suggested = message.rsplit("`python -m harness ", 1)[1].rstrip("`").split()
        fixed = to_run_config(compose(suggested))
        validate(fixed, machine, catalogue, suggested)
        assert (fixed.strategy, fixed.fault, fixed.checkpoint, fixed.train.steps) == (
            run.strategy,
            run.fault,
            run.checkpoint,
            run.train.steps,
        )
        return
    assert memory.fits


def test_mistral7b_never_fits_this_small_host_and_says_so(catalogue):
    run = to_run_config(compose(["experiment=mistral7b_age18"]))
    machine = probe(with_gpus=False)
    if machine.mem_available > 400 * GiB:
        pytest.skip("a host this large may run it")
    with pytest.raises(ConfigError) as info:
        validate(run, machine, catalogue, ["experiment=mistral7b_age18"])
    assert info.value.memory_plan is not None and not info.value.memory_plan.fits
    assert "model=mistral7b" in str(info.value) and "experiment=mistral7b_age18" in str(info.value)


def test_model_sizes_on_meta(catalogue):
    sizes = {name: catalogue.counts(m).total for name, m in catalogue.models.items()}
    assert abs(sizes["mistral7b"] - 7.24e9) / 7.24e9 < 0.002
    assert abs(sizes["decoder1b2"] - 1.216e9) / 1.216e9 < 0.01
    assert 3e6 < sizes["mistral_tiny"] < 8e6
    assert sizes["mistral_tiny"] < sizes["mistral_small"] < sizes["decoder1b2"] < sizes["mistral7b"]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model=nope", "unknown model=nope"),
        ("train.steps=abc", "train.steps"),
        ("train.steps=1.5", "train.steps"),
        ("train.nope=1", "unknown key train.nope"),
        ("checkpoint.mode=fast", "async"),
        (
            "strategy.replacement_start=fork",
            "expected one of [template, spawn]; e.g. `strategy.replacement_start=template`",
        ),
    ],
)
def test_composition_errors_are_one_readable_line(override, fragment):
    with pytest.raises(Exception) as info:
        compose([override])
    message = explain_compose_error(info.value, [override])
    assert fragment in message and "\n" not in message


def test_schema_round_trips_through_json():
    from harness import strategies

    run = to_run_config(compose(["experiment=mistral7b_age5"]))
    assert run_config_from_dict(to_dict(run), strategies.config_class) == run


def test_checkpoint_mode_async_is_accepted():
    assert to_run_config(compose(["checkpoint=async"])).checkpoint.mode.value == "async"


# ---- validation rules against made-up machines (no probing) ---------------------------------

SMALL = Machine(cpu_cores=2, mem_available=24 * GiB)
GPU8 = Machine(cpu_cores=64, mem_available=1024 * GiB, gpu_mem=(80 * GiB,) * 8)


def _run(**cluster) -> RunConfig:
    run = RunConfig()
    run.cluster = dataclasses.replace(run.cluster, **cluster)
    return run


def test_steps_must_be_positive():
    run = RunConfig()
    run.train.steps = 0
    with pytest.raises(ConfigError, match=r"train\.steps=0.*`train\.steps=25`"):
        check_values(run)


def test_local_cpu_rank_limit_names_the_fix(catalogue):
    limit = SMALL.local_cpu_rank_limit()
    with pytest.raises(ConfigError) as info:
        validate(_run(world_size=limit + 1), SMALL, catalogue)
    assert f"cluster.world_size={limit}" in str(info.value)
    validate(_run(world_size=limit), SMALL, catalogue)


def test_nccl_without_gpus_points_to_local_cpu(catalogue):
    with pytest.raises(ConfigError, match="cluster=local_cpu"):
        validate(_run(name="single_node_gpu", backend="nccl", device=Device.cuda, world_size=2), SMALL, catalogue)


def test_backends_come_from_accelpacts_registry(catalogue):
    # Not an enum of the schema: a name accelpact's backend registry does not know is refused with the
    # registered ones, and a backend on a device it cannot carry is switched to one that can.
    with pytest.raises(
        ConfigError, match=r"cluster\.backend=mpi is not an accelpact backend \(registered: gloo, nccl[^)]*\)"
    ):
        validate(_run(backend="mpi"), SMALL, catalogue)
    with pytest.raises(ConfigError, match=r"cluster\.backend=nccl"):
        validate(_run(name="single_node_gpu", backend="gloo", device=Device.cuda, world_size=2), GPU8, catalogue)


def test_more_ranks_than_gpus(catalogue):
    with pytest.raises(ConfigError, match=r"needs 16 GPUs.*cluster\.world_size=8"):
        validate(_run(name="single_node_gpu", backend="nccl", device=Device.cuda, world_size=16), GPU8, catalogue)


def test_bf16_needs_gpu(catalogue):
    run = RunConfig()
    run.train.mixed_precision = run.train.mixed_precision.__class__("bf16")
    with pytest.raises(ConfigError, match="train.mixed_precision=fp32"):
        validate(run, SMALL, catalogue)


def test_mistral7b_fits_a_gpu_node_but_not_a_laptop(catalogue):
    gpu_run = _run(name="single_node_gpu", backend="nccl", device=Device.cuda, world_size=8)
    gpu_run.model = catalogue.models["mistral7b"]
    gpu_run.train.mixed_precision = gpu_run.train.mixed_precision.__class__("bf16")
    assert validate(gpu_run, GPU8, catalogue).fits
    cpu_run = RunConfig()
    cpu_run.model = catalogue.models["mistral7b"]
    with pytest.raises(ConfigError, match="model=mistral_small|model=mistral_tiny"):
        validate(cpu_run, SMALL, catalogue, ["model=mistral7b"])


def test_memory_plan_scales_with_world_size(catalogue):
    run = RunConfig()
    run.model = catalogue.models["decoder1b2"]
    two = plan(run, SMALL, catalogue.counts(run.model))
    run.cluster = dataclasses.replace(run.cluster, world_size=4)
    four = plan(run, SMALL, catalogue.counts(run.model))
    per_rank = lambda p, what: dict(p.rows)[what]  # noqa: E731
    assert per_rank(four, "AdamW exp_avg + exp_avg_sq (sharded)") < per_rank(
        two, "AdamW exp_avg + exp_avg_sq (sharded)"
    )
    assert "DOES NOT FIT" in two.table() or two.fits


def test_preflight_accepts_the_default():
    assert check_overrides([]).fits


def test_a_between_steps_phase_without_a_fixed_step_passes_the_phase_check():
    """fault.phase=eval with fault.at_age (no fault.at_step): the phase check has no step to check, and
    used to fail with TypeError (None + 1) instead of passing (found by mypy)."""
    from harness.app.validate import check_between_steps_phase
    from harness.schema import FaultPhase

    run = RunConfig()
    run = dataclasses.replace(
        run,
        fault=dataclasses.replace(run.fault, phase=FaultPhase.eval, at_step=None, at_age=2),
        train=dataclasses.replace(run.train, eval_every=2),
    )
    check_between_steps_phase(run)


def test_each_strategy_composes_against_its_own_config_class():
    """Strategy-owned config: torchft's settings exist under strategy=torchft only, accelpact's snapshots under
    accelpact's strategies only, and a rank rebuilds the same class from the JSON spec."""
    from harness import strategies

    for name in group_options("strategy"):
        run = to_run_config(compose([f"strategy={name}"]))
        assert type(run.strategy) is strategies.config_class(name), name
        assert run_config_from_dict(to_dict(run), strategies.config_class) == run, name
    torchft = to_run_config(compose(["strategy=torchft", "strategy.group_size=2"])).strategy
    assert not hasattr(torchft, "snapshot") and torchft.group_size == 2
    heal = to_run_config(compose(["strategy=accelpact_heal"])).strategy
    assert not hasattr(heal, "group_size") and heal.snapshot.every == 1
    override = "strategy.snapshot.every=2"
    with pytest.raises(Exception) as info:
        compose(["strategy=torchft", override])
    message = explain_compose_error(info.value, ["strategy=torchft", override])
    assert "unknown key strategy.snapshot" in message and "`++per_strategy.<strategy>.snapshot.every=2`" in message


def test_per_strategy_settings_apply_to_their_strategy_only_and_are_checked_in_every_run():
    sweep = ["++per_strategy.torchft.group_size=2", "++per_strategy.accelpact_heal.snapshot.max_tax=null"]
    torchft = to_run_config(compose(["strategy=torchft", *sweep])).strategy
    heal = to_run_config(compose(["strategy=accelpact_heal", *sweep])).strategy
    cold = to_run_config(compose(["strategy=cold_restart", *sweep])).strategy
    assert torchft.group_size == 2 and heal.snapshot.max_tax is None
    assert not hasattr(cold, "group_size") and not hasattr(cold, "snapshot")
    assert to_run_config(compose(["strategy=accelpact_heal"])).strategy.snapshot.max_tax == 0.03  # yaml default
    with pytest.raises(ConfigError, match=r"per_strategy\.torchft: Key 'snapshot' not in 'TorchftConfig'"):
        to_run_config(compose(["strategy=cold_restart", "++per_strategy.torchft.snapshot.every=1"]))
    with pytest.raises(ConfigError, match=r"per_strategy\.torchf: no strategy is registered under that name"):
        to_run_config(compose(["strategy=cold_restart", "++per_strategy.torchf.group_size=2"]))
