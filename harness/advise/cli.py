"""``python -m harness.advise`` (console script ``accelpact-advise``): which strategy, with which settings, for
your cluster.

With no arguments: 16,384 GPUs, 8 per host, Llama 3's fault mix, the simulator's example job (5 s steps,
4 GB of state per GPU) on the ``gpu_node`` cost model. For each strategy the simulator
(``harness.scale.project``) picks the best disk-checkpoint interval; for AccelPact's heal the cadence
(``snapshot.every``, ``push_every``, ``confirm_push``) comes first from the cost model and the mix
(``harness.advise.cadence``), and its per-step tax is charged in the simulation. Printed: each strategy's
settings and ETTR with its 95% interval, then the winner and why. A bad input is refused in one line
naming the fix, exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NoReturn

from harness.advise.advice import advise, default_strategies
from harness.advise.cadence import Choice
from harness.advise.cost import PLATFORMS, Platform
from harness.fleet.config import CLASSES, Cluster, FailureClass, ScaleConfigError
from harness.fleet.mixes import MIXES, mix_from_rates, mttf_h
from harness.scale.outcomes import outcome_table
from harness.strategies import simulated

EXIT_BAD_INPUT = 2
# The heal keeps 2 own slots and 2 buddy replicas of each GPU's state in host memory (docs/snapshots.md).
SNAPSHOT_COPIES = 4


_CLUSTER_FLAGS = {
    "cluster.gpus_per_host": "--gpus-per-host",
    "cluster.gpus": "--gpus",
    "cluster.step_s": "--step-s",
    "cluster.write_gbps": "--write-gbps",
    "cluster.read_gbps": "--read-gbps",
    "cluster.days": "--days",
}


class BadInput(ValueError):
    """One line naming what to change."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise BadInput(f"{message} (see --help)")


def parser() -> argparse.ArgumentParser:
    d = Cluster()
    ap = _Parser(
        prog="python -m harness.advise", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpus", type=int, default=d.gpus)
    ap.add_argument("--gpus-per-host", type=int, default=d.gpus_per_host)
    ap.add_argument("--step-s", type=float, default=d.step_s, help="one training step, protection off (s)")
    ap.add_argument(
        "--state-gb",
        type=float,
        default=d.checkpoint_gb_per_gpu,
        help="training state per GPU: parameters + optimizer shard (GB); also the checkpoint's size",
    )
    ap.add_argument("--host-memory-gb", type=float, default=2048.0, help="host memory per host (GB)")
    ap.add_argument(
        "--platform",
        choices=sorted(PLATFORMS),
        default="gpu_node",
        help="the cost model's node: gpu_node (assumptions, docs/advisor.md) or cpu_here (measured here)",
    )
    ap.add_argument("--mem-gbps", type=float, help="bandwidth of the snapshot copy per GPU (GB/s)")
    ap.add_argument("--net-gbps", type=float, help="network bandwidth for the buddy push per GPU (GB/s)")
    ap.add_argument("--checksum-gbps", type=float, help="checksum throughput per GPU (GB/s)")
    ap.add_argument("--push-overlap", type=float, help="fraction of a push hidden under compute (0-1)")
    ap.add_argument("--write-gbps", type=float, default=d.write_gbps, help="aggregate storage write (GB/s)")
    ap.add_argument("--read-gbps", type=float, default=d.read_gbps, help="aggregate storage read (GB/s)")
    ap.add_argument("--mix", default="llama3", help=f"a published mix: {', '.join(MIXES)}, or none (only --rate)")
    ap.add_argument(
        "--rate",
        action="append",
        default=[],
        metavar="CLASS=PER_GPU_HOUR",
        help=f"replace one class's rate (classes: {', '.join(CLASSES)}; planned_maintenance per job-hour)",
    )
    ap.add_argument("--rate-scale", type=float, default=1.0, help="multiply every rate")
    ap.add_argument("--days", type=float, default=d.days, help="simulated wall time")
    ap.add_argument("--trials", type=int, default=16, help="Monte Carlo trials per checkpoint interval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategies", help="comma-separated (default: every built strategy the simulator models)")
    return ap


def _mix(args: argparse.Namespace) -> dict[str, FailureClass]:
    rates: dict[str, float] = {}
    for item in args.rate:
        cls, sep, raw = item.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not sep or not math.isfinite(value):
            raise BadInput(f"--rate {item!r}: give CLASS=NUMBER, e.g. --rate gpu_host_loss=1.5e-5 (per GPU-hour)")
        if value < 0:
            raise BadInput(f"--rate {item}: a rate cannot be negative; give failures per GPU-hour >= 0")
        rates[cls] = value
    if args.rate_scale < 0 or not math.isfinite(args.rate_scale):
        raise BadInput(f"--rate-scale {args.rate_scale}: give a finite factor >= 0")
    mix = mix_from_rates(rates, None if args.mix == "none" else args.mix)
    return {c: replace(f, rate_per_hour=f.rate_per_hour * args.rate_scale) for c, f in mix.items()}


def _platform(args: argparse.Namespace) -> Platform:
    p = PLATFORMS[args.platform]
    if p.name == "cpu_here":
        from harness.advise.calibration import load, platform_from

        try:
            p = platform_from(load())
        except FileNotFoundError:
            pass  # the docs' single measurements
    over = {
        "copy_gbps": args.mem_gbps,
        "push_gbps": args.net_gbps,
        "checksum_gbps": args.checksum_gbps,
        "push_overlap": args.push_overlap,
    }
    flag = {
        "copy_gbps": "--mem-gbps",
        "push_gbps": "--net-gbps",
        "checksum_gbps": "--checksum-gbps",
        "push_overlap": "--push-overlap",
    }
    for key, v in over.items():
        if v is None:
            continue
        if key == "push_overlap" and not 0 <= v <= 1:
            raise BadInput(f"{flag[key]} {v}: a fraction between 0 and 1")
        if key != "push_overlap" and not (math.isfinite(v) and v > 0):
            raise BadInput(f"{flag[key]} {v}: a bandwidth in GB/s above 0")
    return p.with_(**{k: v for k, v in over.items() if v is not None})


def _check_memory(args: argparse.Namespace) -> None:
    if args.state_gb <= 0 or not math.isfinite(args.state_gb):
        raise BadInput(f"--state-gb {args.state_gb}: give the training state per GPU in GB, above 0")
    if args.host_memory_gb <= 0:
        raise BadInput(f"--host-memory-gb {args.host_memory_gb}: give the host's memory in GB, above 0")
    need = SNAPSHOT_COPIES * args.state_gb * args.gpus_per_host
    if need > args.host_memory_gb:
        raise BadInput(
            f"--state-gb {args.state_gb:g} x {args.gpus_per_host} GPUs per host x {SNAPSHOT_COPIES} copies "
            f"(2 own snapshot slots + 2 buddy replicas) = {need:g} GB is more than --host-memory-gb "
            f"{args.host_memory_gb:g}: lower --state-gb (shard over more GPUs) or raise --host-memory-gb"
        )


def _strategies(args: argparse.Namespace) -> tuple[str, ...]:
    sims = simulated()
    built = default_strategies()
    if not args.strategies:
        return built
    names = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    bad = [n for n in names if n not in sims]
    if bad:
        raise BadInput(f"--strategies: {bad[0]!r} is unknown; use some of {','.join(built)}")
    return names


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render(
    cluster: Cluster,
    mix: Mapping[str, FailureClass],
    mix_name: str,
    platform: Platform,
    projections: list,
    choices: Mapping[str, Choice],
    taxes: Mapping[str, float],
    trials: int,
    seed: int,
    elapsed: float,
) -> str:
    lines = [
        f"{cluster.gpus:,} GPUs ({cluster.hosts:,} hosts of {cluster.gpus_per_host}), step {cluster.step_s:g} s, "
        f"state {cluster.checkpoint_gb_per_gpu:g} GB per GPU, checkpoint write {cluster.checkpoint_write_s:.1f} s; "
        f"mix {mix_name}: MTTF {mttf_h(mix, cluster.gpus):.2f} h; {cluster.days:g} days x {trials} trials per "
        f"interval, seed {seed}",
        f"cost model {platform.name}: copy {platform.copy_gbps:g} GB/s (overlap {platform.copy_overlap:g}), "
        f"checksum {platform.checksum_gbps:g} GB/s (overlap {platform.checksum_overlap:g}), push "
        f"{platform.push_gbps:g} GB/s x {platform.push_sides} side(s) (overlap {platform.push_overlap:g}), "
        f"blocking {platform.block_s_per_gb * 1e3:.2f} ms/GB; {platform.source}",
        "",
    ]
    table = outcome_table(cluster, tuple(p.strategy for p in projections))
    head = ("strategy", "settings", "per-step tax", "ETTR (95% CI)", "a lost host replays", "what costs most")
    body = []
    for p in projections:
        if not p.feasible:
            body.append((p.strategy, "-", "-", "never finishes", "-", p.reason))
            continue
        ckpt = "never" if math.isinf(p.best_interval_s) else f"{p.best_interval_s / 60:.0f} min"
        settings = f"checkpoint every {ckpt}"
        bound = {"checkpoint": "to the checkpoint", "step": "the step in flight", "none": "nothing"}[
            table[p.strategy]["gpu_host_loss"].rollback
        ]
        if p.strategy in choices:
            c = choices[p.strategy]
            settings += f"; snapshot.{c.cadence.text().replace(' ', ', snapshot.')}"
            bound = f"at most {c.replay_bound} steps"
        body.append(
            (
                p.strategy,
                settings,
                _pct(taxes.get(p.strategy, 0.0)),
                f"{_pct(p.best_ettr)} ± {100 * p.best_ci:.2f}",
                bound,
                p.driver,
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    lines += ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body]
    lines += ["", winner_text(projections, choices), f"simulated in {elapsed:.1f} s"]
    return "\n".join(lines)


def winner_text(projections: list, choices: Mapping[str, Choice]) -> str:
    """The strategy with the highest mean ETTR, the runner-up, whether their intervals separate, and the badput
    part that makes the difference."""
    ok = sorted((p for p in projections if p.feasible), key=lambda p: -p.best_ettr)
    if not ok:
        return "winner: none; no strategy finishes at this fault rate"
    w = ok[0]
    if len(ok) == 1:
        return f"winner: {w.strategy} (the only strategy that finishes)"
    r = ok[1]
    gap = w.best_ettr - r.best_ettr
    separate = gap > w.best_ci + r.best_ci
    keys = set(w.badput) | set(r.badput)
    diff = max(keys, key=lambda k: r.badput.get(k, 0.0) - w.badput.get(k, 0.0))
    why = (
        f"{r.strategy} loses {_pct(r.badput.get(diff, 0.0))} of the wall to {diff} against "
        f"{_pct(w.badput.get(diff, 0.0))}"
    )
    settings = f" at {choices[w.strategy].cadence.text()}" if w.strategy in choices else ""
    if not separate:
        return (
            f"no clear winner: {w.strategy}{settings} ({_pct(w.best_ettr)} ± {100 * w.best_ci:.2f}) and "
            f"{r.strategy} ({_pct(r.best_ettr)} ± {100 * r.best_ci:.2f}) overlap; by the mean {w.strategy}, as "
            f"{why}"
        )
    return (
        f"winner: {w.strategy}{settings}, ETTR {_pct(w.best_ettr)} against {r.strategy}'s {_pct(r.best_ettr)} "
        f"(+{100 * gap:.2f} points, the intervals apart); why: {why}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
        _check_memory(args)
        mix = _mix(args)
        platform = _platform(args)
        strategies = _strategies(args)
        if args.trials < 2:
            raise BadInput(f"--trials {args.trials}: at least 2, for an interval")
        cluster = Cluster(
            gpus=args.gpus,
            gpus_per_host=args.gpus_per_host,
            step_s=args.step_s,
            checkpoint_gb_per_gpu=args.state_gb,
            write_gbps=args.write_gbps,
            read_gbps=args.read_gbps,
            days=args.days,
        )
    except (BadInput, ScaleConfigError, ValueError) as err:
        text = str(err)
        for key, flag in _CLUSTER_FLAGS.items():  # the cluster's own checks name its fields: name the flags
            text = text.replace(key, flag)
        print(f"error: {text}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    t0 = time.perf_counter()
    advice = advise(cluster, mix, platform, strategies, trials=args.trials, seed=args.seed)
    print(
        render(
            cluster,
            mix,
            args.mix,
            platform,
            advice.projections,
            advice.choices,
            advice.taxes,
            args.trials,
            args.seed,
            time.perf_counter() - t0,
        )
    )
    return 0
