"""A committed comparison's verdict drawn again from its own runs under today's rule, without running.

    python -m experiments.rejudge results/peers --heal
    python -m experiments.rejudge results/goodput_vs_age --heal --table verdict

The per-run rows (``runs.csv``: every run of every trial, with each trial's paired gains) are the
measurement; the verdict is arithmetic on them. When the rule changes (the measured gain as the verdict,
intervals with their true coverage, a minimum effect), this rebuilds the cell table from those rows
(``harness.report.verdict.finish_trials``) and the experiment's own table.md around it, and records in
the provenance which rule judged the numbers, at which commit. ``--heal``: the committed AccelPact ran
with per-step snapshots, which is ``accelpact_heal`` today, and its rows in the cell table are named so
(goodput_vs_age's own analysis keeps the name it ran under; its provenance says what it was).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments.provenance import PROVENANCE_FILE, PROVENANCE_MD, load_provenance, provenance_markdown
from harness.report.gitinfo import git_state


def read_runs(runs_csv: Path, rename: dict[str, str]) -> list[dict[str, Any]]:
    """The committed per-run rows, NaN as None, strategies renamed by ``rename``."""
    import pandas as pd

    rows = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in pd.read_csv(runs_csv).to_dict("records")
    ]
    for r in rows:
        r["strategy"] = rename.get(str(r["strategy"]), r["strategy"])
    return rows


def rejudge_sweep(results: Path, rename: dict[str, str], table: str = "table") -> Path:
    """A scratch sweep directory holding runs.csv and the cells re-judged from it (``table``.csv/.md)."""
    from harness.report.verdict import finish_trials

    sweep = Path(tempfile.mkdtemp(prefix=f"rejudge_{results.name}_"))
    runs = read_runs(results / "runs.csv", rename)
    old = (
        (results / f"{table}.md").read_text().splitlines()[0].lstrip("# ")
        if (results / f"{table}.md").exists()
        else results.name
    )
    finish_trials(sweep, runs, [], old, {}, ours=rename.get("accelpact", None))
    return sweep


def note_provenance(results: Path, rule: str) -> None:
    """Record in provenance.json/.md that the verdict was re-judged, by which rule and at which commit."""
    path = results / PROVENANCE_FILE
    data = json.loads(path.read_text())
    sha, dirty = git_state(exclude=("results",))  # the re-judge rewrites results/ itself
    data.setdefault("extra", {})["verdict_rejudged"] = (
        f"at git {sha or 'unknown'}{' (uncommitted changes)' if dirty else ''}: {rule}"
    )
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    (results / PROVENANCE_MD).write_text(provenance_markdown(load_provenance(results)))


def _not_run(table_md: Path) -> dict[str, str]:
    """The committed table's "Not run here:" list (strategy -> the harness's reason), kept through a re-judge."""
    if not table_md.exists():
        return {}
    out, inside = {}, False
    for line in table_md.read_text().splitlines():
        if line.strip() == "Not run here:":
            inside = True
        elif inside and line.startswith("- `") and "`: " in line:
            name, why = line[3:].split("`: ", 1)
            out[name] = why
        elif inside:
            break
    return out


RULE = (
    "`python -m experiments.rejudge` from the committed runs.csv: the verdict on the measured whole-run gain "
    "(paired by trial), order-statistic interval for the median with its exact coverage, 2% minimum effect"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a committed comparison's directory (holds runs.csv)")
    ap.add_argument(
        "--heal", action="store_true", help="the committed AccelPact had per-step snapshots: accelpact_heal"
    )
    ap.add_argument("--table", default="table", help="the cell table's base name there (goodput_vs_age: verdict)")
    args = ap.parse_args(argv)
    results: Path = args.results
    if not (results / "runs.csv").exists():
        print(f"error: {results}/runs.csv is missing: only a comparison with trials can be re-judged", file=sys.stderr)
        return 2
    # goodput_vs_age's own analysis (experiments.goodput_model) knows AccelPact by the name it ran under.
    rename = {"accelpact": "accelpact_heal"} if args.heal and results.name != "goodput_vs_age" else {}
    rule = RULE + (
        "; its AccelPact ran with per-step snapshots and buddy pushes (today's strategy=accelpact_heal)"
        if args.heal
        else ""
    )
    kept_not_run = _not_run(results / f"{args.table}.md")
    sweep = rejudge_sweep(results, rename, args.table)
    try:
        for name in ("table.csv", "table.md", "runs.csv"):
            shutil.copyfile(sweep / name, results / (name.replace("table", args.table) if name != "runs.csv" else name))
        note_provenance(results, rule)
        if results.name in ("peers", "peers_host_loss"):
            from experiments import peers

            prov = load_provenance(results)
            swept = [x for x in str(prov.extra.get("strategies", "")).split(",") if x]
            peers.write_outputs(
                results,
                sweep,
                kept_not_run,
                float(prov.extra.get("runtime_s", math.nan)),
                host_loss=results.name == "peers_host_loss",
                swept=swept,
            )
        elif results.name == "goodput_vs_age":
            from experiments.goodput_report import read_data, write_outputs

            write_outputs(
                results,
                read_data(results / "data.csv"),
                float(load_provenance(results).extra.get("runtime_s", math.nan)),
            )
    finally:
        shutil.rmtree(sweep, ignore_errors=True)
    print(f"re-judged {results}/ ({rule})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
