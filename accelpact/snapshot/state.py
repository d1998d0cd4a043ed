"""Which tensors make up a rank's shard, and how they are copied out of and back into a live job.

A rank's shard is every parameter's LOCAL tensor (an FSDP2 DTensor's ``to_local()``), every tensor
of the optimizer's per-parameter state (its local part too: AdamW's ``exp_avg`` and ``exp_avg_sq``
are DTensors like their parameter; ``step`` is a plain scalar tensor), keyed by the parameter's name
in the model so that a freshly built replacement finds them. Everything else is small and goes in
:class:`Meta`: the optimizer's non-tensor state, its param groups' hyper-parameters (a scheduler
changes ``lr``), the CPU RNG state (and CUDA's where the shard lives on a GPU) and the caller's
``extra_state``.

Restore writes IN PLACE (``copy_`` into the existing tensors: FSDP and accelpact's bindings hold
them, so their identity must not change) and creates optimizer state that does not exist yet (a
fresh replacement's optimizer), as DTensors on the parameter's mesh and placements.

FSDP1's flat parameters are refused: their local shard is a padded slice of a flat buffer whose
layout is not described by the parameter names this format keys on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from accelpact.snapshot.slots import SnapshotError

__all__ = [
    "Entry",
    "Meta",
    "ALIGN",
    "entries",
    "layout",
    "capture_meta",
    "check_groups",
    "signature",
    "apply_meta",
    "restore_tensors",
    "param_names",
    "check_supported",
]

ALIGN = 64  # every tensor starts on a 64-byte boundary of the payload file (any dtype can view it)


@dataclass(frozen=True)
class Entry:
    """One tensor of the shard: where it sits in the payload and what it was."""

    key: str  # "param/<name>" or "optim/<name>/<state key>"
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    dtensor: bool  # the live tensor was a DTensor (restore creates one)
    global_shape: tuple[int, ...]
    device_type: str = "cpu"  # AdamW keeps ``step`` on the CPU even for GPU parameters

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
            "dtensor": self.dtensor,
            "global_shape": list(self.global_shape),
            "device_type": self.device_type,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Entry:
        return cls(
            d["key"],
            d["dtype"],
            tuple(d["shape"]),
            int(d["offset"]),
            int(d["nbytes"]),
            bool(d["dtensor"]),
            tuple(d["global_shape"]),
            d.get("device_type", "cpu"),
        )


@dataclass
class Meta:
    """The small, non-shard part of a snapshot (saved with torch.save, loaded with weights_only)."""

    step: int
    index: list[dict[str, Any]]
    param_groups: list[dict[str, Any]]
    optim_scalars: dict[str, dict[str, Any]] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    extra_state: Any = None

    index_json: str | None = None  # the index as JSON, serialized once per layout (see to_obj)

    def to_obj(self) -> dict[str, Any]:
        # The index travels as one JSON string: pickling its ~150 small dicts through torch.save cost
        # ~10 ms of the snapshot thread's CPU per step (63k persistent_id calls for 20 snapshots).
        index = self.index_json if self.index_json is not None else json.dumps(self.index)
        return {
            "step": self.step,
            "index": index,
            "param_groups": self.param_groups,
            "optim_scalars": self.optim_scalars,
            "rng": self.rng,
            "extra_state": self.extra_state,
        }

    @classmethod
    def from_obj(cls, d: dict[str, Any]) -> Meta:
        index = json.loads(d["index"]) if isinstance(d["index"], str) else d["index"]
        return cls(
            d["step"], index, d["param_groups"], d.get("optim_scalars", {}), d.get("rng", {}), d.get("extra_state")
        )


def _local(t: torch.Tensor) -> torch.Tensor:
    # A DTensor's ``_local_tensor`` directly: ``to_local()`` is an autograd function, ~0.1 ms a call,
    # which made the per-step capture of a 4-layer model's 120 tensors cost 19 ms on the training thread.
    local: torch.Tensor | None = getattr(t, "_local_tensor", None)
    if local is not None:
        return local
    return t.to_local() if hasattr(t, "to_local") else t


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "to_local")


def check_supported(model: nn.Module) -> None:
    """Refuse FSDP1 (flat parameters, or original parameters viewing them) with the reason and what works."""
    from accelpact.dataplane.reset import fsdp_flavour

    flat = next(
        (n for n, p in model.named_parameters() if type(p).__name__ == "FlatParameter" or "_flat_param" in n), None
    )
    if flat is not None or fsdp_flavour(model) == "fsdp1":
        raise SnapshotError(
            f"snapshots do not support FSDP1 ({flat or 'FullyShardedDataParallel'}): its local shard is a padded "
            "slice of a flat buffer (with use_orig_params=True too, each parameter is a view into it), not one "
            "tensor per named parameter. Use FSDP2 (fully_shard), or checkpoint to disk"
        )


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """id(param) -> its name in the model (the key a fresh replacement finds it by)."""
    names = {id(p): n for n, p in model.named_parameters()}
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            names.setdefault(id(p), f"group{gi}.param{pi}")
    return names


def _tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, live tensor) for every shard tensor, in a fixed order: parameters, then their state."""
    names = param_names(model, optimizer)
    seen: set[int] = set()
    params = [p for _, p in model.named_parameters()]
    known = {id(q) for q in params}
    params += [p for g in optimizer.param_groups for p in g["params"] if id(p) not in known]
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        yield f"param/{names[id(p)]}", p
    for p in params:
        for k, v in sorted(optimizer.state.get(p, {}).items(), key=lambda kv: str(kv[0])):
            if isinstance(v, torch.Tensor):
                yield f"optim/{names[id(p)]}/{k}", v


def entries(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[Entry, torch.Tensor]]:
    """Every shard tensor with its place in the payload file (LOCAL tensors, not DTensors)."""
    out: list[tuple[Entry, torch.Tensor]] = []
    offset = 0
    for key, t in _tensors(model, optimizer):
        local = _local(t).detach()
        nbytes = local.numel() * local.element_size()
        out.append(
            (
                Entry(
                    key,
                    str(local.dtype).removeprefix("torch."),
                    tuple(local.shape),
                    offset,
                    nbytes,
                    _is_dtensor(t),
                    tuple(t.shape),
                    local.device.type,
                ),
                local,
            )
        )
        offset += -(-nbytes // ALIGN) * ALIGN
    return out


def layout(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[Entry], int]:
    """The entries alone and the payload's total size in bytes."""
    es = [e for e, _ in entries(model, optimizer)]
    total = max((e.offset + -(-e.nbytes // ALIGN) * ALIGN for e in es), default=0)
    return es, total


def _shard_devices(model: nn.Module) -> list[torch.device]:
    return sorted({_local(p).device for p in model.parameters() if _local(p).device.type == "cuda"}, key=str)


def signature(optimizer: torch.optim.Optimizer) -> tuple[int, ...]:
    """Identity of every tensor a snapshot reads: unchanged means a cached :func:`entries` is still right.

    Cheap (no module traversal): the optimizer's parameters, their local tensors and their state
    tensors. A ``load_state_dict`` or new state replaces some of them and changes it.
    """
    ids: list[int] = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            ids += (id(p), id(_local(p)))
            st = optimizer.state.get(p)
            if st:
                ids += (id(v) for v in st.values())
    return tuple(ids)


def capture_meta(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    index: list[Entry],
    extra_state: Any,
    names: dict[int, str] | None = None,
    index_json: str | None = None,
) -> Meta:
    """The small part of a snapshot, read now (RNG and hyper-parameters as of this instant)."""
    names = names if names is not None else param_names(model, optimizer)
    groups = []
    for g in optimizer.param_groups:
        hyper = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in g.items() if k != "params"}
        hyper["params"] = [names[id(p)] for p in g["params"]]
        groups.append(hyper)
    scalars: dict[str, dict[str, Any]] = {}
    for p, st in optimizer.state.items():
        plain = {str(k): v for k, v in st.items() if not isinstance(v, torch.Tensor)}
        if plain:
            scalars[names.get(id(p), "?")] = plain
    rng: dict[str, Any] = {"cpu": torch.get_rng_state()}
    devices: list[Any] = sorted({e.device_type for e in index} - {"cpu"})
    devices = _shard_devices(model) if devices else []
    if devices:
        rng["cuda"] = {d.index: torch.cuda.get_rng_state(d) for d in devices}
    if index_json is None:
        index_json = json.dumps([e.to_dict() for e in index])
    return Meta(step, [], groups, scalars, rng, extra_state, index_json)


def check_groups(model: nn.Module, optimizer: torch.optim.Optimizer, meta: Meta) -> None:
    """SnapshotError when the optimizer's param groups are not the snapshot's (checked before any write)."""
    names = param_names(model, optimizer)
    if len(meta.param_groups) != len(optimizer.param_groups):
        raise SnapshotError(
            f"the snapshot has {len(meta.param_groups)} optimizer param groups, this optimizer "
            f"{len(optimizer.param_groups)}: it was built differently"
        )
    for gi, (saved, group) in enumerate(zip(meta.param_groups, optimizer.param_groups)):
        mine = [names[id(p)] for p in group["params"]]
        if saved.get("params") != mine:
            raise SnapshotError(
                f"optimizer param group {gi} holds other parameters than the snapshot's "
                f"({len(mine)} vs {len(saved.get('params', []))}); build it the same way"
            )


def apply_meta(model: nn.Module, optimizer: torch.optim.Optimizer, meta: Meta) -> None:
    """Set param-group hyper-parameters, non-tensor optimizer state and the RNG from ``meta``."""
    check_groups(model, optimizer, meta)
    names = param_names(model, optimizer)
    for saved, group in zip(meta.param_groups, optimizer.param_groups):
        for k, v in saved.items():
            if k == "params":
                continue
            if isinstance(group.get(k), torch.Tensor) and isinstance(v, torch.Tensor):
                group[k].copy_(v)
            else:
                group[k] = v
    by_name = {names[id(p)]: p for g in optimizer.param_groups for p in g["params"]}
    for name, plain in meta.optim_scalars.items():
        if name in by_name:
            optimizer.state[by_name[name]].update(plain)
    torch.set_rng_state(meta.rng["cpu"])
    for index, state in meta.rng.get("cuda", {}).items():
        torch.cuda.set_rng_state(state, torch.device("cuda", int(index)))


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise SnapshotError(f"unknown dtype {name!r} in the snapshot index")
    return dt


def restore_tensors(
    model: nn.Module, optimizer: torch.optim.Optimizer, index: list[Entry], payload: torch.Tensor
) -> None:
    """Copy every entry of ``payload`` (a uint8 tensor over the payload file) into the live tensors.

    Parameters and existing optimizer state are written in place; missing optimizer state is created
    (DTensors on the parameter's mesh and placements where the snapshot's tensor was one). Every
    parameter the model has must be in the snapshot with the same local shape, or nothing is written.
    """
    live = dict(_tensors(model, optimizer))
    names = param_names(model, optimizer)
    by_name = {names[id(p)]: p for _, p in model.named_parameters()}
    by_name.update({names[id(p)]: p for g in optimizer.param_groups for p in g["params"]})
    want_params = {k for k in live if k.startswith("param/")}
    have = {e.key for e in index}
    if want_params - have:
        raise SnapshotError(
            f"the snapshot lacks {len(want_params - have)} of this model's parameters, e.g. "
            f"{sorted(want_params - have)[:3]}: it is of another model"
        )
    plan: list[tuple[Entry, torch.Tensor | None, str, str]] = []
    for e in index:
        kind, _, rest = e.key.partition("/")
        pname, _, skey = rest.rpartition("/") if kind == "optim" else (rest, "", "")
        if pname not in by_name:
            raise SnapshotError(f"the snapshot holds {e.key}, which this model does not have: it is of another model")
        target = live.get(e.key)
        if target is not None and tuple(_local(target).shape) != e.shape:
            raise SnapshotError(
                f"{e.key}: local shape {tuple(_local(target).shape)} here, {e.shape} in the "
                "snapshot (another world size or sharding)"
            )
        plan.append((e, target, pname, skey))
    with torch.no_grad():
        for e, target, pname, skey in plan:
            src = payload[e.offset : e.offset + e.nbytes].view(_dtype(e.dtype)).view(e.shape)
            if target is not None:
                _local(target).copy_(src)
                continue
            p = by_name[pname]
            device = _local(p).device if _local(p).device.type == e.device_type else torch.device("cpu")
            data = src.clone().to(device)
            if e.dtensor and _is_dtensor(p):
                from torch.distributed.tensor import DTensor

                if tuple(p.shape) != e.global_shape:
                    raise SnapshotError(
                        f"{e.key}: global shape {e.global_shape} in the snapshot, {tuple(p.shape)} "
                        "for the parameter: cannot create its optimizer state"
                    )
                value: torch.Tensor = DTensor.from_local(
                    data,
                    p.device_mesh,  # type: ignore[attr-defined]  # a DTensor parameter
                    p.placements,  # type: ignore[attr-defined]
                    run_check=False,
                    shape=p.shape,
                    stride=p.stride(),
                )
            else:
                value = data
            key: Any = int(skey) if skey.isdigit() else skey
            optimizer.state[p][key] = value
