"""Import rules between the two packages, checked on the source with ast (nothing is imported):

(a) the runtime (accelpact/) never imports the harness or its heavy dependencies (Hydra, OmegaConf,
    pandas, matplotlib, transformers), at module level or inside functions: a user drops accelpact
    into their own training script with torch as its only dependency;
(b) no production accelpact module (anything outside accelpact/testing/) imports accelpact.testing:
    test tools must never be on the recovery path;
(c) the harness modules import each other without cycles (function-level imports included: a cycle
    hidden inside a function is still a cycle in the design);
(d) beyond the standard library, the runtime imports torch and nothing else except the optional
    accelerators named in OPTIONAL_IN_RUNTIME (``isal``: ISA-L's CRC-32 for snapshot checksums, ~2.8x
    zlib's with the same values), and those only inside ``try: ... except ImportError`` with a
    standard-library fallback, so the runtime still works where they are not installed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_RUNTIME = ("harness", "hydra", "omegaconf", "pandas", "matplotlib", "transformers")
REQUIRED_IN_RUNTIME = ("torch",)
# Optional, guarded imports the runtime may make (each a small, well-kept C library with wheels, listed
# in pyproject's dependencies so `pip install accelpact` gets it; the code falls back without it).
OPTIONAL_IN_RUNTIME = ("isal",)


def module_name(path: Path) -> str:
    """Dotted module name of a .py file under ROOT (a package's __init__ is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module a file imports, anywhere in it, as (absolute dotted name, line).

    ``from X import y`` yields both ``X`` and ``X.y`` (y may be a submodule); relative imports are
    resolved against the file's package.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, node.lineno))
            out += [(f"{mod}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*"]
    return out


def py_files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _is_or_under(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


def runtime_violations(forbidden: tuple[str, ...] = FORBIDDEN_IN_RUNTIME) -> list[str]:
    bad = []
    for path in py_files("accelpact"):
        for name, line in imports_of(path):
            if any(_is_or_under(name, top) for top in forbidden):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


def accelpact_testing_imports() -> list[str]:
    bad = []
    for path in py_files("accelpact"):
        if path.relative_to(ROOT / "accelpact").parts[0] == "testing":
            continue  # the test tools may import each other
        for name, line in imports_of(path):
            if _is_or_under(name, "accelpact.testing"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


def _guarded(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside a ``try`` whose handlers catch ImportError (or a bare except)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = set()
        for h in node.handlers:
            types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
            caught |= {getattr(t, "id", None) for t in types}
        if not caught & {"ImportError", "ModuleNotFoundError", None}:
            continue
        for stmt in node.body:
            lines |= {n.lineno for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def third_party_violations() -> list[str]:
    """Runtime imports that are neither stdlib, accelpact, torch, nor a guarded optional accelerator."""
    bad = []
    for path in py_files("accelpact"):
        guarded = _guarded(ast.parse(path.read_text(), filename=str(path)))
        for name, line in imports_of(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in ("accelpact", "__future__", "") or top in REQUIRED_IN_RUNTIME:
                continue
            if top in OPTIONAL_IN_RUNTIME:
                if line not in guarded:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports the optional {name} without "
                               "`try: ... except ImportError:` and a standard-library fallback")
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}, which is neither torch, the standard "
                       f"library, nor a named optional accelerator ({', '.join(OPTIONAL_IN_RUNTIME)})")
    return sorted(set(bad))


def harness_graph() -> dict[str, set[str]]:
    """harness module -> the harness modules it imports (the most specific existing module)."""
    files = py_files("harness")
    modules = {module_name(p) for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in files:
        me = module_name(path)
        for name, _line in imports_of(path):
            if not _is_or_under(name, "harness"):
                continue
            target = name
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]  # "from harness.x import func": the module is harness.x
            if target in modules and target != me:
                graph[me].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[set[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan; the graphs here are small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(scc)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    cycles = []
    for scc in sccs:
        start = min(scc)
        # Breadth-first search inside the component for the shortest way back to start.
        prev: dict[str, str] = {}
        frontier, found = [start], None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & scc):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append(list(reversed(path)) + [start])
    return cycles


def test_runtime_imports_no_harness_or_heavy_dependency():
    bad = runtime_violations()
    assert not bad, "accelpact must stay installable with torch alone:\n" + "\n".join(bad)


def test_runtime_imports_torch_stdlib_and_only_guarded_optional_accelerators():
    bad = third_party_violations()
    assert not bad, "accelpact depends on torch (and optionally on a named accelerator) only:\n" + "\n".join(bad)


def test_production_runtime_never_imports_accelpact_testing():
    bad = accelpact_testing_imports()
    assert not bad, ("production accelpact modules import the test tools; move the shared code into "
                     "production (e.g. accelpact/backends/_sockets.py) and import it from there:\n" + "\n".join(bad))


def test_harness_has_no_import_cycles():
    cycles = find_cycles(harness_graph())
    assert not cycles, "import cycles among harness modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


# -- the checker itself must be able to fail ------------------------------------------------------


def test_checker_finds_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "accelpact"
    (pkg / "testing").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "testing" / "__init__.py").write_text("import pandas\n")  # allowed by (b), not by (a)
    (pkg / "guard.py").write_text("def f():\n    import hydra.core\n    from .testing import inject\n")
    (pkg / "ok.py").write_text("import torch\nfrom accelpact import errors\n")
    (pkg / "fast.py").write_text("try:\n    from isal import isal_zlib\nexcept ImportError:\n    import zlib\n"
                                 "import isal\nimport numpy\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert sorted(runtime_violations()) == ["accelpact/guard.py:2 imports hydra.core",
                                                "accelpact/testing/__init__.py:1 imports pandas"]
        assert third_party_violations() == [
            "accelpact/fast.py:5 imports the optional isal without `try: ... except ImportError:` and a "
            "standard-library fallback",
            "accelpact/fast.py:6 imports numpy, which is neither torch, the standard library, nor a named optional "
            "accelerator (isal)",
            "accelpact/guard.py:2 imports hydra.core, which is neither torch, the standard library, nor a named "
            "optional accelerator (isal)",
            "accelpact/testing/__init__.py:1 imports pandas, which is neither torch, the standard library, nor a "
            "named optional accelerator (isal)"]
        assert accelpact_testing_imports() == ["accelpact/guard.py:3 imports accelpact.testing",
                                        "accelpact/guard.py:3 imports accelpact.testing.inject"]
    finally:
        ROOT = saved


def test_cycle_finder():
    graph = {"h.a": {"h.b"}, "h.b": {"h.c"}, "h.c": {"h.a"}, "h.d": {"h.a"}, "h.e": set()}
    assert find_cycles(graph) == [["h.a", "h.b", "h.c", "h.a"]]
    assert find_cycles({"h.a": {"h.b"}, "h.b": set()}) == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
