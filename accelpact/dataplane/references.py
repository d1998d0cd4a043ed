"""Finding what refers to a process group: function defaults that capture one, and the completeness
check that proves a rebind left nothing pointing at the old group.

Kept apart from the binding table (accelpact.dataplane.bindings), which uses the function-defaults discovery
when it builds its table; the completeness check is a diagnostic run after a rebind (the guard runs
it with ``verify_rebind=True``), never on the fast path.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable
from typing import Any

__all__ = ["find_stale_references"]

# Modules whose functions' defaults may capture a group object (``def f(..., group=group.WORLD)``).
_DEFAULTS_SCOPE = ("torch.distributed",)


def _functions_of(obj: Any, module: str, attr: str) -> list[tuple[types.FunctionType, str]]:
    """The plain functions behind a module member: itself, or the methods of a class it defines."""
    # type(), never isinstance(): isinstance reads obj.__class__, which deprecation proxies (e.g.
    # torch.distributed.reduce_op) turn into a warning.
    kind = type(obj)
    if kind is types.FunctionType:
        return [(obj, f"{module}.{attr}")]
    if issubclass(kind, type) and vars(obj).get("__module__") == module:
        out = []
        for k, v in vars(obj).items():
            if type(v) in (staticmethod, classmethod):
                v = v.__func__
            if type(v) is types.FunctionType:
                out.append((v, f"{module}.{attr}.{k}"))
        return out
    return []


def find_stale_references(old_pg: Any, *, ignore: Iterable[Any] = (), deep: bool = False) -> list[str]:
    """Who still refers to ``old_pg``? An empty list proves the rebind was complete.

    Frames on the current call stack (the caller's own locals) and objects in ``ignore`` are left
    out. A traceback frame of a caught fault is reported: drop the exception (and clear its frames)
    before retiring the old group, or it keeps the group, its threads and its sockets alive.

    Containers holding only untracked objects (a tuple holding a process group, as in a function's
    defaults) are not tracked by the collector, so ``gc.get_referrers`` misses them. Function
    defaults in torch.distributed modules (the case seen in practice) are always checked.
    ``deep=True`` also compares the reference count with what the collector accounts for and, if
    references are missing, walks one level inside every tracked object to name the holders
    (seconds in a big process; a diagnostic, not a per-recovery check).
    """
    gc.collect()
    skip = {id(o) for o in ignore}
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        skip.add(id(frame))
        frame = frame.f_back
    found: list[str] = []
    referrers = gc.get_referrers(old_pg)
    accounted = 0  # references held by the containers the collector can see, skipped ones included
    # No closures over old_pg in this function: a generator capturing it would put it in a cell,
    # and that cell would be reported as a holder.
    for ref in referrers:
        for r in gc.get_referents(ref):
            if r is old_pg:
                accounted += 1
        if id(ref) in skip:
            continue
        found.append(_describe_referrer(ref, old_pg))
    hidden = sys.getrefcount(old_pg) - 2 - accounted  # minus getrefcount's argument and `referrers`
    del referrers
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(_DEFAULTS_SCOPE):
            continue
        for attr, obj in list(vars(mod).items()):
            for fn, where in _functions_of(obj, name, attr):
                kw = fn.__kwdefaults__ or {}
                if _holds(fn.__defaults__ or (), old_pg) or _holds(kw.values(), old_pg):
                    found.append(f"function {where} (its defaults)")
    if deep and hidden > 0:
        located = 0
        for obj in gc.get_objects():
            if id(obj) in skip:
                continue
            for child in gc.get_referents(obj):
                if type(child) not in (tuple, dict, list) or gc.is_tracked(child):
                    continue
                values = list(child.values()) + list(child) if type(child) is dict else child
                if _holds(values, old_pg):
                    found.append(f"untracked {type(child).__name__} inside {_describe_owner(obj)}")
                    located += 1
        if not located:
            found.append(
                f"{hidden} reference(s) from holders the garbage collector cannot see "
                "(C-level or untracked containers nested deeper)"
            )
    return found


def _holds(values: Iterable[Any], target: Any) -> bool:
    for v in values:
        if v is target:
            return True
    return False


def _describe_owner(obj: Any) -> str:
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__module__}.{obj.__qualname__} (its defaults)"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


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
