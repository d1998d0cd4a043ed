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
from typing import Any, List, Optional, Type, TypeVar


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
class SnapshotSettings:
    """accelpact's per-step snapshots (accelpact.snapshot) and the in-memory heal of a lost rank."""

    every: int = 0  # snapshot every k committed steps; 0 = off (a lost rank then falls back to disk)
    replicas: bool = True  # also push each snapshot to the buddy rank (accelpact.snapshot.replica)
    # Push only every k-th snapshot (the steps divisible by every * push_every); a heal after a host loss
    # then replays up to every * push_every steps (docs/snapshots.md, "push_every"). 1: every snapshot.
    push_every: int = 1
    # A push counts as part of its snapshot: the next step's vote waits for the buddy's acknowledgement
    # (Replication(confirm=True)), which is what makes that bound hold when a push lags.
    confirm_push: bool = False
    pause_mid_copy_s: float = 0.0  # fault-injection tests only: each copy sleeps this long halfway
    # A budget for the protection's cost, a fraction of a step: every/push_every are then the warm-up's, and
    # after tax_warmup steps the ranks agree on the densest cadence that fits, replaying at most max_bound
    # steps after a host loss (accelpact.snapshot.tax_budget; docs/snapshots.md). None: a fixed cadence.
    max_tax: Optional[float] = None
    max_bound: int = 16
    tax_warmup: int = 8


@dataclass
class TorchftSettings:
    """strategy=torchft (harness.strategies.torchft_hsdp): replica groups, the Lighthouse, the Managers."""

    group_size: int = 1  # ranks per replica group: FSDP2 inside a group, torchft's all-reduce across groups
    min_replicas: int = 1  # the Lighthouse's min_replicas: 1 lets the healthy groups go on while one is out
    heartbeat_timeout_ms: int = 1000  # a silent group leaves the quorum after this long (torchft default 5000)
    quorum_tick_ms: int = 100
    join_timeout_ms: int = 60000
    timeout_s: float = 10.0  # torchft's collective / should_commit / heal timeout (Manager timeout)
    quorum_timeout_s: float = 60.0
    max_retries: int = 10  # consecutive discarded steps before a Manager gives up (its process then fails)


@dataclass
class StrategyConfig:
    name: str = "none"  # a registered strategy (harness.strategies); checked at validation
    recovery_deadline_s: float = 60.0
    max_restarts: int = 20
    # accelpact's stall watchdog (accelpact/detection/watchdog.py): None = auto (10 s when the PG timeout is
    # longer, else off), 0 = off, else seconds; must be below cluster.pg_timeout_s.
    stall_timeout_s: Optional[float] = None
    # accelpact: snapshots on (conf/strategy/accelpact.yaml sets every=1) make a killed rank heal in
    # memory: the parent starts a replacement for that rank only (accelpact.recovery.heal).
    snapshot: SnapshotSettings = field(default_factory=SnapshotSettings)
    # How long survivors wait for a replacement to arrive (a Python + torch + transformers start).
    replacement_timeout_s: float = 120.0
    hot_spares: int = 0  # pre-started processes that take the rank of the first death (0: none)
    # How a replacement process starts when no hot spare is left (harness.parent.template).
    replacement_start: ReplacementStart = ReplacementStart.template
    torchft: TorchftSettings = field(default_factory=TorchftSettings)


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


def run_config_from_dict(data: dict[str, Any]) -> RunConfig:
    return from_dict(RunConfig, data)


def _resolved_hints(cls: type) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(cls)
