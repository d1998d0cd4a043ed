"""Heal of a killed rank, measured: death -> every rank resumed, with the replacement's process start apart.

Each trial is one real harness run (``python -m harness``, strategy=accelpact, 2 gloo ranks, the small
decoder): the parent SIGKILLs rank 1 at step ``--step`` and ``--phase``, starts a replacement for it,
and the survivors heal it in memory (accelpact.recovery.heal). From the run's events:

- ``death -> resumed``: the parent's fault record (the SIGKILL) -> the last rank's heal end (its first
  collective on the new generation done: every rank resumed);
- ``process start``: the replacement's launch -> its arrival on the control channel (Python, torch,
  transformers imports, the control connection), measured inside the replacement;
- ``after arrival``: arrival -> every rank resumed (rendezvous, the replacement's model build, the load
  of the resume step, the first collective);
- ``replayed``: steps run twice; ``disk bytes``: bytes the heal read from a checkpoint file (0 by design;
  any ``restore`` event would show up here).

Each trial runs three times, side by side: with the replacement forked from the preloaded template
(``strategy.replacement_start=template``, the default: harness.parent.template), with a fresh spawned
process (``strategy.replacement_start=spawn``), and with a hot spare (``strategy.hot_spares=1``: a process
started with the ranks, imported and waiting). Also in the same run of this script: the reference process
starts (a bare ``python -c "import torch"``, and one that also imports the model class), timed --starts
times before and after the trials, and where a spawned replacement's start goes (``start_parts``: a fresh
Python doing the replacement's steps with a timestamp after each). The issue's targets: death -> resumed
<= one bare Python + torch start + 1 s; with a hot spare, <= 1 s.

    .venv/bin/python benchmarks/bench_heal.py --trials 3 --phase vote --out results/heal
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import strategies  # noqa: E402 - after the path: this checkout's harness

STRATEGY = strategies.healer().name  # the strategy whose heal this measures (AccelPact's)

TINY = ["experiment=smoke", "model.num_layers=2", "model.seq_len=32", "model.batch_size=2", "progress=false"]


# The process starts measured side by side: a bare Python + torch (the yardstick), and Python +
# torch + the transformers model class the harness trains (``import transformers`` alone is lazy and
# imports almost nothing: a spawned replacement pays for the model class).
STARTS = {
    "python + torch": "import torch",
    "python + torch + MistralForCausalLM": "import torch, torch.distributed; "
    "from transformers import MistralForCausalLM",
}
MODES = {
    "template": ["strategy.replacement_start=template"],
    "spawn": ["strategy.replacement_start=spawn"],
    "hot spare": ["strategy.hot_spares=1"],
}

# A spawned replacement's start, step by step (what the template does once at launch instead).
PARTS = """
import json, sys, time
t = [("interpreter up", time.perf_counter())]
import torch, torch.distributed
t.append(("import torch, torch.distributed", time.perf_counter()))
import harness.rank.train, harness.rank.strategies.accelpact
t.append(("harness rank modules (FSDP, strategies)", time.perf_counter()))
import accelpact, accelpact.snapshot
t.append(("accelpact", time.perf_counter()))
from harness.models import meta_model
from harness.schema import ModelConfig
meta_model(ModelConfig(num_layers=2))
t.append(("transformers model class + meta model", time.perf_counter()))
print(json.dumps([(name, b - a) for (name, b), (_, a) in zip(t[1:], t[:-1])]))
"""


def process_start(n: int) -> dict[str, list[float]]:
    """Seconds for a fresh Python to run each of STARTS (what a replacement pays before anything else)."""
    out: dict[str, list[float]] = {k: [] for k in STARTS}
    for _ in range(n):
        for name, code in STARTS.items():
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", code],
                check=True,
                env={**os.environ, "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
            )
            out[name].append(time.perf_counter() - t0)
    return out


def start_parts(n: int) -> dict[str, list[float]]:
    """Seconds of each step of a spawned replacement's start before it connects (PARTS), n times."""
    out: dict[str, list[float]] = {}
    for _ in range(n):
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", PARTS],
            check=True,
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "TRANSFORMERS_OFFLINE": "1",
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
            },
        )
        total = time.perf_counter() - t0
        parts = json.loads(done.stdout.strip().splitlines()[-1])
        out.setdefault("python interpreter (exec -> first line)", []).append(total - sum(v for _, v in parts))
        for name, value in parts:
            out.setdefault(name, []).append(value)
    return out


def one_trial(tmp: Path, i: int, phase: str, step: int, steps: int, mode: str) -> dict:
    from harness.events import Fault, Heal, Replacement, Restore, Step, load_events, of_type

    run_dir = tmp / f"trial{i}-{mode.replace(' ', '_')}"
    cmd = [
        sys.executable,
        "-m",
        "harness",
        f"index_path={tmp / 'index.csv'}",
        *TINY,
        f"train.steps={steps}",
        f"strategy={STRATEGY}",
        "strategy.snapshot.max_tax=null",  # every step snapshotted, as the committed figures were
        "fault=kill",
        "fault.ranks=[1]",
        f"fault.at_step={step}",
        f"fault.phase={phase}",
        *MODES[mode],
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"trial {i} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    events = load_events(run_dir)
    [fault] = of_type(events, Fault)
    heals = of_type(events, Heal)
    [rep] = [e for e in heals if e.role == "replacement"]
    [started] = of_type(events, Replacement)
    if started.start != mode.replace(" ", "_"):
        raise RuntimeError(
            f"trial {i} {mode}: the replacement started as {started.start} ({started.template_fallback})"
        )
    resumed = max(e.t for e in heals)
    t_arrived = rep.t_detected + rep.replacement_start_s
    steps_seen: dict[tuple[int, int], int] = {}
    for e in of_type(events, Step):
        steps_seen[(e.rank, e.step)] = steps_seen.get((e.rank, e.step), 0) + 1
    return {
        "mode": mode,
        "template_import_s": started.template_import_s,
        "death_to_resumed_s": resumed - fault.t,
        "death_to_spawn_s": rep.t_detected - fault.t,
        "process_start_s": rep.replacement_start_s,
        "after_arrival_s": resumed - t_arrived,
        "load_s": rep.load_s,
        "source": rep.source,
        "replayed_steps": max(max(steps_seen.values()) - 1, 0),
        "disk_bytes": sum(e.bytes_read_from_disk for e in heals) + len(of_type(events, Restore)),
        "survivor_replayed": max(e.replayed_steps for e in heals),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--phase", default="vote")
    ap.add_argument("--step", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from harness.report.gitinfo import git_state

    sha, dirty = git_state()
    load0 = os.getloadavg()
    t0 = time.time()
    starts = process_start(args.starts)
    parts = start_parts(args.starts)
    with tempfile.TemporaryDirectory(prefix="bench_heal_") as tmp:
        # Interleaved, so that the load of the shared host hits every mode alike.
        trials = [
            one_trial(Path(tmp), i, args.phase, args.step, args.steps, mode)
            for i in range(args.trials)
            for mode in MODES
        ]
    for name, values in process_start(args.starts).items():  # before and after: the load moves during the run
        starts[name] += values
    keys = ("death_to_resumed_s", "death_to_spawn_s", "process_start_s", "after_arrival_s", "load_s")
    med = {mode: {k: statistics.median(t[k] for t in trials if t["mode"] == mode) for k in keys} for mode in MODES}
    ref_start = statistics.median(starts["python + torch"])
    model_start = statistics.median(starts["python + torch + MistralForCausalLM"])
    imports = [t["template_import_s"] for t in trials if t["mode"] == "template" and t["template_import_s"]]
    lines = [
        f"# Heal benchmark: one run ({args.trials} kills at step {args.step}, phase {args.phase}, 2 gloo ranks)",
        "",
        f"- command: `PYTHONPATH=. {' '.join([Path(sys.executable).name, 'benchmarks/bench_heal.py', *(argv or sys.argv[1:])])}`",
        f"- code: git `{sha}`{' (uncommitted changes)' if dirty else ''}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {time.time() - t0:.0f} s",
        f"- machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, load average "
        f"{load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after",
        "",
        "| trial | replacement | death -> every rank resumed (s) | death -> fork, spawn or assignment | replacement's "
        "own start -> arrival | after arrival | of which state load | source | replayed steps | bytes read from disk |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, t in enumerate(trials):
        lines.append(
            f"| {i // len(MODES)} | {t['mode']} | {t['death_to_resumed_s']:.2f} | {t['death_to_spawn_s']:.3f} "
            f"| {t['process_start_s']:.2f} | {t['after_arrival_s']:.2f} | {t['load_s']:.3f} | {t['source']} "
            f"| {t['replayed_steps']} | {t['disk_bytes']} |"
        )
    target = ref_start + 1.0
    for mode, m in med.items():
        lines.append(
            f"| median | {mode} | {m['death_to_resumed_s']:.2f} | {m['death_to_spawn_s']:.3f} "
            f"| {m['process_start_s']:.2f} | {m['after_arrival_s']:.2f} | {m['load_s']:.3f} | | | |"
        )
    tpl, spawn, spare = med["template"], med["spawn"], med["hot spare"]
    lines += [
        "",
        "Reference process starts, side by side in this run (a fresh `python -c ...`, median of "
        f"{2 * args.starts}): "
        + "; ".join(
            f"{name}: {statistics.median(v):.2f} s (min {min(v):.2f}, max {max(v):.2f})" for name, v in starts.items()
        )
        + ".",
        "",
        f"Where a spawned replacement's start goes (a fresh Python doing its steps, median of {args.starts}): "
        + "; ".join(f"{name} {statistics.median(v):.2f} s" for name, v in parts.items())
        + (
            f". The template pays these once, at launch: its imports took {statistics.median(imports):.2f} s "
            f"(median over the template trials), while the ranks started."
            if imports
            else "."
        ),
        "",
        f"Target, a new process: death -> every rank resumed <= one bare Python + torch start + 1 s = {target:.2f} s.",
        f"- template (forked from the preloaded process): "
        f"{'met' if tpl['death_to_resumed_s'] <= target else 'NOT met'}, median {tpl['death_to_resumed_s']:.2f} s "
        f"({tpl['death_to_resumed_s'] / ref_start:.2f}x one bare Python + torch start). The replacement's own start "
        f"(fork -> arrival) {tpl['process_start_s']:.2f} s, {tpl['process_start_s'] / ref_start:.3f}x a bare Python + "
        f"torch start; death -> resumed minus that start: {tpl['death_to_resumed_s'] - tpl['process_start_s']:.2f} s "
        "(target: <= 1 s).",
        f"- spawn (a fresh process): {'met' if spawn['death_to_resumed_s'] <= target else 'NOT met'}, median "
        f"{spawn['death_to_resumed_s']:.2f} s ({spawn['death_to_resumed_s'] / ref_start:.2f}x one bare Python + torch "
        f"start, {spawn['death_to_resumed_s'] / model_start:.2f}x one start with the model class); its own start -> "
        f"arrival {spawn['process_start_s']:.2f} s, death -> resumed minus that start "
        f"{spawn['death_to_resumed_s'] - spawn['process_start_s']:.2f} s.",
        f"Target, hot spare: death -> resumed <= 1 s: {'met' if spare['death_to_resumed_s'] <= 1.0 else 'NOT met'} "
        f"(median {spare['death_to_resumed_s']:.2f} s).",
        f"Replayed steps <= 1: {'met' if max(t['replayed_steps'] for t in trials) <= 1 else 'NOT met'}; "
        f"bytes read from disk: {sum(t['disk_bytes'] for t in trials)}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_heal.md").write_text(text)
        (args.out / "bench_heal.json").write_text(
            json.dumps({"trials": trials, "process_starts": starts, "spawn_start_parts": parts}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
