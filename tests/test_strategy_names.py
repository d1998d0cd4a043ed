"""The strategy registry (harness/strategies/, with the strategies' rank and parent sides) is the only place
strategy names live.

Checked on the source with ast (nothing but the registry is imported): no string constant in harness/,
experiments/ or benchmarks/ outside those equals a registered or projected strategy's name,
and no string carries a ``strategy=NAME`` override, except the entries of ``ALLOWED`` (an experiment's row
selection, and words that are also something else). Docstrings are prose and are not read.

``none`` is also the name of a fault kind, a checkpoint mode, a rollback and a matplotlib marker fill, so a
bare ``"none"`` counts only where the expression that holds it (``r["strategy"] == "none"``, ``"none" if
strategy ... else``, ``strategy="none"``) or the class or function it is in speaks of a strategy.
An allow-list entry that no longer matches anything fails too, so the list cannot go stale.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from harness import strategies

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("harness", "experiments", "benchmarks")
# The registry, and the strategies' own rank and parent sides (each strategy owns its name on every layer).
REGISTRY_DIRS = ("harness/strategies/", "harness/rank/strategies/", "harness/parent/strategies/")
AMBIGUOUS = "none"  # the reference strategy's name, and an ordinary word in several other configs
OVERRIDE = re.compile(r"strategy=([A-Za-z0-9_,]+)")

# (file, name) -> why the literal may stay.
ALLOWED: dict[tuple[str, str], str] = {
    ("harness/report/badput_goodput.py", "checkpoint_restore"): "ml-goodput's badput part, not the strategy",
    ("harness/schema.py", "none"): "StrategyConfig's default: the schema is the bottom layer and cannot ask the "
    "registry (strategy modules import harness.schema); RunConfig() must be valid",
    ("experiments/process_loss.py", "cold_restart"): "row selection: the baselines the experiment runs",
    ("experiments/process_loss.py", "checkpoint_restore"): "row selection: the baselines the experiment runs",
    ("experiments/scale_projection_table.py", "cold_restart"): "row selection: the stall set beside FT-HSDP's",
    ("experiments/registry.py", "accelpact"): "row selection: the results digest's row",
    ("experiments/registry.py", "torchft"): "row selection: the peers digest's row",
    ("benchmarks/bench_recovery.py", "accelpact"): "the runtime package's name (git archive of accelpact/)",
    ("benchmarks/bench_heal_gpt2.py", "accelpact"): "the runtime package's directory (git status of accelpact/)",
    **{
        ("experiments/claim_checks.py", name): "a registry claim names the strategies it is about"
        for name in (
            "accelpact",
            "accelpact_heal",
            "cold_restart",
            "checkpoint_restore",
            "torchft",
            "accelpact_grow",
            "accelpact_hsdp_continue",
            "torchft_peer_heal",
            "gemini",
        )
    },
    **{
        ("experiments/mixed_faults.py", name): "row selection: the strategies the experiment runs, and the advisor's "
        "(the simulator's) model of each"
        for name in ("accelpact_heal", "checkpoint_restore", "cold_restart", "torchft", "gemini", "torchft_peer_heal")
    },
    ("experiments/mixed_faults_report.py", "torchft"): "the table says why its end is not promised bit-identical",
    ("experiments/rejudge.py", "accelpact"): "the name the committed runs ran under",
    ("experiments/rejudge.py", "accelpact_heal"): "what those runs are called now (snapshots on)",
    ("harness/advise/advice.py", "cold_restart"): "the heal's fallback is a cold restart's outcome",
}


def strategy_names() -> set[str]:
    return set(strategies.names()) | {p.name for p in strategies.projected_strategies()}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _speaks_of_strategy(source: str, parent: ast.AST, scopes: list[str]) -> bool:
    """The node holding the constant (a comparison, a conditional, a keyword argument, an assignment) or the
    innermost class/function mentions a strategy."""
    text = parent.arg or "" if isinstance(parent, ast.keyword) else ast.get_source_segment(source, parent) or ""
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):  # the target, not the whole right-hand side
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        text = " ".join(ast.get_source_segment(source, t) or "" for t in targets)
    return any("strateg" in t.lower() for t in (text, *scopes[-1:]))


def uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every strategy name the code in ``source`` spells out."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, parent: ast.AST, scopes: list[str]) -> None:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            scopes = [*scopes, node.name]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            hits = {n for m in OVERRIDE.findall(text) for n in m.split(",") if n in names}
            if text in names and (text != AMBIGUOUS or _speaks_of_strategy(source, parent, scopes)):
                hits.add(text)
            found.extend((node.lineno, h) for h in sorted(hits))
        for child in ast.iter_child_nodes(node):
            visit(child, node, scopes)

    visit(tree, tree, [])
    return found


def test_the_scan_finds_names_spelled_out():
    names = {"none", "cold_restart", "torchft"}
    planted = (
        'LABELS = {"cold_restart": "cold restart"}\n'
        'ref = [r for r in rows if r["strategy"] == "none"]\n'
        'cmd = ["python", "-m", "harness", "strategy=torchft"]\n'
        'x = plot(mfc="none")\n'  # a marker fill, not the reference strategy
        'class StrategyConfig:\n    name: str = "none"\n'
        'class FaultConfig:\n    kind: str = "none"\n'  # the fault kind
        'def f():\n    """cold_restart in prose."""\n'
    )
    assert uses(planted, names) == [(1, "cold_restart"), (2, "none"), (3, "torchft"), (6, "none")]


def test_no_strategy_name_outside_the_registry():
    names = strategy_names()
    assert {"none", "accelpact", "cold_restart"} <= names  # the registry loaded
    stray, matched = [], set()
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(REGISTRY_DIRS):
                continue
            for line, name in uses(path.read_text(), names):
                if (rel, name) in ALLOWED:
                    matched.add((rel, name))
                else:
                    stray.append(f"{rel}:{line}: {name!r}")
    assert not stray, (
        "strategy names outside harness/strategies/ (ask the registry: strategies.get(name).label/"
        ".color, under_test(), reference(); or, for an experiment's row selection, add it to "
        "ALLOWED with its reason):\n" + "\n".join(stray)
    )
    assert not set(ALLOWED) - matched, f"stale ALLOWED entries (remove them): {sorted(set(ALLOWED) - matched)}"
