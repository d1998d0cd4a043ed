"""Typed run configuration: plain dataclasses, no Hydra, no OmegaConf.

These are the schemas Hydra type-checks every YAML value and command-line override against
(``harness.app.config`` registers them in the ConfigStore), and the same objects the Hydra-free rank
processes rebuild from ``worker_spec.json`` (``run_config_from_dict``). Closed vocabularies are
``str`` enums so OmegaConf rejects a typo with the list of valid values, and so they serialise
to JSON as their plain string.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Type, TypeVar


class ConfigError(ValueError):
    """A config this machine cannot run. ``str(err)`` is one line naming the override that fixes it.

    Here, at the bottom of the harness, so that the strategies' and fault kinds' own checks raise it
    without importing the app that validates; ``memory_plan``: the app's ``MemoryPlan`` when it made one."""

    def __init__(self, message: str, memory_plan: Any = None) -> None:
        super().__init__(message)
        self.memory_plan = memory_plan


class FaultPhase(str, Enum):
    forward_allgather_first = "forward_allgather_first"
    forward_allgather_middle = "forward_allgather_middle"
    backward_reduce_scatter = "backward_reduce_scatter"
    clip_allreduce = "clip_allreduce"
    vote = "vote"
    post_vote = "post_vote"  # the vote completed on this rank, its optimizer step not yet applied
    # Between steps (after step at_step committed), inside the user's own collectives: the evaluation
    # (train.eval_every) and a checkpoint save (checkpoint.interval), before their first collective.
    eval = "eval"
    checkpoint_save = "checkpoint_save"


class FaultSchedule(str, Enum):
    at_step = "at_step"
    at_age = "at_age"
    every = "every"
    random = "random"
    # One fault per event of a seeded trace drawn from a published failure mix (harness.fleet.trace): each
    # with the event's own kind, step and rank (fault.mix, fault.trace_faults, fault.seed; fault=mixed).
    trace = "trace"


# Functional form because `async` is a keyword, and OmegaConf matches overrides by member NAME.
CheckpointMode = Enum(
    "CheckpointMode",
    {"sync": "sync", "async": "async", "async_cached": "async_cached", "async_pinned": "async_pinned"},
    type=str,
)


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class RankLaunch(str, Enum):
    """How the parent starts the ranks: as its own child processes on this host, or as the tasks of one
    ``srun`` step across a Slurm allocation (rank, world size, local rank from Slurm's environment)."""

    local = "local"
    srun = "srun"


class ReplacementStart(str, Enum):
    """How the parent starts a replacement for a killed rank (heal in memory): ``template``: fork it from a
    process that imported everything at launch (harness.rank.template), falling back to ``spawn`` when that
    cannot work; ``spawn``: a fresh ``python -m harness.rank.worker`` (a whole Python + torch start)."""

    template = "template"
    spawn = "spawn"


class LinkPlane(str, Enum):
    """Which of a host's links a namespace fault acts on: the data plane (gloo/NCCL traffic) or the
    control plane (the out-of-band store), to test the control channel's own deadlines."""

    data = "data"
    control = "control"


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


@dataclass
class ModelConfig:
    """A Mistral-family decoder, built from these numbers with random init (never downloaded)."""

    name: str = "mistral_tiny"
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    max_position: int = 2048
    seq_len: int = 128
    batch_size: int = 4  # per rank
    rope_theta: float = 10000.0
    tie_embeddings: bool = False


@dataclass
class TrainConfig:
    steps: int = 25
    seed: int = 0
    lr: float = 3e-3
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0  # <= 0 disables clipping
    mixed_precision: Precision = Precision.fp32
    log_every: int = 5
    # Evaluate (a held-out batch's loss, all-reduced over the ranks: a collective outside the step) after
    # every eval_every-th step (0: never).
    eval_every: int = 0
    # A linear learning-rate warm-up over this many steps (torch LambdaLR, stepped after each committed
    # step; 0: a constant learning rate and no scheduler).
    warmup_steps: int = 0


@dataclass
class ClusterConfig:
    name: str = "local_cpu"
    # A name in accelpact's backend registry (accelpact.backends.BACKENDS); validation checks it and the
    # device against the backend's own ``devices``.
    backend: str = "gloo"
    device: Device = Device.cpu
    world_size: int = 2
    # HSDP: the size of the device mesh's replicate dimension (harness.rank.mesh). The model is FSDP-sharded
    # over world_size / replicate ranks inside each replica, its gradients all-reduced across the replicas.
    # 1: plain FSDP over the whole world.
    replicate: int = 1
    pg_timeout_s: float = 120.0
    master_addr: str = "127.0.0.1"
    # 0: every rank on this host, one network (local_cpu). N > 0: the ranks in N host network namespaces
    # (world_size / N each) with separate data and control networks (cluster=local_hosts; root only).
    hosts: int = 0
    # launch=srun: the ranks are srun tasks over `nodes` nodes of the Slurm allocation the parent runs in,
    # world_size / nodes per node; master_addr "auto" is the allocation's first node (cluster=slurm).
    launch: RankLaunch = RankLaunch.local
    nodes: int = 1
    # How a run's FIRST launch starts (harness.parent.launch_start): forked from a preloaded template (its
    # start is outside every goodput), or spawned. A relaunch after a fault always spawns: it is timed.
    first_launch: ReplacementStart = ReplacementStart.template


@dataclass
class StrategyConfig:
    """What every strategy has. A strategy with settings of its own subclasses this in its module
    (``StrategySpec.config``: accelpact's snapshots, torchft's replica groups), and ``strategy=NAME``
    composes against that class."""

    name: str = "none"  # a registered strategy (harness.strategies); checked at validation
    recovery_deadline_s: float = 60.0
    max_restarts: int = 20
    # accelpact's stall watchdog (accelpact/detection/watchdog.py): None = auto (10 s when the PG timeout is
    # longer, else off), 0 = off, else seconds; must be below cluster.pg_timeout_s.
    stall_timeout_s: Optional[float] = None
    # How long survivors wait for a replacement to arrive (a Python + torch + transformers start).
    replacement_timeout_s: float = 120.0
    hot_spares: int = 0  # pre-started processes that take the rank of the first death (0: none)
    # How a replacement process starts when no hot spare is left (harness.parent.template).
    replacement_start: ReplacementStart = ReplacementStart.template


C = TypeVar("C", bound=StrategyConfig)


def own_config(strategy: StrategyConfig, cls: Type[C], settings: str, owners: str) -> C:
    """``strategy`` as ``cls``, the config class of the strategies named in ``owners``; ConfigError when the
    config of another strategy (without those ``settings``) reaches their code."""
    if not isinstance(strategy, cls):
        raise ConfigError(
            f"strategy={strategy.name} has no {settings} settings ({type(strategy).__name__}); they belong to {owners}"
        )
    return strategy


@dataclass
class FaultConfig:
    kind: str = "none"  # a registered fault kind (harness.faults.registry); checked at validation
    phase: FaultPhase = FaultPhase.backward_reduce_scatter
    ranks: List[int] = field(default_factory=lambda: [0])
    schedule: FaultSchedule = FaultSchedule.at_step
    at_step: Optional[int] = None
    at_age: Optional[int] = None
    every: Optional[int] = None
    count: int = 1
    seed: int = 0
    outage_s: float = 8.0
    link: LinkPlane = LinkPlane.data  # namespace faults: cut the host's data link or its control link
    # fault.schedule=trace: the mix the trace is drawn from (harness.fleet.mixes) and how many faults it
    # expects over the run (seeded by fault.seed; drawn over cluster.world_size ranks).
    mix: str = "llama3"
    trace_faults: float = 10.0


@dataclass
class CheckpointConfig:
    interval: int = 0  # optimizer steps between saves; 0 = never
    mode: CheckpointMode = CheckpointMode.sync
    dir: Optional[str] = None  # None = <run_dir>/checkpoints
    keep: int = 2


@dataclass
class CompareConfig:
    """A comparison sweep (``hydra/sweeper=trials``): how many interleaved rounds, and this run's round."""

    trials: int = 1  # rounds; each runs the reference and every strategy once (harness.report.trials)
    trial: int = 0  # set by the sweeper on each run: the round it belongs to
    # How each cell's interval is drawn (harness.report.intervals.METHODS) and the level it aims at; the
    # table prints the coverage each interval really has.
    interval: str = "order_statistic"
    level: float = 0.95
    # The verdict's minimum effect: "better" only when the whole interval of the measured gain lies above 1 + this.
    min_effect: float = 0.02
    # The strategy whose gain over the others the table reports (None: the in-memory strategy in the sweep).
    ours: Optional[str] = None


@dataclass
class RunConfig:
    name: str = "smoke"  # the name of the conf/experiment preset this run came from (the row's "experiment")
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    # Settings that only some of a sweep's strategies have, by strategy name: each entry is merged over
    # ``strategy`` when that strategy runs (``per_strategy.torchft.group_size=2``), and checked against its
    # config class whichever strategy runs (harness.app.config.to_run_config).
    per_strategy: Dict[str, Any] = field(default_factory=dict)
    # Rows of every run are collected here (relative paths are relative to the working directory).
    index_path: str = "outputs/index.csv"
    progress: bool = True


T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    """A JSON-ready dict of a config dataclass (enums become their string values)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(cls: Type[T], data: dict[str, Any]) -> T:
    """Inverse of ``to_dict`` for one dataclass; unknown keys are an error, missing keys keep defaults."""
    hints = _resolved_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value)  # type: ignore[arg-type]
        elif isinstance(tp, type) and issubclass(tp, Enum):
            kwargs[key] = tp(value)
        elif isinstance(value, list):
            kwargs[key] = list(value)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def run_config_from_dict(
    data: dict[str, Any], strategy_config: Callable[[str], Type[StrategyConfig]] = lambda name: StrategyConfig
) -> RunConfig:
    """The RunConfig of ``to_dict``'s output; ``strategy_config(name)``: the config class of the named strategy
    (``harness.strategies.config_class``), which its ``strategy`` entry is read into."""
    rest = {k: v for k, v in data.items() if k != "strategy"}
    run = from_dict(RunConfig, rest)
    if "strategy" in data:
        strategy = data["strategy"]
        run.strategy = from_dict(strategy_config(strategy.get("name", StrategyConfig.name)), strategy)
    return run


def _resolved_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)
