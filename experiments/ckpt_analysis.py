"""The checkpoint-overhead analysis, pure: data rows, the extrapolation to the paper's size, claims.

experiments.ckpt_overhead measures (through experiments.ckpt_sweep); experiments.ckpt_report writes
the tables and plots; the tests check this module on hand-made rows. Extrapolation rules: bytes per
checkpoint are 12 B/param, checkpoint host memory scales with bytes, and the latency overhead is
checkpoint work (proportional to params) over step compute (proportional to params x tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from experiments.ckpt_sweep import CKPT_BYTES_PER_PARAM, TRAIN_STATE_BYTES_PER_PARAM, ModelSize
from experiments.provenance import ClaimRow
from harness.report.paper import PAPER_CKPT as PAPER

GiB = 2**30


def data_rows(model: str, size: ModelSize, rows: Sequence[dict]) -> list[dict]:
    """Flat CSV rows of one size's summarized configs (bytes in GiB/TB where a reader wants them)."""
    out = []
    for r in rows:
        out.append(
            {
                "model": model,
                "params": size.params(),
                "tokens_per_step": size.tokens_per_step(),
                "config": r["config"],
                "mode": r["mode"],
                "interval": r["interval"],
                "step_mean_s": r["step_mean_s"],
                "step_median_s": r["step_median_s"],
                "overhead_pct": r["overhead_pct"],
                "overhead_median_pct": r["overhead_median_pct"],
                "cpu_per_step_s": r["cpu_per_step_s"],
                "cpu_overhead_pct": r["cpu_overhead_pct"],
                "stall_mean_s": r["stall_mean_s"],
                "stage_mean_s": r["stage_mean_s"],
                "write_mean_s": r["write_mean_s"],
                "drain_mean_s": r["drain_mean_s"],
                "saves": r["saves"],
                "bytes_per_ckpt": r["bytes_per_ckpt"],
                "bytes_per_param": r["bytes_per_ckpt"] / size.params(),
                "tb_per_hour": r["bytes_per_hour"] / 1e12,
                "host_peak_gib": r["host_peak_bytes"] / GiB,
                "host_peak_max_gib": r["host_peak_max_bytes"] / GiB,
                "ckpt_extra_host_gib": float("nan"),
                "save_rss_rise_gib": r["save_rss_peak_delta_sum"] / GiB,
                "train_rss_gib": r["train_rss_sum"] / GiB,
                "step_blocks_s": ";".join(f"{x:.3f}" for x in r["step_blocks_s"]),
            }
        )
    base = next((x for x in out if x["config"] == "none"), None)
    for x in out:
        if base is not None and base["host_peak_gib"] > 0 and x["host_peak_gib"] > 0:
            x["ckpt_extra_host_gib"] = max(0.0, x["host_peak_gib"] - base["host_peak_gib"])
    return out


def extrapolate(rows: Sequence[dict], target: ModelSize) -> list[dict]:
    """First-order extrapolation of one measured size's rows to ``target`` on THIS machine.

    Checkpoint bytes, checkpoint host memory and the time a save adds to a step scale with params
    (they move every byte of the state); step compute scales with params x tokens (6PT flops). So:
    step_none' = step_none * (P' T') / (P T); added' = (step_cfg - step_none) * P' / P;
    overhead' = added' / step_none'; TB/hour' = bytes' * saves/step / step_cfg' * 3600."""
    base = next(r for r in rows if r["config"] == "none")
    p, t = base["params"], base["tokens_per_step"]
    p2, t2 = target.params(), target.tokens_per_step()
    by_param, by_work = p2 / p, (p2 * t2) / (p * t)
    step_none2 = base["step_mean_s"] * by_work
    train_gib = TRAIN_STATE_BYTES_PER_PARAM * p2 / GiB
    out = []
    for r in rows:
        added2 = (r["step_mean_s"] - base["step_mean_s"]) * by_param
        step2 = step_none2 + added2
        saves_per_step = (1 / r["interval"]) if r["interval"] else 0.0
        bytes2 = r["bytes_per_param"] * p2 if r["bytes_per_ckpt"] else 0.0
        extra = r["ckpt_extra_host_gib"]
        out.append(
            {
                "config": r["config"],
                "from_model": r["model"],
                "from_params": p,
                "params": p2,
                "tokens_per_step": t2,
                "step_s": step2,
                "overhead_pct": added2 / step_none2 * 100,
                "bytes_per_ckpt": bytes2,
                "tb_per_hour": bytes2 * saves_per_step / step2 * 3600 / 1e12 if step2 else 0.0,
                "train_state_gib": train_gib,
                # One staged copy of the checkpoint: what async staging holds on the host (upper bound of
                # its memory; on CPU it partly reuses memory freed by activations, see ckpt_extra).
                "staging_gib": bytes2 / GiB if r["mode"] not in ("none", "sync") else 0.0,
                "ckpt_extra_host_gib": extra * by_param if not math.isnan(extra) else float("nan"),
            }
        )
    return out


def paper_implied() -> dict[str, float]:
    """What the paper's own figures imply, if each per-update checkpoint is 12 B/param: the step time
    with checkpointing (bytes per checkpoint / traffic) and without (that / (1 + overhead))."""
    bytes_ckpt = CKPT_BYTES_PER_PARAM * PAPER["params"]
    step_with = bytes_ckpt / (PAPER["tb_per_hour"] * 1e12 / 3600)
    return {
        "bytes_per_ckpt": bytes_ckpt,
        "step_with_s": step_with,
        "step_without_s": step_with / (1 + PAPER["overhead_pct"] / 100),
    }


def _row(rows: Sequence[dict], config: str) -> dict | None:
    return next((r for r in rows if r["config"] == config), None)


def claims(main: Sequence[dict], extra: Sequence[dict], main_label: str, tuned: str) -> list[ClaimRow]:
    """The headline rows: per-update async DCP (measured and extrapolated) and the tuned baseline."""
    a, ax, none = _row(main, "async"), _row(extra, "async"), _row(main, "none")
    tb, tbx = _row(main, tuned), _row(extra, tuned)
    imp = paper_implied()
    assert a and ax and none and tb and tbx, "the sweep must include none, async and the tuned baseline"
    cpu_why = (
        f"this is 2 shared CPU cores: a step of {main_label} computes for {none['step_mean_s']:.2f} s "
        f"while a save moves {a['bytes_per_ckpt'] / 1e9:.2f} GB; the paper's GPU step (implied by its own "
        f"figures: {imp['step_without_s']:.1f} s for 1.216B) is orders of magnitude faster per byte "
        "checkpointed, and the latency overhead is checkpoint time over compute time"
    )
    rows = [
        ClaimRow(
            "per-update async DCP: step latency overhead, measured (higher = stronger case for AccelPact)",
            f"+{PAPER['overhead_pct']}% (1.216B, GPU)",
            f"+{a['overhead_pct']:.1f}% wall, +{a['cpu_overhead_pct']:.1f}% CPU ({main_label}, CPU)",
            PAPER["overhead_pct"],
            a["overhead_pct"],
            "higher",
            cpu_why,
        ),
        ClaimRow(
            "... extrapolated to 1.216B on this machine (EXTRAPOLATION)",
            f"+{PAPER['overhead_pct']}%",
            f"+{ax['overhead_pct']:.1f}% (step {ax['step_s']:.0f} s)",
            PAPER["overhead_pct"],
            ax["overhead_pct"],
            "higher",
            "on a CPU the step's compute grows with params x tokens as fast as the save grows with params "
            f"x 12 B, so the overhead stays small; it is the GPU's fast compute that makes the paper's +{PAPER['overhead_pct']}%",
        ),
        ClaimRow(
            "per-update async DCP: host memory, measured (peak RSS of both ranks)",
            f"{PAPER['host_mem_gib']} GiB (1.216B)",
            f"{a['host_peak_gib']:.2f} GiB, of which checkpointing {a['ckpt_extra_host_gib']:.2f} GiB ({main_label})",
            PAPER["host_mem_gib"],
            a["host_peak_gib"],
            None,
            f"{main_label} has {PAPER['params'] / a['params']:.0f}x fewer parameters; memory scales with params "
            "(next row)",
        ),
        ClaimRow(
            "... extrapolated to 1.216B (EXTRAPOLATION: 12 B/param staged copy + 16 B/param training state)",
            f"{PAPER['host_mem_gib']} GiB",
            f"{ax['staging_gib']:.1f} GiB staging (one copy) + {ax['train_state_gib']:.1f} GiB training state "
            f"= {ax['staging_gib'] + ax['train_state_gib']:.1f} GiB; peak rise measured: "
            f"{ax['ckpt_extra_host_gib']:.1f} GiB",
            PAPER["host_mem_gib"],
            ax["staging_gib"] + ax["train_state_gib"],
            "higher",
            "on a GPU the training state lives in GPU memory, so the paper's host figure is staging, "
            "buffers and runtime; here the host holds the state too. Measured on CPU, fresh staging raised "
            f"the host PEAK by only {a['ckpt_extra_host_gib']:.2f} GiB at {main_label} (it is allocated after "
            "backward, in memory the activations freed), cached staging by "
            f"{tb['ckpt_extra_host_gib']:.2f} GiB (held for the whole run)",
            comparable=False,
        ),
        ClaimRow(
            "per-update async DCP: storage traffic, measured",
            f"{PAPER['tb_per_hour']} TB/hour (1.216B)",
            f"{a['tb_per_hour']:.3f} TB/hour ({a['bytes_per_param']:.2f} B/param per checkpoint, {main_label})",
            PAPER["tb_per_hour"],
            a["tb_per_hour"],
            "higher",
            f"traffic = bytes per checkpoint x checkpoints per hour; ours are {a['bytes_per_ckpt'] / 1e9:.2f} GB "
            f"every {a['step_mean_s']:.1f} s, the paper's {imp['bytes_per_ckpt'] / 1e9:.1f} GB every "
            f"{imp['step_with_s']:.1f} s",
        ),
        ClaimRow(
            "... extrapolated to 1.216B on this machine (EXTRAPOLATION)",
            f"{PAPER['tb_per_hour']} TB/hour",
            f"{ax['tb_per_hour']:.3f} TB/hour ({ax['bytes_per_ckpt'] / 1e9:.1f} GB every {ax['step_s']:.0f} s)",
            PAPER["tb_per_hour"],
            ax["tb_per_hour"],
            "higher",
            "the same 14.6 GB per checkpoint, but a CPU step is far longer than a GPU step, so fewer "
            "checkpoints per hour",
        ),
        ClaimRow(
            f"tuned async baseline ({tuned}): step latency overhead (paper reports none)",
            "",
            f"+{tb['overhead_pct']:.1f}% wall, +{tb['cpu_overhead_pct']:.1f}% CPU; "
            f"extrapolated to 1.216B +{tbx['overhead_pct']:.1f}%",
            None,
            tb["overhead_pct"],
            "higher",
            f"per-update async with fresh buffers: +{a['overhead_pct']:.1f}%; the paper's +{PAPER['overhead_pct']}% is "
            "against the untuned one",
        ),
    ]
    return rows


# ---- outputs -------------------------------------------------------------------------------------
