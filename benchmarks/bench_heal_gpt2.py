"""Kill -> every rank resumed under ``accelpact-run`` with a transformers GPT-2, side by side per replacement start.

examples/heal_loop.py ``--model gpt2`` (transformers loads GPT-2's modeling module at the model's first
build, never at import) on 2 ranks, steps of about 1 s (``--pause-s 1``: the template has imported what the
ranks loaded by their first step before the kill); rank 1 SIGKILLs itself in step 8 and is healed. Per trial, one job of
each configuration, one after another in a shuffled order (the host is shared and its load moves):

- ``template``: the default flags (the template also imports what the ranks loaded by their first step);
- ``template_top_level_only``: the same with ``ACCELPACT_RUN_NO_MODULE_PRELOAD=1`` (the template imports the
  script's top-level imports only: the behaviour before accelpact.run.modules);
- ``hot_spare``: ``--hot-spares 1``; ``spawn``: ``--replacement spawn``.

The figure: from the killed rank's ``KILLED_AT`` line to the last rank's heal ending (``HealEvent.t``: its
first collective on the healed groups), per job; the median over trials with the harness's interval for
it (harness.report.intervals: distribution-free order statistics, its true coverage printed), and each
configuration's ratio to ``template`` paired by trial.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_heal_gpt2.py --trials 5 --out results/process_loss
    PYTHONPATH=. .venv/bin/python benchmarks/bench_heal_gpt2.py --render results/process_loss  # redraw from its json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "template": ([], {}),
    "template_top_level_only": ([], {"ACCELPACT_RUN_NO_MODULE_PRELOAD": "1"}),
    "hot_spare": (["--hot-spares", "1"], {}),
    "spawn": (["--replacement", "spawn"], {}),
}


def run_job(scratch: Path, name: str, agent_args: list[str], extra_env: dict[str, str]) -> dict[str, Any]:
    job = scratch / name
    job.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra_env)
    for var in ("ACCELPACT_CONTROL_ADDR", "ACCELPACT_JOB_TOKEN", "ACCELPACT_SNAPSHOT_TOKEN"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "accelpact.run",
        "--nproc-per-node",
        "2",
        "--rdzv-id",
        f"bench{os.getpid()}{name}",
        "--log-dir",
        str(job / "logs"),
        "--snapshot-root",
        str(job / "shm"),
        *agent_args,
        str(ROOT / "examples" / "heal_loop.py"),
        "--model",
        "gpt2",
        "--steps",
        "10",
        "--every",
        "100",
        "--pause-s",
        "1",
        "--kill-in",
        "step",
        "--kill-at",
        "8",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    logs = {r: (job / "logs" / f"rank{r}.log").read_text() for r in (0, 1)}
    killed = [float(line.split()[1]) for line in logs[1].splitlines() if line.startswith("KILLED_AT ")]
    ends = []
    for text in logs.values():
        for line in text.splitlines():
            if line.startswith("RESULT "):
                ends += [h["t"] for h in json.loads(line[7:])["heals"]]
    ok = p.returncode == 0 and len(killed) == 1 and len(ends) == 2
    return {
        "ok": ok,
        "rc": p.returncode,
        "kill_to_resumed_s": max(ends) - killed[0] if ok else None,
        "agent_tail": "" if ok else (p.stdout + p.stderr)[-2000:],
        "load": os.getloadavg()[0],
    }


HEADER = (
    "# Kill -> every rank resumed under `accelpact-run`, GPT-2 (transformers), world 2\n\n"
    "benchmarks/bench_heal_gpt2.py: examples/heal_loop.py `--model gpt2` (transformers imports GPT-2's "
    "modeling module at the model's first build), steps of about 1 s, rank 1 SIGKILLed in step 8 and "
    "healed; from the "
    "killed rank's last line to the last rank's heal ending (its first collective on the healed "
    "groups). `template` is the default flags; `template_top_level_only` the template without the "
    "modules the ranks loaded by their first step (accelpact.run.modules), as before.\n\n"
)


def table(names: list[str], rows: dict[str, list[dict[str, Any]]]) -> tuple[list[str], dict[str, Any]]:
    """The markdown table and its summary: per configuration the median [interval] and the ratio to template."""
    from harness.report.intervals import coverage_text, order_statistic

    lines = [
        "| replacement start | kill -> every rank resumed, median [interval] (s) | / template, paired [interval] | ok |",
        "|---|---|---|---|",
    ]
    summary: dict[str, Any] = {}
    shown = []
    base = [r["kill_to_resumed_s"] for r in rows.get("template", [])]
    for name in names:
        vals = [r["kill_to_resumed_s"] for r in rows[name] if r["ok"]]
        iv = order_statistic(vals)
        pairs = [
            v / b for v, b in zip((r["kill_to_resumed_s"] for r in rows[name]), base) if v is not None and b is not None
        ]
        ratio = order_statistic(pairs) if name != "template" else None
        shown += [iv] + ([ratio] if ratio is not None else [])
        summary[name] = {
            "values": vals,
            "median": iv.median,
            "interval": [iv.lo, iv.hi],
            "coverage": iv.coverage,
            "ratio": None if ratio is None else [ratio.median, ratio.lo, ratio.hi],
        }
        lines.append(
            f"| {name} | {iv.text('.2f')} | {'-' if ratio is None else ratio.text('.2f')} | "
            f"{len(vals)}/{len(rows[name])} |"
        )
    lines += [
        "",
        "interval: the distribution-free order-statistic interval for the median (harness.report.intervals); "
        f"coverage {coverage_text(shown)}.",
    ]
    return lines, summary


def render(out: Path) -> None:
    """Redraw heal_gpt2.md (and the json's summary) from the committed json's raw rows."""
    data = json.loads((out / "heal_gpt2.json").read_text())
    rows, prov = data["rows"], data["provenance"]
    lines, summary = table(list(rows), rows)
    prov = [line for line in prov if not line.startswith("- table redrawn")]
    prov.append(
        "- table redrawn from heal_gpt2.json's rows by `benchmarks/bench_heal_gpt2.py --render` (interval method)"
    )
    text = "\n".join(lines + ["", "### Provenance", ""] + prov) + "\n"
    (out / "heal_gpt2.md").write_text(HEADER + text)
    (out / "heal_gpt2.json").write_text(json.dumps({"summary": summary, "rows": rows, "provenance": prov}, indent=1))
    print(HEADER + text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=None, help="write heal_gpt2.md and heal_gpt2.json here")
    ap.add_argument("--render", type=Path, default=None, help="only redraw the table in this directory from its json")
    args = ap.parse_args()
    if args.render is not None:
        render(args.render)
        return
    names = args.configs.split(",")
    rng = random.Random(0)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--", "accelpact", "examples", "benchmarks"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.strip()
    )
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load0 = os.getloadavg()
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="bench_heal_gpt2_") as tmp:
        for trial in range(args.trials):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                agent_args, extra_env = CONFIGS[name]
                r = run_job(Path(tmp) / f"t{trial}", name, agent_args, extra_env)
                rows[name].append(r)
                print(
                    f"trial {trial} {name}: {r['kill_to_resumed_s'] if r['ok'] else 'FAILED rc=' + str(r['rc'])} "
                    f"(load {r['load']:.1f})",
                    flush=True,
                )
                if not r["ok"]:
                    print(r["agent_tail"], flush=True)
    lines, summary = table(names, rows)
    loads = [r["load"] for rs in rows.values() for r in rs]
    prov = [
        f"- command: `PYTHONPATH=. {Path(sys.executable).name} benchmarks/bench_heal_gpt2.py --trials {args.trials}`",
        f"- code: git `{sha}`{' (with uncommitted changes under accelpact/, examples/ or benchmarks/)' if dirty else ''}",
        f"- date: {started}",
        f"- machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), python "
        f"{platform.python_version()}, torch {__import__('torch').__version__}, no GPU used; load average "
        f"{load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} at the start, 1-min load after each job "
        f"min {min(loads):.1f} max {max(loads):.1f}",
        f"- trials: {args.trials} per configuration, configurations shuffled within each trial",
    ]
    text = "\n".join(lines + ["", "### Provenance", ""] + prov) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "heal_gpt2.md").write_text(HEADER + text)
        (args.out / "heal_gpt2.json").write_text(
            json.dumps({"summary": summary, "rows": rows, "provenance": prov}, indent=1)
        )


if __name__ == "__main__":
    main()
