"""Per-run plot: loss and throughput per step (PNG, matplotlib Agg) into the run directory."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import events as ev

PLOT_FILE = "loss_throughput.png"


def per_step_series(events: Sequence[Mapping[str, Any] | ev.Event]) -> dict[str, list[float]]:
    """Step index, rank-0 loss and global tokens/s per step (pure; last incarnation of a step wins)."""
    by_step: dict[int, dict[int, ev.Step]] = defaultdict(dict)
    for e in ev.of_type(ev.typed(events), ev.Step):
        by_step[e.step][e.rank] = e
    steps, loss, tps = [], [], []
    for step in sorted(by_step):
        ranks = by_step[step]
        if 0 not in ranks:
            continue
        t0 = min(e.t_start for e in ranks.values())
        t1 = max(e.t_end for e in ranks.values())
        steps.append(float(step))
        loss.append(float("nan") if ranks[0].loss is None else ranks[0].loss)
        tps.append(sum(e.tokens for e in ranks.values()) / max(t1 - t0, 1e-9))
    return {"step": steps, "loss": loss, "tokens_per_s": tps}


def plot_run(
    run_dir: Path, title: str = "", events: Sequence[Mapping[str, Any] | ev.Event] | None = None
) -> Path | None:
    """Write ``loss_throughput.png`` (from ``events``, read here if not given); None when no steps."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    series = per_step_series(ev.load_events(run_dir) if events is None else events)
    if not series["step"]:
        return None
    fig, (ax_loss, ax_tps) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    ax_loss.plot(series["step"], series["loss"], marker=".", lw=1)
    ax_loss.set_ylabel("loss (rank 0)")
    ax_tps.plot(series["step"], series["tokens_per_s"], marker=".", lw=1, color="tab:green")
    ax_tps.set_ylabel("tokens/s (all ranks)")
    ax_tps.set_xlabel("step")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(run_dir) / PLOT_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
