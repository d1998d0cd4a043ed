"""Detection, side by side in one run: peer detection of resets per phase, dead-rank notice latency,
and the heartbeat's cost on step time.

1. Notice latency (in this process, a real TCPStore): a survivor waits in ``ControlChannel.gather``
   with a ``PeerWatch``; another thread writes a death notice at a random moment; the figure is the
   time from the write to the RankLostError (p50 / p99 / max over --trials).
2. Heartbeat-rule latency (a real session of 2 gloo ranks): a rank SIGKILLs itself mid-step with no
   launcher notice; the survivor's RankLostError comes from the heartbeat rule. One trial per --rounds.
3. Heartbeat cost: the tiny FSDP2 decoder trained by 2 gloo ranks with the heartbeat on, then off,
   interleaved --rounds times (load from other processes hits both alike); median step time of each
   and the relative difference (target <= 0.5 %). The same steps time the data plane's idle gap
   after the vote: vote done -> optimizer.step + zero_grad done -> next step's start -> its first
   all-gather. A reset landing in that gap (the post_vote phase) is met there by every rank.
4. Peer detection of a connection reset on one rank and on all ranks, per phase, at --worlds
   (``benchmarks/bench_reset_detection.py``'s sessions and table; target p50 <= 10 ms, p99 <= 50 ms).

    .venv/bin/python benchmarks/bench_detection.py --trials 40 --rounds 3 --steps 30 \
        --worlds 2 4 --per-cell 10 --per-cell-w4 6 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's accelpact, not an installed one


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def notice_latency(trials: int) -> list[float]:
    from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server
    from accelpact.detection.liveness import LivenessConfig, PeerJudge, PeerWatch, publish_death
    from accelpact.errors import RankLostError

    server, port = start_control_server()
    out = []
    for _ in range(trials):
        token = new_job_token()
        chan = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 2, token, deadline_s=10.0))
        written: list[float] = []

        def write() -> None:
            written.append(time.monotonic())  # noqa: B023 - the timer fires within this trial
            publish_death(server, token, 1, by="bench", reason="simulated waitpid")  # noqa: B023, F821 - ditto; del is after the loop

        threading.Timer(random.uniform(0.1, 0.3), write).start()
        watch = PeerWatch(token, 0, PeerJudge(LivenessConfig(), connection_dropped=False), generation=1)
        try:
            chan.gather("report", b"x", 1, watch=watch)
        except RankLostError:
            out.append(time.monotonic() - written[0])
        chan.close()
    del server
    return out


def _thread_cpu_s(beat: Any) -> float:
    """CPU seconds the heartbeat's thread has run (the kernel's per-thread schedstat, in ns)."""
    if beat is None:
        return 0.0
    return int(Path(f"/proc/self/task/{beat._thread.native_id}/schedstat").read_text().split()[0]) / 1e9


def run(sc: dict, ctx: Any) -> dict:
    """Scenario runner (ranks of a session): ``kind`` "steps" (time steps, heartbeat on/off) or "die"."""
    from accelpact.errors import RankLostError
    from accelpact.guard import attach
    from experiments.workloads.fsdp_models import batch_for, build, model_config, step_fn_for

    m = model_config(None)
    model, optimizer, root, _m = build("fsdp2", m)
    guard = attach(
        model,
        optimizer,
        ctx.control,
        max_grad_norm=1.0,
        pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
        heartbeat_interval_s=sc.get("heartbeat_interval_s"),
        stall_timeout_s=None,
    )
    inner = step_fn_for(model)
    ctx.barrier(f"built/{sc['name']}")
    times: list[float] = []
    if sc["kind"] == "die":

        def step_fn(batch):
            if ctx.rank == 1 and guard.next_step == 2:
                (ctx.out_dir / f"{sc['name']}.died.json").write_text(json.dumps({"t": time.time()}))
                os.kill(os.getpid(), 9)
            return inner(batch)

        try:
            for step in range(4):
                guard.step(step_fn, batch_for(step, ctx.rank, m))
        except RankLostError as exc:
            guard.close()
            return {"t_raised": time.time(), "detected_by": exc.detected_by, "error": None}
        guard.close()
        return {"t_raised": None, "error": None}
    marks: dict[int, dict[str, float]] = {}

    def mark(what: str, step: int) -> None:
        marks.setdefault(step, {})[what] = time.perf_counter()

    guard.phase_hooks.append(lambda phase, step: mark(phase, step) if phase in ("post_vote", "step_start") else None)
    # Prepended before FSDP's own pre-forward: right before the step's first all-gather.
    root.register_forward_pre_hook(lambda _mod, _args: mark("first_collective", guard.next_step), prepend=True)
    beat = getattr(guard, "_heartbeat", None)  # its thread's CPU time: the beat's cost, whatever the load
    cpu0, wall0 = _thread_cpu_s(beat), time.perf_counter()
    for step in range(sc["steps"]):
        t = time.perf_counter()
        guard.step(inner, batch_for(step, ctx.rank, m))
        mark("applied", step)
        times.append(time.perf_counter() - t)
    beat_cpu = None if beat is None else {"cpu_s": _thread_cpu_s(beat) - cpu0, "wall_s": time.perf_counter() - wall0}
    guard.close()
    gap = [
        {
            "apply": marks[s]["applied"] - marks[s]["post_vote"],
            "between": marks[s + 1]["step_start"] - marks[s]["applied"],
            "to_first_collective": marks[s + 1]["first_collective"] - marks[s + 1]["step_start"],
        }
        for s in range(3, sc["steps"] - 1)
    ]
    return {
        "step_s": times[3:],
        "post_vote_gap": gap,
        "beat_cpu": beat_cpu,
        "error": None,
    }  # the first steps include lazy init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--worlds", type=int, nargs="*", default=[2, 4], help="reset detection: world sizes (none: skip)"
    )
    parser.add_argument(
        "--per-cell", type=int, default=10, help="reset detection: faults per (phase, one/all) at world 2"
    )
    parser.add_argument("--per-cell-w4", type=int, default=6, help="reset detection: faults per cell above world 2")
    parser.add_argument("--sessions", type=int, default=2, help="reset detection: sessions per world")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import subprocess

    from accelpact.testing.session import load_average, run_session
    from benchmarks import bench_reset_detection as resets

    t0 = time.time()
    load_before = load_average()
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    notices = notice_latency(args.trials)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_detection_"))
    runner = "benchmarks.bench_detection:run"
    scenarios: list[dict] = []
    for i in range(args.rounds):
        scenarios += [
            {"name": f"on{i}", "kind": "steps", "steps": args.steps, "heartbeat_interval_s": 0.5},
            {"name": f"off{i}", "kind": "steps", "steps": args.steps, "heartbeat_interval_s": None},
        ]
    s = run_session(out / "cost", runner, scenarios, control_deadline_s=60.0)
    on = [t for i in range(args.rounds) for r in (0, 1) for t in s.result(f"on{i}", r)["step_s"]]
    off = [t for i in range(args.rounds) for r in (0, 1) for t in s.result(f"off{i}", r)["step_s"]]
    hb_latency = []
    for i in range(args.rounds):
        d = run_session(
            out / f"die{i}",
            runner,
            [{"name": "die", "kind": "die", "heartbeat_interval_s": 0.5}],
            control_deadline_s=60.0,
            allowed_to_fail=[1],
        )
        died = json.loads((out / f"die{i}" / "die.died.json").read_text())["t"]
        res = d.result("die", 0)
        if res and res.get("t_raised"):
            hb_latency.append(res["t_raised"] - died)
    beats = [s.result(f"on{i}", r)["beat_cpu"] for i in range(args.rounds) for r in (0, 1)]
    gaps = [
        g
        for i in range(args.rounds)
        for n in (f"on{i}", f"off{i}")
        for r in (0, 1)
        for g in s.result(n, r)["post_vote_gap"]
    ]
    reset_samples: list[dict] = []
    for w in args.worlds:
        n = args.per_cell if w <= 2 else args.per_cell_w4
        samples, _meta = resets.run_world(out / "resets", w, resets.schedule(w, n, resets.PHASES, 0), args.sessions, 4)
        reset_samples += samples
    cells = resets.summarise(reset_samples, args.worlds, resets.PHASES) if args.worlds else []
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(
        f"\nbench_detection at {sha}, {os.cpu_count()} cores, load average {load_before} before, "
        f"{load_average()} after, {time.time() - t0:.0f} s"
    )
    if cells:
        print(resets.table(cells))
        print()
    print(
        f"dead-rank notice -> RankLostError  (n={len(notices)}): p50 {_pct(notices, 0.5) * 1e3:.0f} ms, "
        f"p99 {_pct(notices, 0.99) * 1e3:.0f} ms, max {max(notices) * 1e3:.0f} ms"
    )
    if hb_latency:
        print(
            f"SIGKILL -> RankLostError, heartbeat rule, no launcher notice (n={len(hb_latency)}): "
            f"{', '.join(f'{x:.2f}' for x in hb_latency)} s"
        )
    print(f"step time, heartbeat on  (n={len(on)}): median {med_on * 1e3:.1f} ms")
    print(f"step time, heartbeat off (n={len(off)}): median {med_off * 1e3:.1f} ms")
    print(f"heartbeat cost: {(med_on - med_off) / med_off * 100:+.2f} % of the median step (on vs off)")
    beat_cpu, beat_wall = sum(b["cpu_s"] for b in beats), sum(b["wall_s"] for b in beats)
    print(
        f"heartbeat thread CPU: {beat_cpu * 1e3:.1f} ms over {beat_wall:.0f} s of training per rank summed "
        f"({beat_cpu / beat_wall * 100:.3f} % of one core; at most that share of each step, whatever the load)"
    )
    parts = {k: statistics.median(g[k] for g in gaps) * 1e3 for k in ("apply", "between", "to_first_collective")}
    print(
        f"data plane idle after the vote (n={len(gaps)}, medians): optimizer.step + zero_grad {parts['apply']:.1f} ms, "
        f"between steps {parts['between']:.1f} ms, step start -> first all-gather {parts['to_first_collective']:.1f} ms; "
        f"total {statistics.median(sum(g.values()) for g in gaps) * 1e3:.1f} ms (a post_vote reset is met at its end)"
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "argv": sys.argv,
                "sha": sha,
                "load_before": load_before,
                "load_after": load_average(),
                "notice_s": notices,
                "heartbeat_rule_s": hb_latency,
                "step_s_on": on,
                "step_s_off": off,
                "beat_cpu": beats,
                "post_vote_gap": gaps,
                "reset_cells": cells,
                "reset_samples": reset_samples,
            },
            indent=1,
        )
    )
    print(f"raw figures -> {out / 'results.json'}")


if __name__ == "__main__":
    main()
