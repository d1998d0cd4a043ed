"""The comparison: strategies on the same fault schedule, side by side with a fault-free reference.

There is one way to run a comparison: a Hydra multirun with ``harness.app.comparison.ComparisonCallback``
(the app runs the sweep's reference and, at the end, hands every run's row to :func:`trial_rows` here);
this module builds the table. The default
experiment (``python -m harness``, ``experiment=compare``) is such a multirun, one job per checkpoint
age and strategy; any sweep over a faulted run works the same (``python -m harness -m
strategy=accelpact,cold_restart fault.at_age=5,18``), with the local launcher or on Slurm.

- The default experiment uses the trials sweeper (``hydra/sweeper=trials``,
  harness/app/plugins/hydra_plugins/harness_trials): ``compare.trials`` interleaved rounds, each running the fault-free
  reference (``harness.app.comparison.run_reference``) and every job once in a rotated order, into ``<sweep>/trial<k>/``.
- With another sweeper, ``on_multirun_start`` runs the fault-free reference of the sweep's base config
  (strategy and fault from the registries' reference; same model, data, steps and checkpoint cadence)
  in ``<sweep dir>/reference``, so every job can be compared with it bit for bit as it ends.
- each job is an ordinary run (``harness.parent.run.run_one``) in ``<sweep dir>/[trial<k>/]<strategy>_age<age>``.
- ``on_multirun_end`` builds one row per run and trial (:func:`trial_rows`: the table of
  :func:`build_table` plus the badput-based goodput against that trial's reference, AccelPact's gain on
  it, the badput by part and the load) and hands them to ``harness.report.verdict``, which prints one row
  per (strategy, age, and fault where the sweep varies it): medians over trials, the 95% interval of AccelPact's gain and the verdict; and
  writes ``table.md``, ``table.csv``, ``runs.csv`` and the plots into the sweep directory. It exits 1 if
  a faulted run failed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import strategies
from harness.faults import registry as faults
from harness.identity import compare_runs
from harness.report.badput_goodput import badput_goodput, named_parts, reference_step_s
from harness.report.goodput import load_report
from harness.report.paper import PAPER_GAIN  # the paper's figures live in one place
from harness.report.table import RunSummary, cell, comparison_table, format_table
from harness.schema import RunConfig, StrategyConfig

REFERENCE = "reference"
LOAD_COLUMNS: tuple[str, ...] = ("load_before", "load_mean", "load_max", "steal_pct", "cores_used")  # load_guard
PRINT_COLUMNS: tuple[str, ...] = (
    "strategy",
    "age",
    "goodput",
    "ratio_to_reference",
    "accelpact_gain",
    "paper_gain",
    "replayed_steps",
    "recovery_s",
    "restart_s",
    "restore_s",
    "replay_s",
    "checkpoint_s",
    "other_s",
    "fallback",
    "bit_identical",
)


def reference_config(base: RunConfig) -> RunConfig:
    """The fault-free reference of ``base``: strategy none, no fault, same model, data, steps, checkpoints.
    The reference's config keeps the settings every strategy has, and none of ``base``'s strategy's own."""
    ref = copy.deepcopy(base)
    name = strategies.reference().name
    common = {f.name: getattr(base.strategy, f.name) for f in dataclasses.fields(StrategyConfig)}
    ref.strategy = strategies.config_class(name)(**{**common, "name": name})
    ref.fault.kind = faults.NO_FAULT
    return ref


def is_fault_free(row: dict[str, Any]) -> bool:
    return row.get("fault") in (None, faults.NO_FAULT)


def _is_reference(row: dict[str, Any]) -> bool:
    """A fault-free run of the reference strategy (what every other run is compared with)."""
    return row.get("strategy") == strategies.reference().name and is_fault_free(row)


def summarize(run_dir: Path, row: dict[str, Any], reference_dir: Path | None) -> RunSummary:
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


def build_table(
    summaries: Sequence[RunSummary], rows: Sequence[dict[str, Any]] = (), ours: str | None = None
) -> list[dict[str, Any]]:
    """``goodput.comparison_table`` rows plus the paper's gain, the in-memory recovery total and the
    run's status / fallback reason. ``rows`` (same order as ``summaries``) are the results rows; ``ours``:
    the strategy whose gain is reported (None: the in-memory strategy among the runs)."""
    by_id = {id(s): i for i, s in enumerate(summaries)}
    table = comparison_table(summaries, ours)
    # comparison_table sorts; match rows back by (strategy, age, fault): a sweep over faults has one run of
    # each strategy and age per fault.
    lookup = {(s.strategy, s.age, s.fault): (s, rows[by_id[id(s)]] if rows else {}) for s in summaries}
    for r in table:
        summary, row = lookup.get((r["strategy"], r["age"], r.get("fault")), (None, {}))
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


def trial_rows(
    sweep_dir: Path, entries: Sequence[tuple[Path, dict[str, Any]]], ours: str | None = None
) -> list[dict[str, Any]]:
    """One row per run: the comparison table's columns (``build_table``) plus ``trial``,
    ``goodput_bp``, ``accelpact_gain_bp``, ``ratio_to_reference_bp``, ``step_drift``, ``badput_s``, every
    named badput part (``<part>_s``) and the run's load columns."""
    from harness.report.trials import trial_of  # lazy: numpy, scipy

    by_trial: dict[int, list[tuple[Path, dict[str, Any]]]] = {}
    for d, r in entries:
        by_trial.setdefault(trial_of(d.parent.name) if d.parent != sweep_dir else 0, []).append((d, r))
    reference = strategies.reference()
    ours = strategies.under_test({str(r.get("strategy")) for _, r in entries}, ours).name
    per_trial: dict[int, tuple[list[Any], list[dict[str, Any]]]] = {}
    for trial in sorted(by_trial):
        runs = by_trial[trial]
        refs = [d for d, r in runs if _is_reference(r) and r.get("status") == "ok"]
        ref_dir: Path | None = refs[0] if refs else None
        summaries, rows = [], []
        for d, r in runs:
            try:
                summaries.append(summarize(d, r, ref_dir))
            except Exception as exc:  # noqa: BLE001 - a run without events is reported, not fatal
                print(f"warning: {d}: no goodput report ({exc})")
                continue
            rows.append(r)
        per_trial[trial] = (summaries, rows)
    # One reference pace for every trial: the median of the trials' references' productive steps, so a
    # reference that ran under a load spike does not shrink or stretch its own trial's gains.
    ref_step = reference_step_s(
        [
            s.report
            for summaries, rows in per_trial.values()
            for s, r in zip(summaries, rows)
            if _is_reference(r) and r.get("status") == "ok"
        ]
    )
    out: list[dict[str, Any]] = []
    for trial, (summaries, rows) in per_trial.items():
        # Keyed by (strategy, age, fault): AccelPact's gain on a row is over the run of the same trial, age
        # and fault (a sweep over faults has one run per fault of each strategy and age).
        bp = {(s.strategy, s.age, s.fault): badput_goodput(s.report, ref_step) for s in summaries}
        reports = {(s.strategy, s.age, s.fault): s.report for s in summaries}
        load = {
            (str(r.get("strategy")), None, None)
            if _is_reference(r)
            else (str(r.get("strategy")), r.get("age"), r.get("fault")): r
            for r in rows
        }
        for row in build_table(summaries, rows, ours):
            key = (
                (reference.name, None, None)
                if row["strategy"] == reference.label
                else (row["strategy"], row["age"], row.get("fault"))
            )
            g = bp.get(key)
            mine = g.goodput if g and not math.isnan(g.goodput) else math.nan
            our = bp.get((ours, row["age"], key[2]))
            ref_g = bp.get((reference.name, None, None))
            row["trial"] = trial
            row["goodput_bp"] = mine
            row["accelpact_gain_bp"] = our.goodput / mine if our and mine > 0 and row["age"] is not None else math.nan
            row["ratio_to_reference_bp"] = mine / ref_g.goodput if ref_g and ref_g.goodput > 0 else math.nan
            row["step_drift"] = g.step_drift if g else math.nan
            rep = reports.get(key)
            if rep is not None:
                row["badput_s"] = rep.badput.total_s
                row.update({f"{k}_s": v for k, v in named_parts(rep.badput).items()})
            results_row = load.get(key, {})
            row.update({k: results_row.get(k) for k in LOAD_COLUMNS})
            out.append(row)
    return out


def write_table(out_dir: Path, table: list[dict[str, Any]], title: str) -> str:
    """Print and write ``table.md`` / ``table.csv``; returns the printed text."""
    import pandas as pd  # lazy: pandas

    text = format_table(table, PRINT_COLUMNS)
    frame = pd.DataFrame(table)
    frame.to_csv(out_dir / "table.csv", index=False)
    md = [f"# {title}", "", "| " + " | ".join(PRINT_COLUMNS) + " |", "|" + "---|" * len(PRINT_COLUMNS)]
    for r in table:
        md.append("| " + " | ".join(cell(r.get(c)).replace("|", "/") for c in PRINT_COLUMNS) + " |")
    md += [
        "",
        "goodput: useful tokens / s over the whole run (first step start to last step end); badput parts are "
        "seconds (mean over ranks). accelpact_gain: AccelPact's goodput / this row's (the paper's figure is "
        "paper_gain). recovery_s = detection + agreement + communicator rebuild + rebind.",
        "",
    ]
    (out_dir / "table.md").write_text("\n".join(md))
    return text


def finish(
    out_dir: Path, entries: Sequence[tuple[Path, dict[str, Any]]], reference_dir: Path | None, title: str
) -> list[dict[str, Any]]:
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
        paths = plots_compare.plot_all(
            out_dir, table, list(zip(dirs, rows)), paper_gain=PAPER_GAIN, timeline_strategy=baseline
        )
        print("  plots: " + ", ".join(str(p) for p in paths), flush=True)
    except Exception as exc:  # noqa: BLE001 - a plot must never cost the table
        print(f"warning: comparison plots failed: {type(exc).__name__}: {exc}")
    return table
