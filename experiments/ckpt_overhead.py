"""Checkpoint overhead (paper: 1.216B decoder, per-update async DCP: +656.7% step latency, 32.5 GiB
host memory, 3.39 TB/hour of storage traffic), measured side by side at this machine's scale.

    python -m experiments.ckpt_overhead            # full run (~6-8 min on 2 cores): mistral_tiny + mid
    python -m experiments.ckpt_overhead --quick    # ~1 min check: mistral_tiny only, into a temp dir

Configurations, interleaved in one run per size (experiments/ckpt_sweep.py): no checkpointing,
sync every update, per-update async DCP (fresh staging), per-update async with cached staging (the
tuned baseline on CPU; ``async_pinned`` joins on a CUDA machine), async every k updates.

The 1.216B decoder does not fit this host (the memory plan is printed and written), so the run
covers the largest sizes that fit the time budget and extrapolates to 1.216B, labelled as such:
bytes per checkpoint are 12 B/param (fp32 weights + two AdamW moments; measured, not assumed),
checkpoint host memory scales with bytes, and the latency overhead is checkpoint work (proportional
to bytes, i.e. to params) over step compute (proportional to params x tokens).

Writes results/<name>/: table.md, data.csv, extrapolation.csv, claims.csv, overhead_by_mode.png,
memory_by_mode.png, provenance.json (+ provenance.md).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from experiments import _driver, ckpt_sweep
from experiments.ckpt_analysis import GiB, data_rows
from experiments.ckpt_report import PAPER_MODEL, read_data, write_outputs
from experiments.ckpt_sweep import ModelSize
from experiments.provenance import load_provenance, write_provenance

NAME = "ckpt_overhead"
# A mid size between the shipped configs: same tokens per rank per step (512) as mistral_tiny and
# mistral_small, so the sizes differ in parameters only. mistral_small (142M) fits memory but takes
# ~22 s per step on the shared 2 cores: a 5-config, 2-round sweep of it is ~20 min, past the budget
# (run it with --sizes mistral_small).
MID = ModelSize(vocab=16384, hidden=512, intermediate=1536, layers=8, heads=8, kv_heads=4, seq=256, batch=2)
FULL_CONFIGS = ["none", "sync", "async", "async_cached", "async_pinned", "every_k_async"]


def sizes() -> dict[str, ModelSize]:
    from harness.app.config import load_group

    models = load_group("model")
    out = {name: ModelSize.from_model_config(models[name]) for name in ("mistral_tiny", "mistral_small", PAPER_MODEL)}
    out["mid"] = MID
    return out


def memory_plans() -> dict[str, Any]:
    """harness.parent.memory_plan for the paper's model and mistral_small, 2 CPU ranks, per-update async."""
    from harness.app.config import load_group
    from harness.machine import probe
    from harness.parent.memory_plan import plan
    from harness.schema import CheckpointConfig, CheckpointMode, ClusterConfig, RunConfig

    models, machine = load_group("model"), probe(with_gpus=False)
    out = {}
    for name in (PAPER_MODEL, "mistral_small"):
        run = RunConfig(
            model=models[name],
            cluster=ClusterConfig(world_size=ckpt_sweep.WORLD),
            checkpoint=CheckpointConfig(interval=1, mode=CheckpointMode("async")),
        )
        p = plan(run, machine)
        out[name] = {
            "fits": p.fits,
            "per_host_gib": p.per_host / GiB,
            "usable_gib": p.host_budget / GiB,
            "params": p.n_params,
            "table": p.table(),
        }
    return out


# ---- pure: rows, extrapolation, claims -----------------------------------------------------------


def measure(
    names: Sequence[str],
    cfg_names: Sequence[str],
    k: int,
    steps: int,
    rounds: int,
    warmup: int,
    all_sizes: dict[str, ModelSize],
) -> list[dict]:
    data: list[dict] = []
    for name in names:
        size = all_sizes[name]
        ok, why = ckpt_sweep.fits(size, list(cfg_names))
        if not ok:
            raise SystemExit(f"{name} does not fit here: {why}; drop it from --sizes")
        cfgs = ckpt_sweep.configs(k, list(cfg_names))
        print(
            f"{name}: {size.params() / 1e6:.1f}M params, {len(cfgs)} configs x {rounds} rounds x {steps} steps ...",
            flush=True,
        )
        t0 = time.time()
        root = tempfile.mkdtemp(prefix="ckpt_overhead_")
        res = ckpt_sweep.run(size, cfgs, root, warmup, steps, rounds)
        rows = ckpt_sweep.add_overheads([ckpt_sweep.summarize(c, res, steps) for c in cfgs])
        data += data_rows(name, size, rows)
        print(f"  done in {time.time() - t0:.0f}s", flush=True)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = _driver.parser(__doc__, NAME, "~1 min check on mistral_tiny, written to a temp dir")
    ap.add_argument(
        "--sizes",
        default=None,
        help="comma list from mistral_tiny, mid, mistral_small (default: mistral_tiny,mid; --quick: mistral_tiny)",
    )
    ap.add_argument("--steps", type=int, default=4, help="steps per block (every-k uses k = steps)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; --quick 1)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--rederive",
        action="store_true",
        help="rebuild table.md, CSVs and plots from OUT/data.csv without measuring (after a change to "
        "the analysis; provenance is kept, since the measurement is unchanged)",
    )
    args = ap.parse_args(argv)
    if args.rederive:
        # Re-derive tables, extrapolation and plots from the committed measurements (no training).
        out = _driver.output_dir(args, NAME, rederive=True)
        prov = load_provenance(out)
        write_outputs(
            out,
            read_data(out / "data.csv"),
            memory_plans(),
            prov.extra.get("tuned_baseline", "async_cached"),
            sizes(),
            float(prov.extra.get("runtime_s", float("nan"))),
        )
        return 0

    import torch

    all_sizes = sizes()
    names = (args.sizes or ("mistral_tiny" if args.quick else "mistral_tiny,mid")).split(",")
    unknown = [n for n in names if n not in all_sizes or n == PAPER_MODEL]
    if unknown:
        print(f"unknown or unrunnable size(s) {unknown}: choose from mistral_tiny, mid, mistral_small", file=sys.stderr)
        return 2
    rounds = args.rounds or (1 if args.quick else 2)
    out = _driver.output_dir(args, NAME)
    cfg_names = [c for c in FULL_CONFIGS if c != "async_pinned" or torch.cuda.is_available()]
    tuned = "async_pinned" if "async_pinned" in cfg_names else "async_cached"

    plans = memory_plans()
    print(plans[PAPER_MODEL]["table"])
    print(f"-> {PAPER_MODEL} {'fits' if plans[PAPER_MODEL]['fits'] else 'does NOT fit'} here; measuring {names}")
    timing = _driver.Timing()
    # Provenance first: its load average is the one at the start of the measurement.
    write_provenance(
        out,
        _driver.command(argv, NAME),
        {
            "sizes": ",".join(names),
            "configs": ",".join(cfg_names),
            "steps_per_block": args.steps,
            "rounds": rounds,
            "k": args.steps,
            "tuned_baseline": tuned,
            "paper_model_fits": plans[PAPER_MODEL]["fits"],
        },
    )
    data = measure(names, cfg_names, args.steps, args.steps, rounds, args.warmup, all_sizes)
    runtime = timing.elapsed_s
    _driver.record_runtime(out, runtime)
    write_outputs(out, data, plans, tuned, all_sizes, runtime)
    print(f"wrote {out}/ in {runtime / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
