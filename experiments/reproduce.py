"""``make reproduce``: run every experiment's ``main()`` in order, each regenerating ``results/<name>/``.

The registry (experiments/registry.py) lists every experiment the project plans, including ones whose
module does not exist yet: those are skipped with a message saying so, and the run goes on. A failing experiment
does not stop the others; the exit status is non-zero if any failed.

    python -m experiments.reproduce                 # everything, at this machine's scale
    python -m experiments.reproduce --quick         # each experiment's ~1 minute check
    python -m experiments.reproduce --only ckpt_overhead,bit_identity
    python -m experiments.reproduce --list
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from experiments.registry import REGISTRY, Experiment

__all__ = ["REGISTRY", "Experiment", "Outcome", "module_exists", "select", "run_all", "summary", "main"]


@dataclass
class Outcome:
    name: str
    status: str  # "ok", "failed", "skipped"
    seconds: float = 0.0
    detail: str = ""


def module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def select(registry: Sequence[Experiment], only: Sequence[str]) -> list[Experiment]:
    """The experiments named in ``only`` (all when empty), in registry order; unknown names are an error."""
    if not only:
        return list(registry)
    known = {e.name for e in registry}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; choose from {', '.join(e.name for e in registry)}")
    return [e for e in registry if e.name in only]


def run_all(
    experiments: Sequence[Experiment],
    quick: bool,
    exists: Callable[[str], bool] = module_exists,
    load: Callable[[str], object] = importlib.import_module,
    log: Callable[[str], None] = print,
) -> list[Outcome]:
    """Run each experiment's ``main(["--quick"] or [])``; skip those whose module does not exist yet."""
    outcomes = []
    for i, exp in enumerate(experiments, 1):
        head = f"[{i}/{len(experiments)}] {exp.name}"
        if not exists(exp.module):
            msg = f"not written yet: module {exp.module} does not exist; results/{exp.name}/ left as it is"
            log(f"{head}: SKIPPED ({msg})")
            outcomes.append(Outcome(exp.name, "skipped", detail=msg))
            continue
        log(f"{head}: {exp.claim} (full run ~{exp.budget_min:g} min on 2 quiet cores{'; --quick' if quick else ''})")
        t0 = time.time()
        try:
            rc = load(exp.module).main(["--quick"] if quick else list(exp.full_args))  # type: ignore[attr-defined]
            status, detail = ("ok", "") if rc in (0, None) else ("failed", f"main() returned {rc}")
        except SystemExit as exc:  # an argparse error or an explicit exit inside main()
            status, detail = ("ok", "") if exc.code in (0, None) else ("failed", f"exited with {exc.code}")
        except Exception:  # noqa: BLE001 - reported, and the next experiment still runs
            status, detail = "failed", traceback.format_exc()
        outcomes.append(Outcome(exp.name, status, time.time() - t0, detail))
        log(f"{head}: {status.upper()} in {time.time() - t0:.0f}s" + (f"\n{detail}" if detail else ""))
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> str:
    lines = [f"{'experiment':<16}{'status':<9}{'time':>8}"]
    for o in outcomes:
        lines.append(
            f"{o.name:<16}{o.status:<9}{o.seconds:>7.0f}s" + (f"  {o.detail.splitlines()[-1]}" if o.detail else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="each experiment's short check instead of its full run")
    ap.add_argument("--only", default="", help="comma-separated experiment names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the experiments and whether each exists, then exit")
    args = ap.parse_args(argv)
    if args.list:
        for e in REGISTRY:
            state = "ready" if module_exists(e.module) else "not written yet"
            print(f"{e.name:<16}{state:<17}~{e.budget_min:g} min  {e.claim}")
        return 0
    try:
        chosen = select(REGISTRY, [n for n in args.only.split(",") if n])
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    t0 = time.time()
    outcomes = run_all(chosen, args.quick)
    if not args.quick:  # --quick writes to temp dirs: results/ is unchanged
        from experiments import readme_results

        try:
            readme_results.main([])
        except ValueError as exc:  # a results/ table the README cannot quote; the results stay written
            print(f"README results section not regenerated: {exc}", file=sys.stderr)
            outcomes.append(Outcome("readme_results", "failed", detail=str(exc)))
    print(f"\nreproduce finished in {(time.time() - t0) / 60:.1f} min\n{summary(outcomes)}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
