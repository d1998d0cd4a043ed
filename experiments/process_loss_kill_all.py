"""A whole-job crash (``fault=kill_all``): AccelPact's restart from its shared-memory snapshots against cold
restart and NVRx checkpoint restoration, at checkpoint ages 5 and 18, measured side by side on this machine.

    python -m experiments.process_loss_kill_all --trials 5   # ages 5 and 18, 40 steps, 5 trials (root)
    python -m experiments.process_loss_kill_all --quick      # age 5 only, 24 steps, 1 trial, into a temp dir

The same setup as ``experiments.process_loss`` (its ``common`` overrides: mistral_tiny with 2 layers, two
simulated hosts of one rank each under ``cluster=local_hosts``, a sync DCP checkpoint every 20 steps), and
the harness's comparison (``python -m harness -m``: the fault-free reference first, then every strategy at
every age, ``compare.trials`` interleaved rounds). When rank 1 reaches the backward reduce-scatter of the
step the age names, the parent SIGKILLs both ranks at once. Every strategy relaunches every rank:

- ``accelpact_heal`` resumes from the newest snapshot both ranks hold in their hosts' shared memory (the
  disk only when no complete, agreeing set exists; the row's ``fallback`` then says why);
- ``cold_restart`` and ``checkpoint_restore`` (NVRx, whose in-process restart cannot bring back a dead
  process: the parent stands in for its ft_launcher) restore the newest DCP checkpoint and replay the
  ``age`` steps since it.

Writes results/process_loss/kill_all.md (per strategy and age: goodput, replayed steps, where the relaunch
resumed from, bytes read from disk, bit-identity; medians with their order-statistic intervals), kill_all.csv
(one row per run and trial), verdict_kill_all.md (the comparison's own verdict table) and kill_all.json
(provenance). Exits 1 when a run failed or an accelpact_heal run broke the acceptance: a resume from the
snapshots with no disk read, at most 1 step replayed, bit-identical (``acceptance_problems``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from experiments import _driver
from experiments.process_loss import FULL, QUICK, STRATEGIES, Plan, keep_verdict, measure_fault

__all__ = ["FAULT", "main", "table", "summarize", "acceptance_problems"]

NAME = "process_loss"  # its rows belong to results/process_loss
FAULT = "kill_all"


def summarize(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (strategy, age) of the faulted runs: the cells of the table (pure)."""
    from harness.report.intervals import order_statistic

    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for strategy in STRATEGIES:
        ages = sorted(
            {
                int(r["age"])
                for r in rows
                if r.get("strategy") == strategy
                and r.get("age") is not None
                and not (isinstance(r["age"], float) and math.isnan(r["age"]))
            }
        )
        for age in ages:
            runs = [r for r in rows if r.get("strategy") == strategy and r.get("age") == age]
            ok = [r for r in runs if r.get("status") == "ok"]
            cells[(strategy, age)] = {
                "runs": len(runs),
                "ok": len(ok),
                "refused": next((r.get("reason") for r in runs if r.get("status") == "not supported"), None),
                "goodput": order_statistic([float(r["goodput"]) for r in ok if r.get("goodput") is not None]),
                "replayed": [int(r["replayed_steps"]) for r in ok if r.get("replayed_steps") is not None],
                "sources": sorted({str(r.get("restore_source")) for r in ok}),
                "disk_bytes": max((float(r.get("restore_disk_bytes") or 0) for r in ok), default=math.nan),
                "identical": sum(1 for r in ok if r.get("bit_identical") is True),
                "fallbacks": sorted({str(r.get("fallback")) for r in ok if r.get("fallback") not in (None, "no")}),
            }
    return cells


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of the faulted runs (pure)."""
    lines = [
        "| strategy | age | runs ok | goodput, tokens/s (median [interval]) | replayed steps (each trial) | "
        "resumed from | bytes read from disk (max) | bit-identical | disk fallback |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (strategy, age), c in summarize(rows).items():
        if c["refused"]:
            lines.append(f"| {strategy} | {age} | not supported: {c['refused']} | - | - | - | - | - | - |")
            continue
        disk = "-" if math.isnan(c["disk_bytes"]) else f"{c['disk_bytes']:,.0f}"
        lines.append(
            f"| {strategy} | {age} | {c['ok']}/{c['runs']} | {c['goodput'].text('.0f')} | "
            f"{', '.join(map(str, c['replayed'])) or '-'} | {', '.join(c['sources']) or '-'} | {disk} | "
            f"{c['identical']}/{c['ok']} | {'; '.join(c['fallbacks'])[:200] or 'no'} |"
        )
    return lines


def acceptance_problems(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What breaks the item's acceptance in the faulted accelpact_heal runs (pure): each must restart from the
    shared-memory snapshots with no disk read, replay at most 1 step and end bit-identical."""
    problems = []
    for r in rows:
        if r.get("strategy") != STRATEGIES[0] or r.get("status") == "not supported":
            continue
        where = f"{r.get('run')} (trial {r.get('trial')})"
        if r.get("status") != "ok":
            problems.append(f"{where}: {r.get('status')}: {str(r.get('reason'))[:200]}")
            continue
        if r.get("restore_source") != "snapshot" or float(r.get("restore_disk_bytes") or 0) > 0:
            problems.append(
                f"{where}: resumed from {r.get('restore_source')}, {r.get('restore_disk_bytes')} bytes "
                f"read from disk ({r.get('fallback')})"
            )
        if r.get("replayed_steps") is None or int(r["replayed_steps"]) > 1:
            problems.append(f"{where}: {r.get('replayed_steps')} steps replayed")
        if r.get("bit_identical") is not True:
            problems.append(f"{where}: bit_identical={r.get('bit_identical')}")
    return problems


def main(argv: list[str] | None = None) -> int:
    from experiments.provenance import collect, current_command, provenance_markdown

    ap = _driver.parser(__doc__, NAME, "age 5 only, 24 steps, one trial, written to a temp dir")
    ap.add_argument("--trials", type=int, default=None, help="interleaved rounds (default 5; --quick 1)")
    ap.add_argument("--scratch", default=None, help="where the runs go (default: a temp dir, deleted unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch run directories")
    args = ap.parse_args(argv)
    plan: Plan = QUICK if args.quick else FULL
    if args.trials is not None:
        plan = dataclasses.replace(plan, trials=args.trials)
    from harness.faults.netns import namespaces_available

    ok, why = namespaces_available()
    if not ok:
        print(f"error: {NAME} runs two simulated hosts in network namespaces: {why}", file=sys.stderr)
        return 2
    out = _driver.output_dir(args, NAME)
    scratch = _driver.scratch_dir(args, f"{NAME}_{FAULT}")
    prov = collect(
        current_command(argv, "experiments.process_loss_kill_all"),
        {
            "fault": FAULT,
            "ages": ",".join(map(str, plan.ages)),
            "steps": plan.steps,
            "interval": plan.interval,
            "trials": plan.trials,
            "world_size": 2,
            "hosts": 2,
            "fault_rank": 1,
            "phase": "backward_reduce_scatter",
            "strategies": ",".join(STRATEGIES),
        },
    )
    print(f"{NAME} {FAULT}: {plan}; runs in {scratch}, results in {out}", flush=True)
    timing = _driver.Timing()
    try:
        rows = measure_fault(plan, FAULT, scratch)
        keep_verdict(FAULT, scratch / FAULT, out)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    runtime = timing.elapsed_s
    _driver.write_csv(out / f"{FAULT}.csv", rows)
    lines = [
        f"# A whole-job crash (`fault={FAULT}`): restart from shared-memory snapshots against cold restart and NVRx",
        "",
        f"mistral_tiny (2 layers, seq {plan.seq_len} x batch {plan.batch_size}) on 2 gloo ranks, each its own "
        f"simulated host (`cluster=local_hosts`), a sync DCP checkpoint every {plan.interval} steps, {plan.steps} "
        f"steps. When rank 1 reaches the backward reduce-scatter of the step {', '.join(map(str, plan.ages))} "
        "steps after the newest checkpoint, the parent SIGKILLs both ranks at once; every strategy relaunches "
        "both. accelpact_heal resumes from the newest snapshot both hold in shared memory; the others restore "
        f"the checkpoint. {plan.trials} interleaved trial(s), each with its own fault-free reference; goodput "
        "cells are medians with their order-statistic interval for the median (coverage as "
        "harness.report.intervals gives it at n).",
        "",
        *table(rows),
        "",
        f"Run time: {runtime / 60:.1f} min. The comparison's own verdict table: verdict_{FAULT}.md.",
        "",
        provenance_markdown(prov),
    ]
    (out / f"{FAULT}.md").write_text("\n".join(lines) + "\n")
    (out / f"{FAULT}.json").write_text(
        json.dumps({"provenance": prov.to_dict(), "runtime_s": runtime}, indent=1, default=str)
    )
    print("\n".join(lines))
    failed = [f"{r['strategy']}_age{r['age']}" for r in rows if r.get("status") not in (None, "ok", "not supported")]
    if failed:
        print(f"FAILED runs: {failed}", file=sys.stderr)
    problems = acceptance_problems(rows)
    for p in problems:
        print(f"acceptance: {p}", file=sys.stderr)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
