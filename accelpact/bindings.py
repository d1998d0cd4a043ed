"""The binding table: every place that caches a data-plane process group, swapped in place on rebind.

FSDP caches process-group objects all over its wrapper and parameter hierarchy (recovery-facts.md
section 1): FSDP2 mesh infos (including the post-forward mesh of ``reshard_after_forward=<int>``),
comm objects' ``_group``, DeviceMesh ``_pg_registry``; FSDP1 states, flat-param handles, exec-order
data, comm-hook state, the HSDP inter-node group. Rather than hard-code each attribute (they move
between releases), :meth:`BindingTable.build` walks the FSDP object graph ONCE at attach time and
records every (holder, attribute) or (dict, key) slot whose value is a process group. A rebind is
then a loop over those slots: time proportional to the table, no traversal.

The DeviceMesh is mutated, never replaced: parameter and optimizer-state DTensors share the same
mesh object through their specs. Mesh ``_dim_group_names`` hold names, which stay stable because
comm.py re-registers every new group under its old name; the c10d registries are comm.py's job.

:func:`find_stale_references` is the completeness check: it asks the garbage collector who still
refers to an old group.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["Slot", "BindingTable", "find_stale_references"]

# Never descend into these: they hold no FSDP-owned group references worth scanning and are huge.
_LEAF_TYPES = (str, bytes, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


@dataclass
class Slot:
    """One place holding a process group: ``holder.<key>`` (attribute) or ``holder[key]`` (dict)."""

    holder: Any
    key: Any
    is_item: bool
    path: str  # for error messages and the completeness report

    def get(self) -> Any:
        return self.holder[self.key] if self.is_item else getattr(self.holder, self.key)

    def set(self, value: Any) -> None:
        if self.is_item:
            self.holder[self.key] = value
        else:
            setattr(self.holder, self.key, value)


def _is_scannable(obj: Any) -> bool:
    """FSDP / DTensor / DeviceMesh / comm-hook internals: objects defined under torch.distributed."""
    mod = getattr(type(obj), "__module__", "") or ""
    return mod.startswith("torch.distributed")


@dataclass
class BindingTable:
    """All slots holding a data-plane process group, grouped by the group they currently hold."""

    slots: list[Slot] = field(default_factory=list)
    groups: list[dist.ProcessGroup] = field(default_factory=list)  # distinct groups, discovery order

    @classmethod
    def build(
        cls, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, process_group: Any = None
    ) -> "BindingTable":
        """Walk model, FSDP state and optimizer state once and record every process-group slot.

        ``process_group`` (default: WORLD) is always included even if FSDP happens to hold it only
        by name (a 1-D whole-world mesh on CPU reuses the default group's name).
        """
        from torch.distributed._composable_state import _get_module_state

        table = cls()
        seen: set[int] = set()
        roots: list[tuple[Any, str]] = []
        for name, module in model.named_modules():
            roots.append((module, name or "<root>"))
            state = _get_module_state(module)
            if state is not None:
                roots.append((state, f"{name or '<root>'}.<fsdp_state>"))
        if optimizer is not None:
            for i, st in enumerate(optimizer.state.values()):
                for k, v in st.items():
                    roots.append((v, f"optimizer.state[{i}].{k}"))
        for obj, path in roots:
            table._scan(obj, path, seen, depth=0)
        pg = process_group if process_group is not None else dist.group.WORLD
        if pg is not None and all(g is not pg for g in table.groups):
            table.groups.insert(0, pg)
        # The default group first: non-default groups are rebuilt relative to it.
        world = dist.distributed_c10d._world.default_pg
        table.groups.sort(key=lambda g: 0 if g is world else 1)
        return table

    def _note(self, slot: Slot, pg: dist.ProcessGroup) -> None:
        self.slots.append(slot)
        if all(g is not pg for g in self.groups):
            self.groups.append(pg)

    def _scan(self, obj: Any, path: str, seen: set[int], depth: int) -> None:
        if depth > 12 or isinstance(obj, _LEAF_TYPES) or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            # Only DTensors carry distributed structure (their spec holds the mesh); never look
            # inside plain tensors or FSDP1 FlatParameters' per-parameter metadata.
            spec = getattr(obj, "_spec", None)
            if spec is not None:
                self._scan(spec, f"{path}._spec", seen, depth + 1)
            return
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                if isinstance(v, dist.ProcessGroup):
                    self._note(Slot(obj, k, True, f"{path}[{k!r}]"), v)
                elif not isinstance(v, nn.Module):
                    self._scan(v, f"{path}[{k!r}]", seen, depth + 1)
            return
        if isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(obj):
                if isinstance(v, dist.ProcessGroup):
                    if isinstance(obj, list):
                        self._note(Slot(obj, i, True, f"{path}[{i}]"), v)
                    else:
                        raise TypeError(
                            f"{path} holds a process group inside an immutable {type(obj).__name__}; "
                            "accelpact cannot rebind it in place (please report this FSDP layout)"
                        )
                elif not isinstance(v, nn.Module):
                    self._scan(v, f"{path}[{i}]", seen, depth + 1)
            return
        if isinstance(obj, nn.Module):
            # Modules are roots already; scan only their own attributes (FSDP1 keeps its state here),
            # not their children / parameters dicts (scanned as their own roots).
            if not _is_scannable(obj):
                return
            attrs = {k: v for k, v in vars(obj).items() if k not in ("_modules", "_buffers")}
        elif _is_scannable(obj):
            try:
                attrs = dict(vars(obj))
            except TypeError:  # __slots__ / C++ objects
                return
        else:
            return
        for k, v in attrs.items():
            if isinstance(v, dist.ProcessGroup):
                self._note(Slot(obj, k, False, f"{path}.{k}"), v)
            elif isinstance(v, nn.Module):
                continue
            else:
                self._scan(v, f"{path}.{k}", seen, depth + 1)

    def rebind(self, mapping: Mapping[dist.ProcessGroup, dist.ProcessGroup] | dist.ProcessGroup) -> int:
        """Swap every slot's group for its replacement, in place. Returns the number of swaps.

        ``mapping`` maps old group -> new group; a single group means "everything -> this group".
        Identity is compared with ``is`` (ProcessGroup equality is identity anyway).
        """
        if isinstance(mapping, dist.ProcessGroup):
            new = mapping
            for slot in self.slots:
                slot.set(new)
            self.groups = [new]
            return len(self.slots)
        pairs = list(mapping.items())
        n = 0
        for slot in self.slots:
            cur = slot.get()
            for old, new in pairs:
                if cur is old:
                    slot.set(new)
                    n += 1
                    break
        self.groups = [next((new for old, new in pairs if old is g), g) for g in self.groups]
        return n

    def describe(self) -> list[str]:
        return [s.path for s in self.slots]


def find_stale_references(old_pg: Any, *, ignore: Iterable[Any] = ()) -> list[str]:
    """Who still refers to ``old_pg``? An empty list proves the rebind was complete.

    Frames on the current call stack (the caller's own locals) and objects in ``ignore`` are left
    out. A traceback frame of a caught fault is reported: drop the exception (and clear its frames)
    before retiring the old group, or it keeps the group, its threads and its sockets alive.
    """
    gc.collect()
    skip = {id(o) for o in ignore}
    frame = sys._getframe()
    while frame is not None:
        skip.add(id(frame))
        frame = frame.f_back
    found: list[str] = []
    for ref in gc.get_referrers(old_pg):
        if id(ref) in skip:
            continue
        found.append(_describe_referrer(ref, old_pg))
    return found


def _describe_referrer(ref: Any, target: Any) -> str:
    import types

    if isinstance(ref, types.FrameType):
        return f"frame {ref.f_code.co_name} ({ref.f_code.co_filename}:{ref.f_lineno})"
    if isinstance(ref, dict):
        keys = [k for k, v in ref.items() if v is target] or [k for k in ref if k is target]
        owners = [type(o).__name__ for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
        where = f" (__dict__ of {owners[0]})" if owners else ""
        return f"dict{where} key(s) {keys!r}"
    return f"{type(ref).__module__}.{type(ref).__qualname__}"
