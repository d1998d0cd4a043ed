"""Memory plan of a run, computed on the meta device before anything is allocated.

Per rank: FSDP2-sharded parameters, gradients and AdamW state (1/world_size each; under HSDP 1/(world_size /
cluster.replicate), the ranks of one replica), the unsharded
working set (the root unit plus two decoder layers in flight: current + prefetched, params and
grads), an activation estimate, checkpoint staging copies (async modes), accelpact's snapshots in
shared memory (``strategy.snapshot.every > 0``: 2 own slots + 2 buddy replicas of the rank's
parameters and AdamW state), and the runtime of one process. Per host: the sum over the ranks that share this host. On a CPU cluster everything lives in
host memory; on a GPU cluster the model lives in GPU memory and the host holds runtimes and staging.
The estimate errs high (the attention term assumes the math kernel that stores probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.machine import RANK_RUNTIME_BYTES, GiB, Machine
from harness.schema import CheckpointMode, Device, ModelConfig, Precision, RunConfig
from harness.strategies.snapshot_config import snapshots_of

FP32 = 4
# A snapshot slot's metadata (RNG states, param groups, the index, the marker): well under 1 MiB.
SNAPSHOT_META_BYTES = 1 << 20
# Host memory of a rank that drives a GPU (CUDA libraries, pinned pools): more than a CPU rank.
GPU_RANK_HOST_BYTES = int(2.0 * GiB)


@dataclass(frozen=True)
class ParamCounts:
    total: int
    largest_layer: int  # one decoder layer
    root: int  # parameters outside the decoder layers (embeddings, final norm, LM head)


@dataclass
class MemoryPlan:
    model: str
    n_params: int
    world_size: int
    ranks_on_host: int
    device: str
    rows: list[tuple[str, int]] = field(default_factory=list)  # (what, bytes per rank)
    host_rows: list[tuple[str, int]] = field(default_factory=list)  # bytes per host not per rank
    per_rank_device: int = 0  # bytes one rank needs on its device (== host on CPU)
    per_host: int = 0  # bytes this host needs in RAM
    host_budget: int = 0
    device_budget: int = 0  # per GPU; 0 on CPU
    snapshot_per_rank: int = 0  # shared-memory bytes of one rank's snapshots (own slots + replicas)

    @property
    def fits(self) -> bool:
        host_ok = self.per_host <= self.host_budget
        device_ok = self.device == "cpu" or self.per_rank_device <= self.device_budget
        return host_ok and device_ok

    def table(self) -> str:
        gib = lambda b: f"{b / GiB:9.2f} GiB"  # noqa: E731
        head = (
            f"memory plan: model={self.model} ({self.n_params / 1e9:.3f}B params), "
            f"{self.world_size} rank(s), {self.ranks_on_host} on this host, device={self.device}"
        )
        lines = [head, f"  {'':38s}{'per rank':>13s}{'per host':>14s}"]
        for what, b in self.rows:
            lines.append(f"  {what:38s}{gib(b):>13s}{gib(b * self.ranks_on_host):>14s}")
        for what, b in self.host_rows:
            lines.append(f"  {what:38s}{'':>13s}{gib(b):>14s}")
        lines.append(f"  {'total':38s}{gib(self.per_rank_device):>13s}{gib(self.per_host):>14s}")
        lines.append(f"  host memory usable here: {gib(self.host_budget).strip()} (85% of available)")
        if self.device != "cpu":
            lines.append(f"  GPU memory usable per rank: {gib(self.device_budget).strip()}")
        lines.append("  -> fits" if self.fits else "  -> DOES NOT FIT on this machine")
        return "\n".join(lines)


# Building mistral7b on the meta device took 20-90 s on a loaded 2-core host (transformers runs each
# layer's init there too); a process that validates many configs (a sweep, the config fuzz) pays once.
_COUNTS: dict[str, ParamCounts] = {}


def param_counts(m: ModelConfig) -> ParamCounts:
    """Counted on the meta device through transformers, so the counts are the model's own (cached per
    model config for the process)."""
    key = repr(m)
    if key not in _COUNTS:
        _COUNTS[key] = _count(m)
    return _COUNTS[key]


def _count(m: ModelConfig) -> ParamCounts:
    from harness.models import count_params, decoder_layers, meta_model  # lazy: torch

    model = meta_model(m)
    layers = decoder_layers(model)
    in_layers = sum(count_params(layer) for layer in layers)
    return ParamCounts(
        total=count_params(model),
        largest_layer=max(count_params(layer) for layer in layers),
        root=count_params(model) - in_layers,
    )


def activation_bytes(m: ModelConfig, compute_bytes: int) -> int:
    """Saved activations of one forward+backward, per rank (Korthikanti-style, errs high)."""
    tokens = m.batch_size * m.seq_len
    kv_dim = m.hidden_size // m.num_heads * m.num_kv_heads
    per_token_layer = 8 * m.hidden_size + 3 * kv_dim + 4 * m.intermediate_size + m.num_heads * m.seq_len
    layers = tokens * per_token_layer * compute_bytes * m.num_layers
    logits = tokens * m.vocab_size * FP32 * 3  # logits, fp32 upcast for the loss, its gradient
    return layers + logits


def snapshot_slot_bytes(shard_params: int) -> int:
    """One snapshot slot of a rank: its fp32 parameter shard and both AdamW moments (the layout of
    accelpact.snapshot.sizing, which the rank checks again against the real tensors at start)."""
    return 3 * shard_params * FP32 + SNAPSHOT_META_BYTES


def snapshot_rows(run: RunConfig, shard_params: int) -> list[tuple[str, int]]:
    """The plan's snapshot rows per rank: none with snapshots off; 2 own slots; 2 buddy replicas when
    replicas are on and there is a buddy (world_size > 1)."""
    snap = snapshots_of(run.strategy)
    if snap is None:
        return []
    slot = snapshot_slot_bytes(shard_params)
    rows = [("snapshots: 2 own slots (shared memory)", 2 * slot)]
    if snap.replicas and run.cluster.world_size > 1:
        rows.append(("snapshots: 2 buddy replicas (shared memory)", 2 * slot))
    return rows


def plan(run: RunConfig, machine: Machine, counts: ParamCounts | None = None) -> MemoryPlan:
    m, ws = run.model, run.cluster.world_size
    counts = counts or param_counts(m)
    on_gpu = run.cluster.device == Device.cuda
    compute_bytes = 2 if run.train.mixed_precision == Precision.bf16 else FP32
    shard = -(-counts.total // (ws // max(run.cluster.replicate, 1)))  # ceil; HSDP shards within a replica only
    unsharded_units = counts.root + 2 * counts.largest_layer
    rows = [
        ("parameters (fp32, sharded)", shard * FP32),
        ("gradients (fp32, sharded)", shard * FP32),
        ("AdamW exp_avg + exp_avg_sq (sharded)", 2 * shard * FP32),
        ("unsharded units in flight (p + g)", 2 * unsharded_units * compute_bytes),
        ("activations (estimate)", activation_bytes(m, compute_bytes)),
    ]
    staging = 0
    if run.checkpoint.interval > 0 and run.checkpoint.mode != CheckpointMode.sync:
        staging = 4 * shard * FP32  # a host copy of params + AdamW state (+ room for the next one)
    ranks_on_host = ws // max(run.cluster.nodes, 1)  # cluster.nodes > 1 only for srun across an allocation
    per_rank_model = sum(b for _, b in rows)
    snapshots = snapshot_rows(run, shard)  # host shared memory on every cluster
    result = MemoryPlan(
        model=m.name,
        n_params=counts.total,
        world_size=ws,
        ranks_on_host=ranks_on_host,
        device=run.cluster.device.value,
        host_budget=machine.usable_mem,
        snapshot_per_rank=sum(b for _, b in snapshots),
    )
    if on_gpu:
        result.rows = rows
        result.host_rows = [("runtime of each rank process (host)", GPU_RANK_HOST_BYTES * ranks_on_host)]
        if staging:
            result.host_rows.append(("async checkpoint staging (host)", staging * ranks_on_host))
        result.host_rows += [(f"{what} (host)", b * ranks_on_host) for what, b in snapshots]
        result.per_rank_device = per_rank_model
        result.per_host = sum(b for _, b in result.host_rows)
        result.device_budget = int(0.9 * min(machine.gpu_mem)) if machine.gpu_mem else 0
    else:
        rows.append(("runtime of the rank process", RANK_RUNTIME_BYTES))
        if staging:
            rows.append(("async checkpoint staging", staging))
        rows += snapshots
        result.rows = rows
        result.per_rank_device = sum(b for _, b in rows)
        result.per_host = result.per_rank_device * ranks_on_host
    return result
