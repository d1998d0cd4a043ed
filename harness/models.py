"""Mistral-family decoders from numbers: transformers config + model, seeded init, never a download.

The model is built on the meta device, sharded with FSDP2 (``fully_shard`` per decoder layer, then
the root; on a 2-D mesh that is HSDP, harness.rank.mesh), and only then materialised: each rank
allocates its shards only, never the full model, so Mistral-7B on 16 ranks does not need 16 full
copies in host memory. Initial values are a pure
function of (seed, parameter name), generated one full parameter at a time and sliced to the local
shard, so every rank agrees, and the initial model is the same whatever the world size.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from harness.schema import ModelConfig

INIT_STD = 0.02  # transformers' initializer_range default for Mistral


def hf_config(m: ModelConfig) -> Any:
    """The transformers MistralConfig for ``m`` (sdpa attention, no KV cache: we only train)."""
    from transformers import MistralConfig  # lazy: transformers

    cfg = MistralConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        max_position_embeddings=m.max_position,
        rope_parameters={"rope_type": "default", "rope_theta": float(m.rope_theta)},
        tie_word_embeddings=m.tie_embeddings,
        initializer_range=INIT_STD,
        sliding_window=None,
        use_cache=False,
    )
    # Set explicitly: left unset, transformers may probe for hub-hosted attention kernels.
    cfg._attn_implementation = "sdpa"
    return cfg


def meta_model(m: ModelConfig) -> nn.Module:
    """The model with every tensor on the meta device: shapes only, nothing allocated."""
    from transformers import MistralForCausalLM  # lazy: transformers

    with torch.device("meta"):
        return MistralForCausalLM(hf_config(m))


def count_params(model: nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    return list(model.model.layers)  # type: ignore[union-attr, arg-type]


def shard(model: nn.Module, mesh: Any, mp_policy: Any = None) -> nn.Module:
    """FSDP2: one unit per decoder layer plus the root (embeddings, final norm, LM head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def materialize(model: nn.Module, seed: int, device: torch.device) -> None:
    """Allocate the (sharded) parameters on ``device`` and give them their seeded initial values."""
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            _init_param(name, param, seed, device)
        _recompute_buffers(model, device)


def build_model(m: ModelConfig, seed: int, mesh: Any, device: torch.device, mp_policy: Any = None) -> nn.Module:
    """Meta model -> FSDP2 shards -> seeded values on ``device``. Identical on every rank."""
    model = meta_model(m)
    shard(model, mesh, mp_policy)
    materialize(model, seed, device)
    model.train()
    return model


def param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_init_value(name: str, shape: torch.Size, seed: int, device: torch.device) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``: norms 1, everything else N(0, 0.02)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    gen = torch.Generator(device=device).manual_seed(param_seed(seed, name))
    return torch.randn(shape, generator=gen, device=device) * INIT_STD


def _init_param(name: str, param: torch.Tensor, seed: int, device: torch.device) -> None:
    full = full_init_value(name, param.shape, seed, device)
    local = param.to_local() if hasattr(param, "to_local") else param
    if local.shape == full.shape:
        local.copy_(full)
        return
    # FSDP2 shards dim 0 like torch.chunk, padding missing chunks with empty tensors. Under HSDP the mesh
    # is (replicate, shard): the parameter is Replicate() on the first dimension and Shard(0) on the second.
    mesh = param.device_mesh  # type: ignore[attr-defined]
    mine = full
    for mesh_dim, placement in enumerate(param.placements):  # type: ignore[attr-defined]
        if not placement.is_shard():
            continue
        chunks = list(torch.chunk(mine, mesh.size(mesh_dim), dim=placement.dim))
        coord = mesh.get_coordinate()[mesh_dim]
        mine = chunks[coord] if coord < len(chunks) else mine.new_empty((0, *mine.shape[1:]))
    local.copy_(mine)


def _recompute_buffers(model: nn.Module, device: torch.device) -> None:
    """Buffers computed in __init__ (rotary ``inv_freq``) are garbage after to_empty; rebuild them."""
    for module in model.modules():
        if hasattr(module, "inv_freq") and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for buf_name, buf in fresh.named_buffers(recurse=False):
                getattr(module, buf_name).copy_(buf.to(device))
