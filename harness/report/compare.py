"""The comparison: every strategy on the same fault schedule, side by side with a fault-free reference.

``python -m harness`` (``experiment=compare``, the default) calls ``run_comparison``: a fault-free
reference run (strategy none, same checkpoint cadence), then each strategy of ``compare.strategies`` at
each checkpoint age of ``compare.ages`` (``fault.schedule=at_age``), one after the other, each in its own
subdirectory of the Hydra run directory. Then it prints the table (strategy, age, whole-run goodput,
ratio to the reference, AccelPact's gain over the row with the paper's figure beside it, the recovery
breakdown, bit-identical to the reference) and writes ``table.md``, ``table.csv`` and the plots
(``harness.report.plots_compare``) into the run directory.

A multirun (``python -m harness -m strategy=accelpact,cold_restart,checkpoint_restore fault.at_age=5,18``)
runs one job per combination; ``CompareTableCallback.on_multirun_end`` then runs the reference (unless
a job already is one: strategy none, fault none) and writes the same table into the sweep directory.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.experimental.callback import Callback

from harness import strategies
from harness.faults import registry as faults
from harness.report.goodput import load_report
from harness.report.table import RunSummary, comparison_table, format_table
from harness.rank.identity import compare_runs
from harness.app.schema import FaultSchedule, RunConfig

REFERENCE = "reference"
# The paper's whole-run goodput gains of AccelPact (paper-claims.md), by (baseline strategy, age).
PAPER_GAIN: dict[tuple[str, int], float] = {
    ("cold_restart", 5): 1.197,
    ("checkpoint_restore", 5): 1.194,
    ("cold_restart", 18): 1.698,
}
PRINT_COLUMNS: tuple[str, ...] = (
    "strategy", "age", "goodput", "ratio_to_reference", "accelpact_gain", "paper_gain", "replayed_steps",
    "recovery_s", "restart_s", "restore_s", "replay_s", "checkpoint_s", "other_s", "fallback", "bit_identical",
)


@dataclass(frozen=True)
class PlannedRun:
    name: str  # subdirectory
    config: RunConfig
    reference: bool = False


def reference_config(base: RunConfig) -> RunConfig:
    """The fault-free reference of ``base``: strategy none, no fault, same model, data, steps, checkpoints."""
    ref = copy.deepcopy(base)
    ref.strategy.name = strategies.reference().name
    ref.fault.kind = faults.NO_FAULT
    ref.compare.enabled = False
    return ref


def plan_runs(base: RunConfig) -> list[PlannedRun]:
    """The reference, then each age x strategy (in that order: ages outer, so a partial run is still useful)."""
    runs = [PlannedRun(REFERENCE, reference_config(base), reference=True)]
    for age in base.compare.ages:
        for strategy in base.compare.strategies:
            cfg = copy.deepcopy(base)
            cfg.compare.enabled = False
            cfg.strategy.name = strategies.get(strategy).name
            cfg.fault.schedule = FaultSchedule.at_age
            cfg.fault.at_age = int(age)
            cfg.fault.at_step = None
            runs.append(PlannedRun(f"{strategy}_age{age}", cfg))
    return runs


def _is_fault_free(row: dict[str, Any]) -> bool:
    return row.get("fault") in (None, faults.NO_FAULT)


def _is_reference(row: dict[str, Any]) -> bool:
    """A fault-free run of the reference strategy (what every other run is compared with)."""
    return row.get("strategy") == strategies.reference().name and _is_fault_free(row)


def headline_gain(table: Sequence[dict[str, Any]]) -> float:
    """AccelPact's gain over the paper's headline baseline at its largest age (what sweepers optimise)."""
    (baseline, _age), _ = max(PAPER_GAIN.items(), key=lambda kv: kv[0][1])
    gains = [r["accelpact_gain"] for r in table if r["strategy"] == baseline and r["age"] is not None]
    return float(gains[-1]) if gains else math.nan


def summarize(run_dir: Path, row: dict[str, Any], reference_dir: Optional[Path]) -> RunSummary:
    """A RunSummary for the table from a finished run's directory and row."""
    identical = row.get("bit_identical")
    is_ref = _is_reference(row)
    if identical is None and reference_dir is not None and not is_ref:
        identical = compare_runs(reference_dir, run_dir).equal
    age = row.get("age")
    return RunSummary(
        strategy=str(row.get("strategy")),
        report=load_report(str(run_dir)),
        age=None if is_ref or age is None or (isinstance(age, float) and math.isnan(age)) else int(age),
        fault=None if is_ref else row.get("fault"),
        bit_identical=True if is_ref else (None if identical is None else bool(identical)),
    )


def build_table(summaries: Sequence[RunSummary], rows: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """``goodput.comparison_table`` rows plus the paper's gain, the in-memory recovery total and the
    run's status / fallback reason. ``rows`` (same order as ``summaries``) are the results rows."""
    by_id = {id(s): i for i, s in enumerate(summaries)}
    table = comparison_table(summaries)
    # comparison_table sorts; match rows back by (strategy, age).
    lookup = {(s.strategy, s.age): (s, rows[by_id[id(s)]] if rows else {}) for s in summaries}
    for r in table:
        summary, row = lookup.get((r["strategy"], r["age"]), (None, {}))
        r["paper_gain"] = PAPER_GAIN.get((r["strategy"], r["age"])) if r["age"] is not None else None
        r["recovery_s"] = sum(r[k] for k in ("detection_s", "agreement_s", "rebuild_s", "rebind_s"))
        r["status"] = row.get("status")
        if row.get("fallback_reason"):
            r["fallback"] = row["fallback_reason"]
        r["fallback"] = "yes: " + r["fallback"] if r["fallback"] else "no"
        if r["strategy"] == strategies.reference().name and r["age"] is None:
            r["strategy"] = strategies.reference().label
            r["accelpact_gain"] = math.nan  # a gain "over the reference" would mix ages; see ratio_to_reference
    table.sort(key=lambda r: r["strategy"] != strategies.reference().label)  # the reference first; stable otherwise
    return table


def write_table(out_dir: Path, table: list[dict[str, Any]], title: str) -> str:
    """Print and write ``table.md`` / ``table.csv``; returns the printed text."""
    import pandas as pd

    text = format_table(table, PRINT_COLUMNS)
    frame = pd.DataFrame(table)
    frame.to_csv(out_dir / "table.csv", index=False)
    md = [f"# {title}", "", "| " + " | ".join(PRINT_COLUMNS) + " |", "|" + "---|" * len(PRINT_COLUMNS)]
    for r in table:
        md.append("| " + " | ".join(_cell(r.get(c)) for c in PRINT_COLUMNS) + " |")
    md += ["", "goodput: useful tokens / s over the whole run (first step start to last step end); badput parts are "
           "seconds (mean over ranks). accelpact_gain: AccelPact's goodput / this row's (the paper's figure is "
           "paper_gain). recovery_s = detection + agreement + communicator rebuild + rebind.", ""]
    (out_dir / "table.md").write_text("\n".join(md))
    return text


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "-" if math.isnan(v) else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}")
    return str(v).replace("|", "/")


def finish(out_dir: Path, entries: Sequence[tuple[Path, dict[str, Any]]], reference_dir: Optional[Path],
           title: str) -> list[dict[str, Any]]:
    """Table, files and plots over finished runs ``(run_dir, row)``."""
    summaries, rows, dirs = [], [], []
    for run_dir, row in entries:
        try:
            summaries.append(summarize(run_dir, row, reference_dir))
        except Exception as exc:  # noqa: BLE001 - a run without events still gets its line below
            print(f"warning: {run_dir}: no goodput report ({exc})")
            continue
        rows.append(row)
        dirs.append(run_dir)
    table = build_table(summaries, rows)
    text = write_table(out_dir, table, title)
    print(f"\n{title}\n{text}\n  table: {out_dir / 'table.md'}", flush=True)
    try:
        from harness.report import plots_compare

        # The most instructive timeline: the paper's headline baseline (relaunch, restore, replay).
        baseline = max(PAPER_GAIN, key=lambda k: k[1])[0]
        paths = plots_compare.plot_all(out_dir, table, list(zip(dirs, rows)), paper_gain=PAPER_GAIN,
                                       timeline_strategy=baseline)
        print("  plots: " + ", ".join(str(p) for p in paths), flush=True)
    except Exception as exc:  # noqa: BLE001 - a plot must never cost the table
        print(f"warning: comparison plots failed: {type(exc).__name__}: {exc}")
    return table


def check_all_runnable(base: RunConfig) -> None:
    """Refuse before anything starts if any planned run cannot run here (e.g. NVRx missing)."""
    from harness.app import capabilities

    for planned in plan_runs(base):
        capabilities.check_runnable(planned.config)


def run_comparison(base: RunConfig, run_dir: Path, memory_plan: Any = None,
                   overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run the reference and every strategy at every age, sequentially; returns the table rows."""
    from harness.parent.run import run_one

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    planned = plan_runs(base)
    print(f"comparison: {len(planned)} runs ({', '.join(p.name for p in planned)}) in {run_dir}", flush=True)
    if memory_plan is not None:
        print(memory_plan.table(), flush=True)
    entries: list[tuple[Path, dict[str, Any]]] = []
    reference_dir: Optional[Path] = None
    for p in planned:
        sub = run_dir / p.name
        row = run_one(p.config, sub, None, overrides, reference_dir=reference_dir)
        if p.reference:
            if row["status"] != "ok":
                raise RuntimeError(f"the fault-free reference run failed ({row['reason']}); see {sub}/logs")
            reference_dir = sub
        entries.append((sub, row))
    title = (f"whole-run goodput: {base.model.name}, {base.cluster.world_size} x {base.cluster.backend.value}, "
             f"{base.train.steps} steps, {base.fault.kind} on rank(s) {list(base.fault.ranks)} "
             f"({base.fault.phase.value}), checkpoint every {base.checkpoint.interval} steps "
             f"({base.checkpoint.mode.value})")
    return finish(run_dir, entries, reference_dir, title)


class CompareTableCallback(Callback):
    """After a multirun: the reference (if no job is one) and the comparison table over every job."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        import json

        sweep_dir = Path(str(config.hydra.sweep.dir))
        entries: list[tuple[Path, dict[str, Any]]] = []
        for summary in sorted(sweep_dir.glob("*/summary.json")):
            row = json.loads(summary.read_text()).get("row", {})
            if row:
                entries.append((summary.parent, row))
        faulted = [(d, r) for d, r in entries if not _is_fault_free(r)]
        if not faulted:
            return  # not a fault sweep (e.g. the checkpoint-overhead sweep): nothing to compare
        refs = [(d, r) for d, r in entries if _is_reference(r) and r.get("status") == "ok"]
        if refs:
            reference_dir = refs[0][0]
        else:
            reference_dir = self._run_reference(sweep_dir, faulted[0][0])
            ref_row = json.loads((reference_dir / "summary.json").read_text())["row"]
            entries.insert(0, (reference_dir, ref_row))
        finish(sweep_dir, entries, reference_dir, f"whole-run goodput over the sweep {sweep_dir}")

    @staticmethod
    def _run_reference(sweep_dir: Path, job_dir: Path) -> Path:
        from omegaconf import OmegaConf

        from harness.parent.run import run_one
        from harness.app.schema import run_config_from_dict

        data = OmegaConf.to_container(OmegaConf.load(job_dir / "config.yaml"), resolve=True)
        ref = reference_config(run_config_from_dict(data))  # type: ignore[arg-type]
        out = sweep_dir / REFERENCE
        print(f"comparison: running the fault-free reference in {out}", flush=True)
        run_one(ref, out, None, ["(reference of the sweep)"])
        return out
