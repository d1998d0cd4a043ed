"""The binding table: every place that caches a data-plane process group, swapped in place on rebind.

FSDP caches process-group objects all over its wrapper and parameter hierarchy, in places that move
between torch releases (docs/design.md, "Where FSDP keeps process groups", lists torch 2.13's). Rather
than hard-code them, :meth:`BindingTable.build` walks the FSDP object graph ONCE at attach time and records
every (holder, attribute) or (dict, key) slot whose value is a process group; a rebind is a loop over those
slots. The DeviceMesh is mutated, never replaced (DTensors share it through their specs); its group names
stay stable because generations.py re-registers every new group under its old name.

Function defaults are holders too (``def f(..., group=group.WORLD)`` in a module imported after
``init_process_group``), and the collector does not track the tuple that holds them: the table records
them (:meth:`BindingTable.refresh_defaults`), and :func:`find_stale_references` (the completeness check,
re-exported from accelpact.dataplane.references) looks inside untracked containers.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.dataplane.references import _DEFAULTS_SCOPE, _functions_of, find_stale_references

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
    # (function, "__defaults__" | "__kwdefaults__", path) whose defaults hold a group; see module doc.
    defaults: list[tuple[Any, str, str]] = field(default_factory=list)
    _scanned_modules: set[str] = field(default_factory=set, repr=False)
    _modules_seen: int = field(default=-1, repr=False)
    # rebind's fast form (see _compiled); rebuilt when slots change.
    _buckets: dict[int, list[tuple[dict[str, Any], Any]]] | None = field(default=None, repr=False)
    _default_buckets: dict[int, list[tuple[Any, str, list[Any]]]] = field(default_factory=dict, repr=False)
    _buckets_n: tuple[int, int] = field(default=(-1, -1), repr=False)

    @classmethod
    def build(
        cls,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> BindingTable:
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
        table.refresh_defaults()
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

    def refresh_defaults(self) -> int:
        """Record function defaults holding a process group in modules loaded since the last call.

        Scans each torch.distributed module's top-level functions and the methods of classes it
        defines, once per module (later calls look at newly imported modules only), and records
        those holding a group of this table. Only that
        scope: all ~2500 loaded modules cost ~0.8 s here, and torch.distributed is where a default
        captures the group (torch.distributed.nn.functional). Returns how many were added.
        """
        if len(sys.modules) == self._modules_seen:
            return 0  # nothing imported since the last call (the common case during a recovery)
        self._modules_seen = len(sys.modules)
        added = 0
        for name, mod in list(sys.modules.items()):
            if name in self._scanned_modules or mod is None or not name.startswith(_DEFAULTS_SCOPE):
                continue
            self._scanned_modules.add(name)
            try:
                members = list(vars(mod).items())
            except TypeError:
                continue
            for attr, obj in members:
                for fn, where in _functions_of(obj, name, attr):
                    for kind in ("__defaults__", "__kwdefaults__"):
                        held = getattr(fn, kind, None)
                        values = held.values() if isinstance(held, dict) else (held or ())
                        # Only the groups this table rebinds: others are not ours to replace.
                        if any(v is g for v in values for g in self.groups) and all(
                            f is not fn or k != kind for f, k, _ in self.defaults
                        ):
                            self.defaults.append((fn, kind, f"{where}.{kind}"))
                            added += 1
        return added

    def _compiled(
        self,
    ) -> tuple[dict[int, list[tuple[dict[str, Any], Any]]], dict[int, list[tuple[Any, str, list[Any]]]]]:
        """Slots and function defaults bucketed by the id of the group they hold, built once.

        An attribute slot is written through the holder's ``__dict__`` (where the scan found it),
        so a rebind is a plain dict store per slot: no method call, no getattr/setattr dispatch,
        no search over the mapping. A function default is recorded as (function, kind, positions)
        so a rebind rebuilds only the tuples that hold the group, without scanning them. This is
        what keeps rebinding at a few microseconds.
        """
        if self._buckets is None or self._buckets_n != (len(self.slots), len(self.defaults)):
            buckets: dict[int, list[tuple[dict[str, Any], Any]]] = {}
            for slot in self.slots:
                target = slot.holder if slot.is_item else _instance_dict(slot.holder, slot.key)
                buckets.setdefault(id(slot.get()), []).append((target, slot.key))
            default_buckets: dict[int, list[tuple[Any, str, list[Any]]]] = {}
            for fn, kind, _path in self.defaults:
                held = getattr(fn, kind, None) or ()
                items = held.items() if type(held) is dict else enumerate(held)
                positions: dict[int, list[Any]] = {}
                for pos, value in items:
                    # Any group, not only self.groups: the table may be recompiled after a
                    # partial rebind left some defaults on a group it no longer lists.
                    if isinstance(value, dist.ProcessGroup):
                        positions.setdefault(id(value), []).append(pos)
                for gid, where in positions.items():
                    default_buckets.setdefault(gid, []).append((fn, kind, where))
            self._buckets, self._default_buckets = buckets, default_buckets
            self._buckets_n = (len(self.slots), len(self.defaults))
        return self._buckets, self._default_buckets

    def rebind(self, mapping: Mapping[dist.ProcessGroup, dist.ProcessGroup] | dist.ProcessGroup) -> int:
        """Swap every slot's group for its replacement, in place. Returns the number of swaps.

        ``mapping`` maps old group -> new group; a single group means "everything -> this group".
        Identity is compared with ``is`` (ProcessGroup equality is identity anyway). A slot that no
        longer holds the group it held when the table was built is left alone and not counted, so
        a caller can compare the count with ``len(slots)``.
        """
        buckets, default_buckets = self._compiled()
        # type() first: isinstance against the pybind ProcessGroup class costs ~1 us per call.
        if type(mapping) is not dict:
            if isinstance(mapping, dist.ProcessGroup):
                mapping = {g: mapping for g in self.groups}
            else:
                mapping = dict(mapping)
        n = 0
        moved: list[tuple[int, list[Any], list[Any]]] = []
        for old, new in mapping.items():
            bucket = buckets.pop(id(old), None)
            if bucket:
                # Count the misses (rare), not the hits: an increment per slot is ~10% of the loop.
                missed = 0
                for holder, key in bucket:
                    if holder[key] is old:
                        holder[key] = new
                    else:
                        missed += 1
                n += len(bucket) - missed
            dbucket = default_buckets.pop(id(old), None)
            if dbucket:
                n += _swap_defaults(dbucket, old, new)
            if bucket or dbucket:
                moved.append((id(new), bucket or [], dbucket or []))
        for gid, bucket, dbucket in moved:
            buckets.setdefault(gid, []).extend(bucket)
            default_buckets.setdefault(gid, []).extend(dbucket)
        groups = self.groups
        if len(groups) == 1 and len(mapping) == 1:  # the usual case: one data-plane group
            ((old, new),) = mapping.items()
            if groups[0] is old:
                self.groups = [new]
        else:
            self.groups = _dedup([next((new for old, new in mapping.items() if old is g), g) for g in groups])
        return n

    def describe(self) -> list[str]:
        return [s.path for s in self.slots] + [path for _fn, _kind, path in self.defaults]


def _swap_defaults(bucket: list[tuple[Any, str, list[Any]]], old: Any, new: Any) -> int:
    """Replace ``old`` with ``new`` at the recorded positions of each function's defaults."""
    n = 0
    for fn, kind, positions in bucket:
        held = getattr(fn, kind, None)
        if not held:
            continue
        if type(held) is dict:
            # __kwdefaults__ is the dict the function reads at call time: mutate it in place.
            for key in positions:
                if held.get(key) is old:
                    held[key] = new
                    n += 1
            continue
        if len(positions) == 1:  # the usual case: one `group=` default; slicing beats a list copy
            i = positions[0]
            if i < len(held) and held[i] is old:
                setattr(fn, kind, held[:i] + (new,) + held[i + 1 :])
                n += 1
            continue
        values = list(held)
        swapped = 0
        for i in positions:
            if i < len(values) and values[i] is old:
                values[i] = new
                swapped += 1
        if swapped:
            setattr(fn, kind, tuple(values))
            n += swapped
    return n


def _instance_dict(holder: Any, key: str) -> dict[str, Any]:
    """The dict an attribute slot lives in; the scan only records attributes found in ``vars()``."""
    d: dict[str, Any] = vars(holder)
    if key not in d:
        raise AssertionError(f"attribute {key!r} of {type(holder).__name__} is not in its __dict__")
    return d


def _dedup(groups: list[Any]) -> list[Any]:
    out: list[Any] = []
    for g in groups:
        if all(o is not g for o in out):
            out.append(g)
    return out
