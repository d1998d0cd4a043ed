"""Reconfigure vs rebuild-and-rebind on torch 2.15, and torch 2.13 vs 2.15, side by side in one run (not a test).

Writes ``results/reconfigure/table.md`` (with ``--out``) and prints the same table. In one run:

1. recovery after detection, at world 2 and 4: the same guarded FSDP2 training with real socket resets
   at mixed phases, once with ``attach(data_plane="rebind")`` (the 2.13 path: new groups under the old
   names, then every cached reference rebound) and once with ``data_plane="reconfigure"`` (the same
   group objects reconfigured in place), interleaved round by round so both see the same load. Each
   figure is per fault on the slowest rank, median [max]; the first collective on the recovered groups
   is one of the parts;
2. heal of a SIGKILLed rank, death -> every rank resumed (one harness run per trial, 2 ranks, the
   replacement forked from the preloaded template): under torch 2.13 (rebuild) and 2.15 (reconfigure);
3. the guard's steady-state step cost (guarded vs plain FSDP2 step, interleaved blocks, world 2), under
   torch 2.13 and 2.15.

Run it with the 2.15 interpreter and name the 2.13 one:

    PYTHONPATH=. .venv-torch215/bin/python benchmarks/bench_reconfigure.py --python213 .venv/bin/python \\
        --out results/reconfigure

The machine's load average is printed at the start and end of every part: on a shared host it moves
the absolute figures far more than the paths differ, which is why every comparison is interleaved.
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
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from accelpact.testing.rank import RankContext

RUNNER = "benchmarks.bench_reconfigure:run_rank"
MODEL = {"seq": 64, "batch": 2}
PHASES = ["forward_allgather_middle", "backward_reduce_scatter", "vote", "clip_allreduce"]
PARTS = ["agreement_s", "rebuild_s", "rebind_s", "first_collective_s", "total_s"]


# ----------------------------------------------------------------------------- rank side


def run_rank(sc: dict, ctx: RankContext) -> dict:
    """One rank: "recovery" (faults through a guard on the given data-plane path) or "overhead"."""
    import torch

    from accelpact import testing as ft
    from accelpact.guard import attach, clip_gradients
    from experiments.workloads.fsdp_models import batch_for, build, model_config, step_fn_for

    torch.set_num_threads(1)
    m = model_config({**MODEL, "layers": sc["layers"]})
    model, opt, root, middle = build("fsdp2", m)
    rank = ctx.rank
    step_fn = step_fn_for(model)
    step_fn(batch_for(0, rank, m))  # lazy init
    opt.zero_grad(set_to_none=True)
    inj = ft.FaultInjector(exclude_ports=ctx.exclude_ports)
    kwargs = {"data_plane": sc["data_plane"]} if sc.get("data_plane") else {}
    guard = attach(
        model,
        opt,
        ctx.control,
        max_grad_norm=1.0,
        pg_timeout=timedelta(seconds=120),
        injection_clock=inj.consume_injection_time,
        **kwargs,
    )
    out: dict = {"torch": torch.__version__, "path": guard.plane.last_path}
    step = 1
    if sc["kind"] == "overhead":
        plain, guarded = [], []
        for _block in range(sc["blocks"]):
            for _ in range(sc["block_steps"]):
                t = time.perf_counter()
                step_fn(batch_for(step, rank, m))
                clip_gradients(model, 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                plain.append(time.perf_counter() - t)
                step += 1
            guard.resume_at(step)
            for _ in range(sc["block_steps"]):
                t = time.perf_counter()
                guard.step(step_fn, batch_for(step, rank, m))
                guarded.append(time.perf_counter() - t)
                step += 1
        out["plain_s"], out["guarded_s"] = plain, guarded
        return out
    guard.phase_hooks.append(inj.on_phase)
    inj.install(root, middle)
    start = step
    guard.resume_at(step)
    for k in range(sc["faults"]):
        if rank == k % ctx.world_size:
            inj.arm(start + 2 * k + 1, PHASES[k % len(PHASES)])
    for s in range(start, start + 2 * sc["faults"] + 2):
        guard.step(step_fn, batch_for(s, rank, m))
    out["events"] = [e.to_dict() for e in guard.events]
    return out


# ----------------------------------------------------------------------------- driver


def _session(world: int, scenario: dict) -> list[dict]:
    from accelpact.testing.session import run_session

    tmp = Path(tempfile.mkdtemp(prefix=f"bench_reconf_w{world}_"))
    s = run_session(
        tmp, RUNNER, [{"name": scenario["kind"], **scenario}], world_size=world, pythonpath=[ROOT], timeout_s=1800
    )
    return s.job(scenario["kind"])


def _per_fault(outs: list[dict]) -> dict[str, list[float]]:
    """Each part per fault on the slowest rank, and the path every rank's event recorded."""
    n = min(len(o["events"]) for o in outs)
    res: dict[str, list] = {k: [] for k in PARTS}
    res["paths"] = []
    for i in range(n):
        evs = [o["events"][i] for o in outs]
        for k in PARTS:
            res[k].append(max(e[k] for e in evs))
        res["paths"].append(sorted({e.get("data_plane", {}).get("path", "?") for e in evs}))
    return res


def _heal_strategy() -> str:
    """The strategy part 2's harness runs use (benchmarks.bench_heal's)."""
    from benchmarks.bench_heal import STRATEGY

    return STRATEGY


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.1f} / {b:.1f} / {c:.1f}"


def _child(part: str, args: argparse.Namespace) -> None:
    """Run one part in THIS interpreter and print its JSON (the driver calls this under each torch)."""
    import torch

    if part == "overhead":
        outs = _session(
            2, {"kind": "overhead", "layers": args.layers, "blocks": args.blocks, "block_steps": args.block_steps}
        )
        print(
            json.dumps(
                {
                    "torch": torch.__version__,
                    "plain_s": outs[0]["plain_s"],
                    "guarded_s": outs[0]["guarded_s"],
                    "path": outs[0]["path"],
                }
            )
        )
    elif part == "heal":
        from benchmarks.bench_heal import one_trial

        tmp = Path(tempfile.mkdtemp(prefix="bench_reconf_heal_"))
        r = one_trial(tmp, args.trial, "vote", 5, 8, "template")
        print(json.dumps({"torch": torch.__version__, **r}))
    else:
        raise SystemExit(f"unknown --child {part!r}")


def _run_child(python: str, kind: str, args: argparse.Namespace, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--layers",
        str(args.layers),
        "--blocks",
        str(args.blocks),
        "--block-steps",
        str(args.block_steps),
        *extra,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} [{max(xs) * 1e3:.1f}]" if xs else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--python213",
        default=str(ROOT / ".venv" / "bin" / "python"),
        help="the torch 2.13 interpreter for parts 2 and 3",
    )
    ap.add_argument("--faults", type=int, default=4, help="faults per recovery session")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds per path and world")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heal-trials", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--block-steps", type=int, default=5)
    ap.add_argument("--alternations", type=int, default=2, help="part 3: 2.13/2.15 session pairs")
    ap.add_argument("--parts", default="123")
    ap.add_argument("--out", type=Path, default=None, help="write table.md and raw.json here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trial", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args)
        return 0

    import torch

    if not torch.__version__.startswith("2.15"):
        raise SystemExit(
            f"run this with the torch 2.15 interpreter (this one has {torch.__version__}); "
            "e.g. `make setup-torch215` then .venv-torch215/bin/python"
        )
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    cmd = " ".join(
        [
            "PYTHONPATH=.",
            os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable,
            "benchmarks/bench_reconfigure.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    lines = [
        "# Reconfigure vs rebuild-and-rebind (torch 2.15), and torch 2.13 vs 2.15, side by side in one run",
        "",
        f"- command: `{cmd}`",
        f"- git sha: {sha}{' (with uncommitted changes)' if dirty else ''}",
        f"- machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} CPU cores, no GPU, "
        f"Python {platform.python_version()}, torch {torch.__version__} (driver) and the 2.13 interpreter "
        f"`{args.python213}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- load: the host is shared by other engineers' test runs; the 1/5/15-min load average is given at "
        "the start and end of each part (2 cores: anything above 2 means ranks wait for a core). Absolute "
        "figures move with it; compare within a part, whose rows are interleaved.",
        "",
    ]
    raw: dict = {"sha": sha}
    print("\n".join(lines), flush=True)

    if "1" in args.parts:
        lines += [
            f"## 1. Recovery after detection: rebuild + rebind vs reconfigure (torch {torch.__version__})",
            "",
            f"{args.layers}-layer decoder (hidden 256), FSDP2 per block + root, gloo on 127.0.0.1; "
            f"{args.repeats} x {args.faults} socket resets per cell at mixed phases ({', '.join(PHASES)}), "
            "rounds interleaved rebuild/reconfigure. Per fault, the slowest rank's figure; median [max] in ms. "
            "`rebuild` is the new groups' rendezvous (rebuild path) or the handle exchange + "
            "`_reconfigure` (reconfigure path); `first collective` is the first all-reduce on the "
            "recovered groups; `total` is detection -> ready to continue.",
            "",
            f"load at start: {_load()}",
            "",
            "| world | path (events say) | agreement | rebuild / reconfigure | rebind | first collective | total |",
            "|---|---|---|---|---|---|---|",
        ]
        for world in [int(w) for w in args.worlds.split(",")]:
            cells: dict[str, dict[str, list]] = {"rebind": {}, "reconfigure": {}}
            for _ in range(args.repeats):
                for path in cells:
                    got = _per_fault(
                        _session(
                            world,
                            {"kind": "recovery", "layers": args.layers, "faults": args.faults, "data_plane": path},
                        )
                    )
                    for k, v in got.items():
                        cells[path].setdefault(k, []).extend(v)
            for path, c in cells.items():
                seen = sorted({p for ps in c["paths"] for p in ps})
                raw[f"recovery/w{world}/{path}"] = c
                lines.append(
                    f"| {world} | {path} ({', '.join(seen)}; {len(c['total_s'])} faults) | "
                    + " | ".join(_ms(c[k]) for k in PARTS)
                    + " |"
                )
                print(lines[-1], flush=True)
        lines += ["", f"load at end: {_load()}", ""]

    if "2" in args.parts:
        lines += [
            "## 2. Heal of a SIGKILLed rank: death -> every rank resumed",
            "",
            f"One harness run per trial (`strategy={_heal_strategy()} fault=kill`, 2 gloo ranks, the small decoder, kill "
            "at step 5's vote, replacement forked from the preloaded template), under each torch, "
            "interleaved. Seconds.",
            "",
            f"load at start: {_load()}",
            "",
            "| torch | data-plane path | death -> resumed | process start | after arrival | replayed steps |",
            "|---|---|---|---|---|---|",
        ]
        heal: dict[str, list[dict]] = {"2.13": [], "2.15": []}
        for t in range(args.heal_trials):
            for name, py in (("2.13", args.python213), ("2.15", sys.executable)):
                heal[name].append(_run_child(py, "heal", args, ["--trial", str(t)]))
        for name, rs in heal.items():
            raw[f"heal/{name}"] = rs
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731, B023 - used in this iteration
            lines.append(
                f"| {rs[0]['torch']} | {'reconfigure' if name == '2.15' else 'rebind'} | "
                f"{med('death_to_resumed_s'):.2f} | {med('process_start_s'):.2f} | "
                f"{med('after_arrival_s'):.2f} | {max(r['replayed_steps'] for r in rs)} |"
            )
            print(lines[-1], flush=True)
        lines += ["", f"load at end: {_load()}", ""]

    if "3" in args.parts:
        lines += [
            "## 3. Steady-state cost of the guard: torch 2.13 vs 2.15",
            "",
            f"World 2, {args.layers}-layer decoder; plain FSDP2 steps and guarded steps in interleaved blocks "
            f"({args.blocks} x {args.block_steps} steps each) inside one session per torch; the two torch "
            f"sessions run one after the other, {args.alternations} time(s) each, alternating. Median step, ms.",
            "",
            f"load at start: {_load()}",
            "",
            "| torch | data-plane path | plain step | guarded step | guarded / plain step time |",
            "|---|---|---|---|---|",
        ]
        over: dict[str, list[dict]] = {"2.13": [], "2.15": []}
        for _ in range(args.alternations):
            for name, py in (("2.13", args.python213), ("2.15", sys.executable)):
                over[name].append(_run_child(py, "overhead", args, []))
        for name, rs in over.items():
            raw[f"overhead/{name}"] = rs
            plain = statistics.median(x for r in rs for x in r["plain_s"])
            guarded = statistics.median(x for r in rs for x in r["guarded_s"])
            lines.append(
                f"| {rs[0]['torch']} | {rs[0]['path']['path']} | {plain * 1e3:.1f} | {guarded * 1e3:.1f} | "
                f"{(guarded / plain - 1) * 100:+.2f}% |"
            )
            print(lines[-1], flush=True)
        lines += ["", f"load at end: {_load()}", ""]

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text("\n".join(lines) + "\n")
        (args.out / "raw.json").write_text(json.dumps(raw, indent=1))
        print(f"wrote {args.out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
