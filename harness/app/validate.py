"""Validation of a typed RunConfig against this machine: one readable line per problem, with the fix.

Everything here runs before a run directory or a process exists, so a rejected config leaves nothing
behind. The rules take the machine as data (``harness.machine.Machine``) so they are unit-testable.

When the requested cluster or model cannot run here, the error names the exact command that runs
the same protocol (same strategy, fault, checkpoint schedule) at a size that fits: a cluster this
machine has and the largest shipped model whose memory plan fits. The model is never swapped silently.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness import strategies
from harness.faults import planned
from harness.faults import registry as faults
from harness.machine import RANKS_PER_CORE, GiB, Machine
from harness.parent.memory_plan import MemoryPlan, ParamCounts, param_counts, plan
from harness.schema import (
    ClusterConfig,
    ConfigError,
    Device,
    FaultPhase,
    FaultSchedule,
    LinkPlane,
    ModelConfig,
    Precision,
    RankLaunch,
    RunConfig,
)
from harness.strategies.snapshot_config import snapshots_of

# The memory plan counts parameters on a meta-device model, about 2 ms per layer on a quiet core:
# model.num_layers=10**12 (a fuzz draw) made validation run for ever.
MAX_LAYERS = 1024


@dataclass
class Catalogue:
    """The shipped group options validation may suggest (from conf/model and conf/cluster)."""

    models: dict[str, ModelConfig] = field(default_factory=dict)
    clusters: dict[str, ClusterConfig] = field(default_factory=dict)
    _counts: dict[str, ParamCounts] = field(default_factory=dict)

    def counts(self, m: ModelConfig) -> ParamCounts:
        key = repr(m)
        if key not in self._counts:
            self._counts[key] = param_counts(m)
        return self._counts[key]


def check_names(run: RunConfig) -> None:
    """The strategy and fault kind must be registered (``harness.strategies``, ``harness.faults.registry``)."""
    for name in [run.strategy.name]:
        try:
            strategies.get(name)
        except KeyError:
            raise ConfigError(
                f"strategy {name!r} is not registered (registered: {', '.join(strategies.names())}); "
                f"try `strategy={strategies.under_test().name}`"
            ) from None
    if run.fault.kind == planned.TRACE_KIND or run.fault.schedule == FaultSchedule.trace:
        planned.check_trace(run)
        return
    try:
        faults.get(run.fault.kind)
    except KeyError:
        raise ConfigError(
            f"fault.kind={run.fault.kind!r} is not registered (registered: "
            f"{', '.join(faults.kinds())}); try `fault=socket_reset`"
        ) from None


def check_compare(run: RunConfig) -> None:
    """The comparison's interval method, level, minimum effect and ``ours`` must make sense."""
    from harness.report.intervals import METHODS  # lazy: numpy, scipy

    cmp = run.compare
    if cmp.interval not in METHODS:
        raise ConfigError(
            f"compare.interval={cmp.interval!r} is not a method ({', '.join(sorted(METHODS))}); "
            "try `compare.interval=order_statistic`"
        )
    if not 0.5 <= cmp.level < 1:
        raise ConfigError(f"compare.level={cmp.level} must be at least 0.5 and below 1; try `compare.level=0.95`")
    if cmp.min_effect < 0:
        raise ConfigError(f"compare.min_effect={cmp.min_effect} must be 0 or more; try `compare.min_effect=0.02`")
    if cmp.trials < 1:
        raise ConfigError(f"compare.trials={cmp.trials} must be at least 1; try `compare.trials=5`")
    if cmp.ours is not None:
        ours = [s.name for s in strategies.specs() if s.recovers_in_memory]
        if cmp.ours not in ours:
            raise ConfigError(
                f"compare.ours={cmp.ours!r} is not a strategy under test ({', '.join(ours)}); "
                f"try `compare.ours={ours[0]}`"
            )


def check_values(run: RunConfig) -> None:
    """Checks that need neither the machine nor torch."""
    check_names(run)
    check_compare(run)
    t, m, c = run.train, run.model, run.cluster
    if t.steps <= 0:
        raise ConfigError(f"train.steps={t.steps}: a run needs at least one step; try `train.steps=25`")
    if t.log_every <= 0:
        raise ConfigError(f"train.log_every={t.log_every} must be at least 1; try `train.log_every=5`")
    if t.lr <= 0:
        raise ConfigError(f"train.lr={t.lr} must be positive; try `train.lr=3e-3`")
    if t.eval_every < 0 or t.warmup_steps < 0:
        raise ConfigError(
            f"train.eval_every={t.eval_every} and train.warmup_steps={t.warmup_steps} must be 0 (off) "
            "or positive; try `train.eval_every=2`"
        )
    check_between_steps_phase(run)
    if c.world_size < 1:
        raise ConfigError(f"cluster.world_size={c.world_size} must be at least 1; try `cluster.world_size=2`")
    if c.replicate < 1 or c.world_size % c.replicate:
        fit = max(r for r in range(1, min(max(c.replicate, 1), c.world_size) + 1) if c.world_size % r == 0)
        raise ConfigError(
            f"cluster.replicate={c.replicate} must be at least 1 and divide cluster.world_size={c.world_size} (HSDP's "
            f"mesh is replicate x shard, world_size / replicate ranks per replica); try `cluster.replicate={fit}`"
        )
    if c.hosts < 0 or (c.hosts and c.world_size % c.hosts):
        per = max(1, c.world_size // max(c.hosts, 1))
        raise ConfigError(
            f"cluster.hosts={c.hosts} must be 0 (no host namespaces) or divide cluster.world_size={c.world_size}: "
            f"every host holds the same number of ranks; try `cluster.world_size={per * max(c.hosts, 1)}`"
        )
    if c.nodes < 1 or c.world_size % c.nodes:
        raise ConfigError(
            f"cluster.nodes={c.nodes} must be at least 1 and divide cluster.world_size={c.world_size} (the same "
            f"number of ranks on every node); try `cluster.world_size={max(c.nodes, 1) * max(c.world_size // max(c.nodes, 1), 1)}`"
        )
    if c.nodes > 1 and c.launch != RankLaunch.srun:
        raise ConfigError(
            f"cluster.nodes={c.nodes} needs ranks started on other nodes: only cluster.launch=srun "
            "does that; try `cluster=slurm` or `cluster.nodes=1`"
        )
    if run.fault.link == LinkPlane.control and not faults_need_netns(run):
        raise ConfigError(
            f"fault.link=control cuts a host's control link, which only the network-namespace faults can do "
            f"(fault={run.fault.kind} acts elsewhere); try `fault=link_down fault.link=control cluster=local_hosts`"
        )
    if c.pg_timeout_s <= 0:
        raise ConfigError(f"cluster.pg_timeout_s={c.pg_timeout_s} must be positive; try `cluster.pg_timeout_s=120`")
    for key in ("batch_size", "seq_len", "num_layers", "num_heads", "num_kv_heads", "hidden_size", "vocab_size"):
        if getattr(m, key) < 1:
            raise ConfigError(
                f"model.{key}={getattr(m, key)} must be at least 1; pick a shipped model, e.g. `model=mistral_tiny`"
            )
    if m.num_layers > MAX_LAYERS:
        raise ConfigError(
            f"model.num_layers={m.num_layers} is above {MAX_LAYERS} (the largest published decoders "
            f"have about 126); try `model.num_layers={MAX_LAYERS}` or a shipped model, e.g. `model=mistral7b`"
        )
    if m.seq_len > m.max_position:
        raise ConfigError(
            f"model.seq_len={m.seq_len} exceeds model.max_position={m.max_position}; try `model.seq_len={m.max_position}`"
        )
    if m.hidden_size % m.num_heads:
        raise ConfigError(
            f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}; "
            f"try `model.num_heads={_divisor_at_most(m.hidden_size, m.num_heads)}`"
        )
    if m.num_heads % m.num_kv_heads:
        raise ConfigError(
            f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads={m.num_kv_heads}; "
            f"try `model.num_kv_heads={_divisor_at_most(m.num_heads, m.num_kv_heads)}`"
        )
    bad = [r for r in run.fault.ranks if not 0 <= r < c.world_size]
    if bad:
        raise ConfigError(
            f"fault.ranks={list(run.fault.ranks)} names rank(s) {bad} outside 0..{c.world_size - 1} "
            f"(cluster.world_size={c.world_size}); try `fault.ranks=[{c.world_size - 1}]`"
        )
    stall = run.strategy.stall_timeout_s
    if stall is not None and stall < 0:
        raise ConfigError(
            f"strategy.stall_timeout_s={stall} must be >= 0 (0 = watchdog off); try `strategy.stall_timeout_s=10`"
        )
    if stall and stall >= c.pg_timeout_s:
        raise ConfigError(
            f"strategy.stall_timeout_s={stall} is not below cluster.pg_timeout_s={c.pg_timeout_s}, so the PG timeout "
            f"would always fire first; set strategy.stall_timeout_s={c.pg_timeout_s / 2:g} or raise cluster.pg_timeout_s"
        )
    check_replacement_values(run)
    if run.checkpoint.interval < 0:
        raise ConfigError(
            f"checkpoint.interval={run.checkpoint.interval} must be >= 0 (0 = never); try `checkpoint.interval=0`"
        )
    if run.checkpoint.keep < 1:
        raise ConfigError(f"checkpoint.keep={run.checkpoint.keep} must be at least 1; try `checkpoint.keep=2`")


def check_replacement_values(run: RunConfig) -> None:
    """strategy.hot_spares / replacement_timeout_s, which any strategy has (a heal's snapshot settings are its
    spec's ``check``: harness.strategies.accelpact.check_heal)."""
    st = run.strategy
    if st.hot_spares < 0:
        raise ConfigError(f"strategy.hot_spares={st.hot_spares} must be >= 0; try `strategy.hot_spares=0`")
    if st.hot_spares and snapshots_of(st) is None:
        raise ConfigError(
            f"strategy.hot_spares={st.hot_spares} takes the rank of a dead process and heals it from "
            f"its snapshot, and snapshots are off; try `strategy={strategies.healer().name} strategy.snapshot.every=1`"
        )
    if st.replacement_timeout_s <= 0:
        raise ConfigError(
            f"strategy.replacement_timeout_s={st.replacement_timeout_s} must be positive (seconds the "
            "survivors wait for a replacement); try `strategy.replacement_timeout_s=120`"
        )


def check_snapshot_room(run: RunConfig, memory: MemoryPlan, machine: Machine) -> None:
    """Refuse at start when the ranks of this host cannot keep their snapshots in its shared memory."""
    need = memory.snapshot_per_rank * memory.ranks_on_host
    if not need or machine.shm_free is None:
        return
    if run.cluster.launch == RankLaunch.srun and not machine.in_slurm_job:
        return  # the ranks run on the allocation's nodes, not here: they check their own at start
    if need > machine.shm_free:
        raise ConfigError(
            f"snapshots need {need / GiB:.2f} GiB in {machine.shm_path} ({memory.ranks_on_host} rank(s) x "
            f"{memory.snapshot_per_rank / GiB:.2f} GiB: 2 own slots + 2 buddy replicas each), "
            f"{machine.shm_free / GiB:.2f} GiB free there: DOES NOT FIT. Enlarge it (`mount -o remount,size="
            f"{-(-need * 5 // 4 // GiB) + 1}G /dev/shm`, or `docker run --shm-size=...`), point "
            f"ACCELPACT_SNAPSHOT_ROOT at a larger tmpfs, or turn snapshots off: `strategy.snapshot.every=0`",
            memory_plan=memory,
        )


def faults_need_netns(run: RunConfig) -> bool:
    return planned.needs_netns(run)


def _divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` not above ``limit`` (1 at worst): the nearest valid head count."""
    return max((d for d in range(1, min(n, limit) + 1) if n % d == 0), default=1)


def cluster_problem(run: RunConfig, machine: Machine) -> tuple[str, dict[str, str]] | None:
    """Why this machine cannot provide ``run.cluster``, and the overrides that give one it can."""
    c = run.cluster
    if c.launch == RankLaunch.srun and not machine.in_slurm_job:
        return None  # submitting: the ranks run on the allocation's nodes, checked there, not on this host
    backend_problem = _backend_problem(run, machine)
    if backend_problem is not None:
        return backend_problem
    if c.device == Device.cuda:
        if machine.gpu_count == 0:
            return f"cluster={c.name} needs CUDA GPUs and this machine has none", _to_local_cpu(run, machine)
        if c.world_size > machine.gpu_count:
            return (
                f"cluster.world_size={c.world_size} needs {c.world_size} GPUs with cluster={c.name}; "
                f"this machine has {machine.gpu_count}",
                {"cluster.world_size": str(machine.gpu_count)},
            )
        return None
    limit = machine.local_cpu_rank_limit()
    if c.world_size > limit:
        return (
            f"cluster.world_size={c.world_size} needs {c.world_size} ranks; cluster={c.name} allows at most "
            f"{limit} on this machine ({RANKS_PER_CORE} per core x {machine.cpu_cores} cores, "
            f"{machine.usable_mem / GiB:.1f} GiB usable)",
            {"cluster.world_size": str(limit)},
        )
    return None


def _backend_problem(run: RunConfig, machine: Machine) -> tuple[str, dict[str, str]] | None:
    """The cluster's backend is not in accelpact's registry, or cannot carry tensors of its device.

    The registry (``accelpact.backends``) is the one list of backends: each class names the devices it
    runs on, so a plugin backend is validated like a built-in one."""
    from accelpact.backends import BACKENDS  # lazy: torch

    c = run.cluster
    fits = [name for name, cls in BACKENDS.items() if c.device.value in cls.devices]
    cls = BACKENDS.get(c.backend)
    if cls is None:
        fix = {"cluster.backend": fits[0]} if fits else _to_local_cpu(run, machine)
        return (
            f"cluster.backend={c.backend} is not an accelpact backend (registered: {', '.join(sorted(BACKENDS))})",
            fix,
        )
    if c.device.value in cls.devices:
        return None
    if c.device == Device.cuda and fits:
        return (
            f"FSDP2 on CUDA needs cluster.backend={'|'.join(fits)} ({c.backend} runs on "
            f"{', '.join(cls.devices)} tensors only)",
            {"cluster.backend": fits[0]},
        )
    return (f"cluster.backend={c.backend} needs cluster.device={'|'.join(cls.devices)}", _to_local_cpu(run, machine))


def _to_local_cpu(run: RunConfig, machine: Machine) -> dict[str, str]:
    fix = {"cluster": "local_cpu"}
    ws = min(run.cluster.world_size, machine.local_cpu_rank_limit())
    fix["cluster.world_size"] = str(ws)
    if run.train.mixed_precision == Precision.bf16:
        fix["train.mixed_precision"] = "fp32"
    return fix


def apply_fix(run: RunConfig, fix: dict[str, str], catalogue: Catalogue) -> RunConfig:
    """``run`` with the suggested overrides applied (the few keys validation ever suggests)."""
    out = dataclasses.replace(run)
    if "cluster" in fix:
        out.cluster = dataclasses.replace(catalogue.clusters[fix["cluster"]])
    if "cluster.world_size" in fix:
        out.cluster = dataclasses.replace(out.cluster, world_size=int(fix["cluster.world_size"]))
    if "cluster.backend" in fix:
        out.cluster = dataclasses.replace(out.cluster, backend=fix["cluster.backend"])
    if "train.mixed_precision" in fix:
        out.train = dataclasses.replace(out.train, mixed_precision=Precision(fix["train.mixed_precision"]))
    if "model" in fix:
        out.model = dataclasses.replace(catalogue.models[fix["model"]])
    return out


def suggest_command(overrides: Sequence[str], fix: dict[str, str]) -> str:
    """``python -m harness`` with the user's overrides, minus the ones the fix replaces, plus the fix."""
    replaced = set(fix)
    if "cluster" in fix:
        replaced |= {k for k in _keys(overrides) if k.startswith("cluster.")}
    if "model" in fix:
        replaced |= {k for k in _keys(overrides) if k.startswith("model.")}
    kept = [o for o in overrides if _key(o) not in replaced]
    parts = kept + [f"{k}={v}" for k, v in fix.items()]
    return "python -m harness " + " ".join(shlex.quote(p) for p in parts)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _keys(overrides: Sequence[str]) -> list[str]:
    return [_key(o) for o in overrides]


def validate(
    run: RunConfig,
    machine: Machine,
    catalogue: Catalogue,
    overrides: Sequence[str] = (),
) -> MemoryPlan:
    """The memory plan of ``run`` when this machine can run it; ConfigError (one line) otherwise."""
    check_values(run)
    reasons: list[str] = []
    fix: dict[str, str] = {}
    problem = cluster_problem(run, machine)
    if problem is None and run.train.mixed_precision == Precision.bf16 and run.cluster.device == Device.cpu:
        problem = ("train.mixed_precision=bf16 needs cluster.device=cuda", {"train.mixed_precision": "fp32"})
    if problem is not None:
        reasons.append(problem[0])
        fix.update(problem[1])
    target = apply_fix(run, fix, catalogue)
    # Submitting to Slurm from a host without the allocation's GPUs: they are checked on the nodes, not
    # here (cluster_problem); before this, a GPU cluster=slurm was refused with an empty reason.
    submitting = target.cluster.launch == RankLaunch.srun and not machine.in_slurm_job
    if submitting and target.cluster.device == Device.cuda and not reasons:
        return plan(target, machine, catalogue.counts(target.model))
    if target.cluster.device == Device.cuda and target.cluster.world_size > machine.gpu_count:
        # Only reachable on a machine that has GPUs but not enough after the fix; keep it simple.
        raise ConfigError("; ".join(reasons) + f": try `{suggest_command(overrides, fix)}`")
    memory = plan(target, machine, catalogue.counts(target.model))
    if memory.fits and not reasons:
        check_snapshot_room(target, memory, machine)
        return memory
    if not memory.fits:
        where = f"{memory.ranks_on_host} rank(s) of cluster={target.cluster.name}"
        if memory.device == "cpu" or memory.per_host > memory.host_budget:
            need = f"{memory.per_host / GiB:.1f} GiB of host memory with {where}; {memory.host_budget / GiB:.1f} GiB usable here"
        else:
            need = f"{memory.per_rank_device / GiB:.1f} GiB per GPU with {where}; {memory.device_budget / GiB:.1f} GiB usable per GPU"
        reasons.append(f"model={run.model.name} ({memory.n_params / 1e9:.2f}B params) needs {need}")
        smaller = _largest_fitting_model(target, machine, catalogue, memory.n_params)
        if smaller is None:
            raise ConfigError(
                "; ".join(reasons) + ": no shipped model fits; lower model.batch_size / model.seq_len "
                "or use a machine with more memory",
                memory_plan=memory,
            )
        fix["model"] = smaller
    lead = "this machine cannot run it: " if len(reasons) > 1 or not memory.fits else ""
    tail = "same protocol at a size that fits" if "model" in fix else "fix"
    raise ConfigError(
        f"{lead}{'; '.join(reasons)}. {tail.capitalize()}: `{suggest_command(overrides, fix)}`",
        memory_plan=None if memory.fits else memory,
    )


def _largest_fitting_model(run: RunConfig, machine: Machine, catalogue: Catalogue, below: int) -> str | None:
    sized = sorted(((catalogue.counts(m).total, name) for name, m in catalogue.models.items()), reverse=True)
    for total, name in sized:
        if total >= below:
            continue
        candidate = dataclasses.replace(run, model=catalogue.models[name])
        if plan(candidate, machine, catalogue.counts(candidate.model)).fits:
            return name
    return None


def check_between_steps_phase(run: RunConfig) -> None:
    """A fault at a phase between steps needs that phase to run at the fault's step (else it never fires)."""
    phase, step = run.fault.phase, run.fault.at_step
    if step is None:
        return  # no fixed step (fault.at_age, fault.every): nothing to check here
    if phase is FaultPhase.eval and (run.train.eval_every <= 0 or (step + 1) % run.train.eval_every):
        raise ConfigError(
            f"fault.phase=eval at fault.at_step={step} needs an evaluation after that step: "
            f"train.eval_every={run.train.eval_every} does not evaluate there; try "
            f"`train.eval_every={step + 1}`"
        )
    if phase is FaultPhase.checkpoint_save and (run.checkpoint.interval <= 0 or (step + 1) % run.checkpoint.interval):
        raise ConfigError(
            f"fault.phase=checkpoint_save at fault.at_step={step} needs a save after that step: "
            f"checkpoint.interval={run.checkpoint.interval} does not save there; try "
            f"`checkpoint=sync checkpoint.interval={step + 1}`"
        )
