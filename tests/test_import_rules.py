"""Import rules between the two packages, checked on the source with ast (nothing is imported):

(a) the runtime (accelpact/) never imports the harness or its heavy dependencies (Hydra, OmegaConf,
    pandas, matplotlib, transformers), at module level or inside functions: a user drops accelpact
    into their own training script with torch as its only dependency;
(b) no production accelpact module (anything outside accelpact/testing/ and accelpact/inject.py) imports
    accelpact.testing or accelpact.inject: test tools and fault injection must never be on the recovery path;
(c) neither package has an import cycle among its modules, nor the harness among its packages: every import
    counts, at module level, inside functions, under ``if TYPE_CHECKING:`` and through
    ``importlib.import_module`` / ``__import__`` with a literal name (an f-string name with a literal prefix,
    e.g. ``f"harness.strategies.{m}"``, counts as importing every module under that prefix): a cycle hidden
    inside a function or behind importlib is still a cycle in the design. (A strategy's spec names its rank
    and parent sides by "module:name" strings, which each side resolves: the registry imports neither.);
(d) beyond the standard library, the runtime imports torch and nothing else except the optional
    accelerators named in OPTIONAL_IN_RUNTIME (``isal``: ISA-L's CRC-32 for snapshot checksums, ~2.8x
    zlib's with the same values), and those only inside ``try: ... except ImportError`` with a
    standard-library fallback, so the runtime still works where they are not installed;
(e) the harness's imports point down its layers (``HARNESS_LAYERS``: common, rank, analysis, parent, app, by
    the process a line runs in), and nothing outside the rank imports the rank's code (``HARNESS_APART``): the
    ranks and the parent share only the common layer (docs/design.md, the harness's layers).
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


def _resolve(name: str, package: str) -> str:
    """``name`` as an absolute dotted name (a leading dot is relative to ``package``)."""
    if not name.startswith("."):
        return name
    level = len(name) - len(name.lstrip("."))
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def _dynamic_import(node: ast.Call, package: str, literals: set[str]) -> list[str]:
    """The modules an ``importlib.import_module(...)`` / ``import_module(...)`` / ``__import__(...)`` call
    names, when its first argument is a literal; for an f-string starting with a literal prefix
    (``f"pkg.sub.{m}"``), ``pkg.sub.<s>`` for every string ``s`` written literally in the same file (e.g. a
    tuple of built-in module names), or, when there is none, ``pkg.sub.`` (every module under it).
    [] for any other call."""
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if called not in ("import_module", "__import__") or not node.args:
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        name = arg.value
    elif (
        isinstance(arg, ast.JoinedStr)
        and arg.values
        and isinstance(arg.values[0], ast.Constant)
        and str(arg.values[0].value).rpartition(".")[0]
    ):
        prefix = str(arg.values[0].value).rpartition(".")[0] + "."
        named = sorted(prefix + lit for lit in literals if lit.isidentifier())
        return named or [prefix]
    else:
        return []
    if name.startswith("."):
        anchor = next(
            (k.value.value for k in node.keywords if k.arg == "package" and isinstance(k.value, ast.Constant)), None
        )
        name = _resolve(name, anchor) if isinstance(anchor, str) else _resolve(name, package)
    return [name]


def imports_of(path: Path, bare_from: bool = True) -> list[tuple[str, int]]:
    """Every module a file imports, anywhere in it, as (absolute dotted name, line).

    ``from X import y`` yields both ``X`` and ``X.y`` (y may be a submodule; ``bare_from=False``: only
    ``X.y``, for the import graph, which falls back to ``X`` when ``X.y`` is no module); relative imports are
    resolved against the file's package. Imports under ``if TYPE_CHECKING:`` and inside functions
    count; so do importlib's (:func:`_dynamic_import`: a name ending in "." means every module under it).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            out += [(name, node.lineno) for name in _dynamic_import(node, package, literals)]
        elif isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if bare_from or any(alias.name == "*" for alias in node.names):
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
    """Imports of the test tools or the fault injection from the rest of the runtime (the recovery path)."""
    bad = []
    for path in py_files("accelpact"):
        if path.relative_to(ROOT / "accelpact").parts[0] in ("testing", "inject.py"):
            continue  # the test tools may use the injection and each other
        for name, line in imports_of(path):
            if _is_or_under(name, "accelpact.testing") or _is_or_under(name, "accelpact.inject"):
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
                    bad.append(
                        f"{path.relative_to(ROOT)}:{line} imports the optional {name} without "
                        "`try: ... except ImportError:` and a standard-library fallback"
                    )
                continue
            bad.append(
                f"{path.relative_to(ROOT)}:{line} imports {name}, which is neither torch, the standard "
                f"library, nor a named optional accelerator ({', '.join(OPTIONAL_IN_RUNTIME)})"
            )
    return sorted(set(bad))


def import_graph(package: str) -> dict[str, set[str]]:
    """module of ``package`` -> the modules of ``package`` it imports (the most specific existing module)."""
    files = py_files(package)
    modules = {module_name(p) for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in files:
        me = module_name(path)
        for name, _line in imports_of(path, bare_from=False):
            if not _is_or_under(name.rstrip("."), package):
                continue
            if name.endswith("."):  # importlib with an f-string: every module under the prefix
                targets = {m for m in modules if m.startswith(name)}
            else:
                target = name
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]  # "from harness.x import func": the module is harness.x
                targets = {target} if target in modules else set()
            graph[me] |= targets - {me}
    return graph


def harness_graph() -> dict[str, set[str]]:
    return import_graph("harness")


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
    assert not bad, (
        "production accelpact modules import the test tools; move the shared code into "
        "production (e.g. accelpact/common/sockets.py) and import it from there:\n" + "\n".join(bad)
    )


def test_accelpact_has_no_import_cycles():
    cycles = find_cycles(import_graph("accelpact"))
    assert not cycles, "import cycles among accelpact modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The runtime's layers, bottom first: a module may import any package of its own layer or a lower one (the
# package-cycle test rules out circles inside a layer).
ACCELPACT_LAYERS: tuple[tuple[str, ...], ...] = (
    ("accelpact.errors", "accelpact.events", "accelpact.shutdown", "accelpact.common"),
    ("accelpact.control",),
    ("accelpact.detection",),
    ("accelpact.backends",),
    ("accelpact.dataplane",),
    ("accelpact.recovery",),
    ("accelpact.snapshot",),
    ("accelpact.run",),
    ("accelpact.guard",),
    ("accelpact.inject",),
    ("accelpact.testing",),
    ("accelpact",),  # the package's public names
)


def package_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[tuple[str, str]]]:
    """(sub)package of ``package`` -> the (importer, imported) module pairs that cross into other subpackages."""
    depth = package.count(".") + 2

    def of(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    edges: dict[str, set[tuple[str, str]]] = {}
    for src, targets in graph.items():
        for dst in targets:
            if of(src) != of(dst):
                edges.setdefault(of(src), set()).add((src, dst))
    return edges


def test_accelpact_packages_have_no_import_cycle():
    graph = import_graph("accelpact")
    packages: dict[str, set[str]] = {".".join(m.split(".")[:2]): set() for m in graph}
    for pkg, pairs in package_graph(graph, "accelpact").items():
        packages[pkg] |= {".".join(dst.split(".")[:2]) for _, dst in pairs}
    cycles = find_cycles(packages)
    assert not cycles, "import cycles among accelpact's packages (counting function-level imports):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_accelpact_imports_point_down_its_layers():
    layer = {pkg: i for i, group in enumerate(ACCELPACT_LAYERS) for pkg in group}
    graph = import_graph("accelpact")
    packages = {".".join(m.split(".")[:2]) for m in graph}
    assert packages <= set(layer), f"packages with no layer in ACCELPACT_LAYERS: {sorted(packages - set(layer))}"
    upward = sorted(
        f"{src} -> {dst}"
        for pkg, pairs in package_graph(graph, "accelpact").items()
        for src, dst in pairs
        if layer[".".join(dst.split(".")[:2])] > layer[pkg]
    )
    assert not upward, (
        "imports that do not point down ACCELPACT_LAYERS (move the shared type into accelpact.common, or the "
        "code to the layer that owns it):\n" + "\n".join(upward)
    )


# What the harness may import of the runtime: the package's public modules, as a user's launcher or loop
# would. Everything else in accelpact is internal and may move between releases.
ACCELPACT_PUBLIC = frozenset(
    {
        "accelpact",
        "accelpact.errors",
        "accelpact.events",
        "accelpact.guard",
        "accelpact.control",
        "accelpact.backends",
        "accelpact.snapshot",
        "accelpact.run",
        "accelpact.run.spare",  # the hot-spare protocol, which a user's own spare follows too
        "accelpact.inject",
        "accelpact.testing",
        "accelpact.testing.session",  # the multi-rank session and one rank of it (the harness's scenarios)
        "accelpact.testing.rank",
        "accelpact.testing.compare",
    }
)


def harness_private_accelpact_imports() -> list[str]:
    modules = {module_name(p) for p in py_files("accelpact")}
    bad = []
    for path in py_files("harness"):
        for name, line in imports_of(path, bare_from=False):
            if not _is_or_under(name, "accelpact"):
                continue
            module = name
            while module not in modules and "." in module:
                module = module.rpartition(".")[0]  # "from accelpact.run import Workers": the module accelpact.run
            if module not in ACCELPACT_PUBLIC:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


def test_harness_imports_only_accelpacts_public_modules():
    bad = harness_private_accelpact_imports()
    assert not bad, (
        "the harness imports accelpact internals; import the name from a public module (export it there if a "
        "launcher or a loop needs it):\n" + "\n".join(bad)
    )


def test_harness_has_no_import_cycles():
    cycles = find_cycles(harness_graph())
    assert not cycles, "import cycles among harness modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The harness's layers, bottom first, by the process a line runs in. An entry names a module or a package (every
# module under it, unless a longer entry names it: harness.faults.driver is the parent's, the rest of
# harness.faults is common); the bare "harness" entry is the package's own __init__ only, so a new module needs
# an entry. A module may import its own layer or a lower one (the package-cycle test rules out circles inside a
# layer).
HARNESS_LAYERS: tuple[tuple[str, ...], ...] = (
    # common: what every process reads. The config, events, registries and plugins; the specs (strategies and
    # fault kinds: pure data and small policies); the parent -> rank contract (environment and spec file); the
    # machine facts, Slurm's variables and where servers run; the model definition and the final-state identity
    # records, which the ranks write and the parent and the reports read.
    (
        "harness",
        "harness.schema",
        "harness.events",
        "harness.registry",
        "harness.plugins",
        "harness.contract",
        "harness.machine",
        "harness.slurm_env",
        "harness.server_home",
        "harness.models",
        "harness.identity",
        "harness.fleet",
        "harness.strategies",
        "harness.faults",
    ),
    # rank: one rank process. Its worker and loop, the strategies' rank sides, a fault's rank side, checkpoints.
    ("harness.rank", "harness.checkpoint"),
    # analysis: reads runs' files and the specs (goodput, rows, tables, plots, the scale model, the advisor).
    ("harness.report", "harness.scale", "harness.advise"),
    # parent: the launch. The run (which writes its row through analysis), the launcher, the strategies' parent
    # sides, the fault driver and the network namespaces it acts in.
    (
        "harness.parent",
        "harness.faults.driver",
        "harness.faults.netns",
        "harness.faults.netns_host",
        "harness.faults.store_host",
        "harness.faults.store_server",
    ),
    # app: the Hydra app, python -m harness: composes and validates, launches runs, judges comparisons.
    ("harness.app", "harness.__main__"),
)
# Layers that share only what lies below them, whatever their order: the rank's code is imported by rank
# processes only; the parent, analysis and the app meet the ranks on the common layer (the contract, the specs,
# the identity records), never by importing their code.
HARNESS_APART: tuple[tuple[str, str], ...] = (
    ("harness.rank", "harness.report"),
    ("harness.rank", "harness.parent"),
    ("harness.rank", "harness.app"),
)


def harness_layer(module: str, layers: tuple[tuple[str, ...], ...] = HARNESS_LAYERS) -> int | None:
    """Index in ``layers`` of the longest entry naming ``module`` (None: no entry does)."""
    best: tuple[int, int] | None = None
    for i, group in enumerate(layers):
        for entry in group:
            if module == entry or ("." in entry and module.startswith(entry + ".")):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), i)
    return None if best is None else best[1]


def harness_package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles among the harness's packages (harness.X), counting every import of every module in them."""
    packages: dict[str, set[str]] = {".".join(m.split(".")[:2]): set() for m in graph}
    for pkg, pairs in package_graph(graph, "harness").items():
        packages[pkg] |= {".".join(dst.split(".")[:2]) for _, dst in pairs}
    return find_cycles(packages)


def harness_layer_violations(
    graph: dict[str, set[str]],
    layers: tuple[tuple[str, ...], ...] = HARNESS_LAYERS,
    apart: tuple[tuple[str, str], ...] = HARNESS_APART,
) -> list[str]:
    """Modules with no layer, imports that point up ``layers``, and imports between two layers kept ``apart``."""
    bad = [f"{m} has no layer in HARNESS_LAYERS" for m in sorted(graph) if harness_layer(m, layers) is None]
    group_of = {entry: i for i, group in enumerate(layers) for entry in group}
    for src in sorted(graph):
        for dst in sorted(graph[src]):
            a, b = harness_layer(src, layers), harness_layer(dst, layers)
            if a is None or b is None:
                continue
            if b > a:
                bad.append(f"{src} -> {dst} (layer {a} imports layer {b})")
            elif b < a and any({group_of[x], group_of[y]} == {a, b} for x, y in apart):
                bad.append(f"{src} -> {dst} (layers {b} and {a} are kept apart: they meet on a lower layer)")
    return bad


def test_harness_packages_have_no_import_cycle():
    cycles = harness_package_cycles(harness_graph())
    assert not cycles, "import cycles among the harness's packages (counting function-level imports):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_harness_imports_point_down_its_layers():
    bad = harness_layer_violations(harness_graph())
    assert not bad, (
        "harness imports that do not point down HARNESS_LAYERS (move the shared code down to the common layer, or "
        "to the layer that owns it):\n" + "\n".join(bad)
    )


def test_harness_layer_check_flags_upward_and_apart_imports():
    layers = (("h", "h.common", "h.faults"), ("h.rank",), ("h.report",), ("h.parent", "h.faults.driver"), ("h.app",))
    apart = (("h.rank", "h.parent"), ("h.rank", "h.report"))
    ok = {
        "h": set(),
        "h.common": set(),
        "h.faults.kinds": {"h.common"},
        "h.faults.driver": {"h.faults.kinds"},
        "h.rank.train": {"h.common", "h.faults.kinds"},
        "h.report.goodput": {"h.common"},
        "h.parent.run": {"h.report.goodput", "h.faults.driver"},
        "h.app.main": {"h.parent.run", "h.report.goodput"},
    }
    assert harness_layer_violations(ok, layers, apart) == []
    assert harness_layer("h.faults.driver", layers) == 3 and harness_layer("h.faults.kinds", layers) == 0
    planted = {**ok, "h.rank.train": {"h.common", "h.faults.driver"}, "h.parent.run": {"h.rank.train"}, "h.x": set()}
    assert harness_layer_violations(planted, layers, apart) == [
        "h.x has no layer in HARNESS_LAYERS",
        "h.parent.run -> h.rank.train (layers 1 and 3 are kept apart: they meet on a lower layer)",
        "h.rank.train -> h.faults.driver (layer 1 imports layer 3)",
    ]
    assert harness_package_cycles({"h.a.x": {"h.b.y"}, "h.b.y": set(), "h.b.z": {"h.a.x"}}) == [["h.a", "h.b", "h.a"]]


def test_checker_finds_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "accelpact"
    (pkg / "testing").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "testing" / "__init__.py").write_text("import pandas\n")  # allowed by (b), not by (a)
    (pkg / "guard.py").write_text("def f():\n    import hydra.core\n    from .testing import inject\n")
    (pkg / "ok.py").write_text("import torch\nfrom accelpact import errors\n")
    (pkg / "fast.py").write_text(
        "try:\n    from isal import isal_zlib\nexcept ImportError:\n    import zlib\nimport isal\nimport numpy\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert sorted(runtime_violations()) == [
            "accelpact/guard.py:2 imports hydra.core",
            "accelpact/testing/__init__.py:1 imports pandas",
        ]
        assert third_party_violations() == [
            "accelpact/fast.py:5 imports the optional isal without `try: ... except ImportError:` and a "
            "standard-library fallback",
            "accelpact/fast.py:6 imports numpy, which is neither torch, the standard library, nor a named optional "
            "accelerator (isal)",
            "accelpact/guard.py:2 imports hydra.core, which is neither torch, the standard library, nor a named "
            "optional accelerator (isal)",
            "accelpact/testing/__init__.py:1 imports pandas, which is neither torch, the standard library, nor a "
            "named optional accelerator (isal)",
        ]
        assert accelpact_testing_imports() == [
            "accelpact/guard.py:3 imports accelpact.testing",
            "accelpact/guard.py:3 imports accelpact.testing.inject",
        ]
    finally:
        ROOT = saved


def test_checker_counts_type_checking_function_level_and_importlib_imports(tmp_path):
    pkg = tmp_path / "accelpact"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from accelpact.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import importlib\nK = lambda: importlib.import_module('accelpact.a')\n")
    (pkg / "d.py").write_text(
        "import importlib\nM = [importlib.import_module(f'accelpact.sub.{m}') for m in ('x', 'y')]\n"
    )
    (pkg / "g.py").write_text("import importlib\ndef f(m):\n    return importlib.import_module(f'accelpact.sub.{m}')\n")
    (pkg / "sub" / "x.py").write_text("from accelpact.d import M\n")
    (pkg / "sub" / "y.py").write_text("X = __import__('accelpact.e')\n")
    (pkg / "e.py").write_text("")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        graph = import_graph("accelpact")
        assert graph["accelpact.a"] == {"accelpact.b"} and graph["accelpact.b"] == {"accelpact.c"}
        assert graph["accelpact.c"] == {"accelpact.a"}
        assert graph["accelpact.d"] == {"accelpact.sub.x", "accelpact.sub.y"}
        assert graph["accelpact.sub.y"] == {"accelpact.e"}
        assert graph["accelpact.g"] == {"accelpact.sub.x", "accelpact.sub.y"}  # no literal names: all under it
        assert sorted(map(sorted, find_cycles(graph))) == sorted(
            map(
                sorted,
                [
                    ["accelpact.a", "accelpact.b", "accelpact.c", "accelpact.a"],
                    ["accelpact.d", "accelpact.sub.x", "accelpact.d"],
                ],
            )
        )
    finally:
        ROOT = saved


def test_cycle_finder():
    graph = {"h.a": {"h.b"}, "h.b": {"h.c"}, "h.c": {"h.a"}, "h.d": {"h.a"}, "h.e": set()}
    assert find_cycles(graph) == [["h.a", "h.b", "h.c", "h.a"]]
    assert find_cycles({"h.a": {"h.b"}, "h.b": set()}) == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
