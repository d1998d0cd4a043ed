"""Detection, side by side in one run: dead-rank notice latency and the heartbeat's cost on step time.

1. Notice latency (in this process, a real TCPStore): a survivor waits in ``ControlChannel.gather``
   with a ``PeerWatch``; another thread writes a death notice at a random moment; the figure is the
   time from the write to the RankLostError (p50 / p99 / max over --trials).
2. Heartbeat-rule latency (a real session of 2 gloo ranks): a rank SIGKILLs itself mid-step with no
   launcher notice; the survivor's RankLostError comes from the heartbeat rule. One trial per --rounds.
3. Heartbeat cost: the tiny FSDP2 decoder trained by 2 gloo ranks with the heartbeat on, then off,
   interleaved --rounds times (load from other processes hits both alike); median step time of each
   and the relative difference (target <= 0.5 %).

    .venv/bin/python benchmarks/bench_detection.py --trials 40 --rounds 3 --steps 30
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
    from accelpact.errors import RankLostError
    from accelpact.liveness import LivenessConfig, PeerJudge, PeerWatch, publish_death

    server, port = start_control_server()
    out = []
    for _ in range(trials):
        token = new_job_token()
        chan = ControlChannel.connect(ControlConfig("127.0.0.1", port, 0, 2, token, deadline_s=10.0))
        written: list[float] = []

        def write() -> None:
            written.append(time.monotonic())
            publish_death(server, token, 1, by="bench", reason="simulated waitpid")

        threading.Timer(random.uniform(0.1, 0.3), write).start()
        watch = PeerWatch(token, 0, PeerJudge(LivenessConfig(), connection_dropped=False), generation=1)
        try:
            chan.gather("report", b"x", 1, watch=watch)
        except RankLostError:
            out.append(time.monotonic() - written[0])
        chan.close()
    del server
    return out


def run(sc: dict, ctx: Any) -> dict:
    """Scenario runner (ranks of a session): ``kind`` "steps" (time steps, heartbeat on/off) or "die"."""
    from accelpact.errors import RankLostError
    from accelpact.guard import attach
    from experiments._fsdp_models import batch_for, build, model_config, step_fn_for

    m = model_config(None)
    model, optimizer, _r, _m = build("fsdp2", m)
    guard = attach(model, optimizer, ctx.control, max_grad_norm=1.0, pg_timeout=timedelta(seconds=ctx.pg_timeout_s),
                   heartbeat_interval_s=sc.get("heartbeat_interval_s"), stall_timeout_s=None)
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
    for step in range(sc["steps"]):
        t = time.perf_counter()
        guard.step(inner, batch_for(step, ctx.rank, m))
        times.append(time.perf_counter() - t)
    guard.close()
    return {"step_s": times[3:], "error": None}  # the first steps include FSDP's lazy init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from accelpact.testing.session import load_average, run_session

    notices = notice_latency(args.trials)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_detection_"))
    runner = "benchmarks.bench_detection:run"
    scenarios: list[dict] = []
    for i in range(args.rounds):
        scenarios += [{"name": f"on{i}", "kind": "steps", "steps": args.steps, "heartbeat_interval_s": 0.5},
                      {"name": f"off{i}", "kind": "steps", "steps": args.steps, "heartbeat_interval_s": None}]
    s = run_session(out / "cost", runner, scenarios, control_deadline_s=60.0)
    on = [t for i in range(args.rounds) for r in (0, 1) for t in s.result(f"on{i}", r)["step_s"]]
    off = [t for i in range(args.rounds) for r in (0, 1) for t in s.result(f"off{i}", r)["step_s"]]
    hb_latency = []
    for i in range(args.rounds):
        d = run_session(out / f"die{i}", runner, [{"name": "die", "kind": "die", "heartbeat_interval_s": 0.5}],
                        control_deadline_s=60.0, allowed_to_fail=[1])
        died = json.loads((out / f"die{i}" / "die.died.json").read_text())["t"]
        res = d.result("die", 0)
        if res and res.get("t_raised"):
            hb_latency.append(res["t_raised"] - died)
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(f"load average: {load_average()}")
    print(f"dead-rank notice -> RankLostError  (n={len(notices)}): p50 {_pct(notices, .5) * 1e3:.0f} ms, "
          f"p99 {_pct(notices, .99) * 1e3:.0f} ms, max {max(notices) * 1e3:.0f} ms")
    if hb_latency:
        print(f"SIGKILL -> RankLostError, heartbeat rule, no launcher notice (n={len(hb_latency)}): "
              f"{', '.join(f'{x:.2f}' for x in hb_latency)} s")
    print(f"step time, heartbeat on  (n={len(on)}): median {med_on * 1e3:.1f} ms")
    print(f"step time, heartbeat off (n={len(off)}): median {med_off * 1e3:.1f} ms")
    print(f"heartbeat cost: {(med_on - med_off) / med_off * 100:+.2f} % of the median step")


if __name__ == "__main__":
    main()
