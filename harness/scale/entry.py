"""``python -m harness experiment=project_scale cluster_gpus=16384 [key=value ...]``: the table for your job.

Keys (defaults in ``harness.fleet.config.Cluster``; see conf/experiment/project_scale.yaml):
  cluster_gpus, gpus_per_host, step_s, checkpoint_gb_per_gpu, write_gbps, read_gbps, hang_timeout_s,
  spare_available, spare_swap_s, host_repair_s, bug_fix_s, replica_gpus, days   (the cluster)
  trials (Monte Carlo trials per interval, default 16), seed (default 0),
  strategies (comma-separated; default all), rate_scale (multiplies every failure rate, default 1),
  rate.<class> (per GPU-hour; planned_maintenance per job-hour) to replace one class's rate.
No ranks are launched and no run directory is made. Exit status 2 on a bad key or value.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import fields, replace

import yaml

from harness.fleet.config import CLASSES, Cluster, ScaleConfigError, check_number
from harness.fleet.sources import llama3_mix
from harness.scale.project import mttf_h, project
from harness.scale.render import anchors_for, text_table

EXIT_BAD_CONFIG = 2


def strategy_names() -> tuple[str, ...]:
    """Every strategy the simulator models: the strategy registry's simulations (harness.strategies). Here,
    not in harness.fleet.config, which the fault trace (harness.fleet.trace) imports: the strategies' own
    checks ask the trace's kinds, and config importing the strategies back would close a cycle."""
    from harness.strategies import simulated

    return tuple(simulated())


_CLUSTER_KEYS = {f.name for f in fields(Cluster)}
_IGNORED = {"experiment"}


def parse(argv: Sequence[str]) -> tuple[Cluster, dict, tuple[str, ...], int, int]:
    """(cluster, failure mix, strategies, trials, seed) from ``key=value`` arguments."""
    cluster_kw: dict = {}
    mix = llama3_mix()
    strategies: tuple[str, ...] = strategy_names()
    trials, seed, scale = 16, 0, 1.0
    for arg in argv:
        if "=" not in arg:
            raise ScaleConfigError(f"{arg!r}: give key=value (e.g. cluster_gpus=16384)")
        key, raw = arg.split("=", 1)
        key = key.lstrip("+")
        if key in _IGNORED:
            continue
        value = yaml.safe_load(raw) if raw else None
        if key == "cluster_gpus":
            cluster_kw["gpus"] = value
        elif key in _CLUSTER_KEYS and key != "gpus":
            cluster_kw[key] = value
        elif key == "trials":
            trials = int(check_number("trials", value, positive=True))
        elif key == "seed":
            seed = int(check_number("seed", value))
        elif key == "rate_scale":
            scale = check_number("rate_scale", value)
        elif key == "strategies":
            strategies = tuple(s.strip() for s in str(value).split(",") if s.strip())
            known = strategy_names()
            bad = [s for s in strategies if s not in known]
            if bad:
                raise ScaleConfigError(f"strategies: {bad[0]!r} is unknown: use some of {','.join(known)}")
        elif key.startswith("rate.") and key[5:] in CLASSES:
            cls = key[5:]
            mix[cls] = replace(mix[cls], rate_per_hour=check_number(key, value), source="given on the command line")
        else:
            raise ScaleConfigError(
                f"{key!r} is not a project_scale key: use cluster_gpus, "
                f"{', '.join(sorted(_CLUSTER_KEYS - {'gpus'}))}, trials, seed, strategies, "
                f"rate_scale or rate.<class> ({', '.join(CLASSES)})"
            )
    if scale != 1.0:
        mix = {c: replace(f, rate_per_hour=f.rate_per_hour * scale) for c, f in mix.items()}
    try:
        cluster = Cluster(**cluster_kw)
    except TypeError as err:  # a value of the wrong type inside the dataclass's own arithmetic
        raise ScaleConfigError(f"cluster: {err}") from None
    return cluster, mix, strategies, trials, seed


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cluster, mix, strategies, trials, seed = parse(argv)
    except ScaleConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    t0 = time.perf_counter()
    projections = project(cluster, mix, strategies, trials=trials, seed=seed)
    elapsed = time.perf_counter() - t0
    print(
        f"{cluster.gpus:,} GPUs ({cluster.hosts:,} hosts), {cluster.days:g} days, step {cluster.step_s:g} s, "
        f"checkpoint write {cluster.checkpoint_write_s:.1f} s, MTTF {mttf_h(mix, cluster.gpus):.2f} h "
        f"(Llama 3 mix), {trials} trials per interval, seed {seed}"
    )
    print(text_table(projections))
    print(f"published anchors near this size: {anchors_for(cluster.gpus)}")
    print(f"simulated in {elapsed:.1f} s")
    return 0
