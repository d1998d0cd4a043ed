"""The tiny decoder every multi-rank check trains: a Mistral-style model under FSDP2 or FSDP1.

One definition for the tests (tests/accelpact), the experiments and the benchmarks: the model
(mistral_tiny width unless overridden), its wrapping (FSDP2 per block + root, optionally with
torch.compile'd blocks or an int ``reshard_after_forward``; FSDP1 with flat or original parameters),
AdamW, deterministic batches (a pure function of seed, step and rank), and what a rank records
(local state, process resources, dynamo's counters). It lives outside accelpact because it imports
transformers, which the runtime must never depend on.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any

import torch

__all__ = [
    "SEED",
    "FLAVOURS",
    "model_config",
    "build",
    "batch_for",
    "step_fn_for",
    "local",
    "state_of",
    "resources",
    "dynamo_counters",
    "set_pg_timeout",
]

SEED = 1234
# fsdp1 and fsdp1_flat (the tests' name for it): flat parameters; fsdp1_orig: use_orig_params=True.
FLAVOURS = ("fsdp2", "fsdp1", "fsdp1_flat", "fsdp1_orig")
# mistral_tiny width: large enough for FSDP to shard every block, small enough for 16 ranks on 2 cores.
_BASE = {"vocab": 4096, "hidden": 256, "inter": 768, "layers": 4, "heads": 8, "kv_heads": 4, "seq": 64, "batch": 2}


def model_config(overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """The model's sizes: mistral_tiny width, with ``overrides`` (e.g. ``{"layers": 32}``) applied."""
    unknown = set(overrides or {}) - set(_BASE)
    if unknown:
        raise ValueError(f"unknown model field(s) {sorted(unknown)}; choose from {sorted(_BASE)}")
    return {**_BASE, **(overrides or {})}


def build(
    flavour: str,
    m: Mapping[str, int],
    compile_backend: str | None = None,
    *,
    reshard_after_forward: bool | int = True,
    seed: int = SEED,
    lr: float = 1e-3,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.nn.Module, torch.nn.Module]:
    """(model, optimizer, root FSDP module, middle decoder block), from ``seed``, wrapped as ``flavour``.

    The root and the middle block are where a FaultInjector installs its forward / backward hooks.
    ``reshard_after_forward`` (FSDP2 only): an int below the world size adds a post-forward mesh.
    """
    from transformers import MistralConfig, MistralForCausalLM

    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}: use one of {FLAVOURS}")
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=m["vocab"],
        hidden_size=m["hidden"],
        intermediate_size=m["inter"],
        num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"],
        max_position_embeddings=m["seq"] * 2,
        tie_word_embeddings=False,
    )
    model = MistralForCausalLM(config).float()
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer, reshard_after_forward=reshard_after_forward)
            if compile_backend:
                layer.compile(backend=compile_backend)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        root, middle = model, model.model.layers[m["layers"] // 2]
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

        model = FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({MistralDecoderLayer}),
            use_orig_params=(flavour == "fsdp1_orig"),
            device_id=torch.device("cpu"),
        )
        root, middle = model, model.module.model.layers[m["layers"] // 2]  # type: ignore[union-attr, index]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    return model, optimizer, root, middle


def batch_for(step: int, rank: int, m: Mapping[str, int], seed: int = SEED) -> torch.Tensor:
    """Deterministic tokens: a pure function of (seed, step, rank), so a retried step sees the same batch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randint(0, m["vocab"], (m["batch"], m["seq"]), generator=g)


def step_fn_for(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """Forward + backward of one batch (what a guard's ``step_fn`` does); returns the detached loss."""

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        return loss.detach()

    return step_fn


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``t`` (a DTensor's local tensor), detached and copied."""
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every local parameter shard and optimizer-state tensor, by name (what bit-identity compares)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = local(p)
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optim/{name}/{k}"] = local(v)
    return out


def resources(exclude_ports: Collection[int]) -> dict[str, Any]:
    """Threads, open fds, TCP sockets (stores excluded) and RSS of this process, after a gc pass."""
    import psutil

    from accelpact import testing as fault_testing

    gc.collect()
    proc = psutil.Process()
    return {
        "threads": proc.num_threads(),
        "fds": proc.num_fds(),
        "tcp": len(fault_testing.tcp_socket_inodes(exclude_ports)),
        "rss_mib": proc.memory_info().rss / 2**20,
    }


def dynamo_counters() -> dict[str, int]:
    """torch._dynamo's counters, flattened: compiled frames, unique graphs, recompiles, breaks."""
    import torch._dynamo.utils as dyn_utils

    return {
        f"{group}/{key}": int(n)
        for group, d in dyn_utils.counters.items()
        for key, n in d.items()
        if isinstance(n, int)
    }


def set_pg_timeout(pg: Any, seconds: float) -> None:
    """Change a live gloo group's collective timeout (e.g. a short one for a hang scenario)."""
    pg._get_backend(torch.device("cpu"))._set_default_timeout(timedelta(seconds=seconds))
