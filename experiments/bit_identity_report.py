"""The bit-identity experiment's outputs: the claims, table.md and the leak plots.

Built from what ``experiments.bit_identity.run_flavour`` returns per run (and the soak's dict, whose
section ``experiments.bit_identity_soak.soak_lines`` writes).
"""

from __future__ import annotations

from pathlib import Path

from experiments import _driver
from experiments.bit_identity_fds import constant_after_first_recovery, fd_kind_lines
from experiments.bit_identity_soak import soak_lines
from experiments.bit_identity_soak_run import SETTLE_S
from experiments.provenance import ClaimRow, paper_vs_ours_table, stamp_figure
from experiments.workloads.fault_schedules import PG_TIMEOUT_S, RESOURCES
from harness.report.paper import PAPER_BIT_IDENTITY_RANKS, PAPER_RANKS


def leak_plot(path: Path, results: list[dict], prov, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # x-labels on the bottom row only, and room between the rows: with sharex the top row's labels
    # sat on the bottom row's titles.
    fig, axes = plt.subplots(2, 2, figsize=(8.5, 5.8), sharex=True)
    for ax, key in zip(axes.flat, RESOURCES):
        for res in results:
            for rank, series in enumerate(res["resources"]):
                xs = [x["recoveries"] for x in series]
                base = series[0][key]
                ax.plot(
                    xs,
                    [x[key] - base for x in series],
                    linewidth=1,
                    alpha=0.8,
                    label=f"{res['flavour']} rank {rank}" if key == "threads" else None,
                )
        if key != "rss_mib":
            ax.axhline(2, color="tab:red", linestyle="--", linewidth=1)
        ax.set_title(
            f"{key}: change from before the first fault" + (" (limit +2)" if key != "rss_mib" else " (MiB)"), fontsize=9
        )
    for ax in axes[-1]:
        ax.set_xlabel("recoveries so far")
    axes.flat[0].legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    stamp_figure(fig, prov)
    fig.subplots_adjust(hspace=0.3, bottom=0.16, top=0.9)  # room for the bottom row's titles and the footer
    fig.savefig(path, dpi=120)
    plt.close(fig)


def per_step_resources(results: list[dict]) -> list[dict]:
    return [
        {"flavour": res["flavour"], "world": res["world"], "rank": rank, **x}
        for res in results
        for rank, series in enumerate(res["resources"])
        for x in series
    ]


def claims(results: list[dict]) -> list[ClaimRow]:
    rows = []
    for res in results:
        n = len(res["rows"])
        ok = not res["diffs"]
        rows.append(
            ClaimRow(
                claim=f"state after {n} successive faults, {res['flavour']}, {res['world']} ranks",
                paper=f"bit-identical across {PAPER_BIT_IDENTITY_RANKS} ranks",
                comparable=False,
                ours=(
                    f"bit-identical to the fault-free run on every rank: {res['counts']['tensors']} tensors "
                    f"({res['counts']['bytes'] / 2**20:.1f} MiB) by torch.equal + sha256, {res['counts']['losses']} losses"
                    if ok
                    else f"{len(res['diffs'])} MISMATCHES: {res['diffs'][:3]}"
                ),
                reason=(
                    "ours compares with a run that never failed (stronger than ranks agreeing with each other); "
                    f"{res['world']} ranks on 2 CPU cores vs the paper's {PAPER_RANKS} GPUs"
                ),
            )
        )
        after = _leak_text(res["leak"])
        settled = res.get("leak_settled")
        rows.append(
            ClaimRow(
                claim=f"leak over {n} faults, {res['flavour']} (threads / fds / TCP sockets / RSS MiB, worst rank)",
                paper="",
                ours=(
                    f"{_leak_text(settled)} settled ({SETTLE_S:.0f} s after the last step); "
                    f"{after} right after the last fault"
                    if settled
                    else after
                ),
                reason=(
                    "target: threads, fds, sockets within +2 of the pre-fault baseline once settled (abandoned "
                    f"generations' collectives time out after {PG_TIMEOUT_S:.0f} s)"
                    + (
                        "; on every rank the settled fds are, kind by kind, those after the first recovery: a "
                        "constant, not growth (fds by kind below the run's table)"
                        if constant_after_first_recovery(res)
                        else ""
                    )
                ),
            )
        )
    return rows


def _leak_text(leak: dict) -> str:
    return " / ".join(f"{leak[k]:+.0f}" if k != "rss_mib" else f"{leak[k]:+.1f}" for k in RESOURCES)


def table_md(results: list[dict], prov, runtime: float, soak: dict | None) -> str:
    lines = ["# Bit-identity after successive faults", "", paper_vs_ours_table(claims(results)), ""]
    for res in results:
        lines += [
            f"## {res['flavour']}, {res['world']} ranks, {res['steps']} steps, "
            f"{len(res['rows'])} faults ({res['wall_s']:.0f} s)",
            "",
            "| # | step | kind | phase | ranks | decision | rounds | total ms | threads | fds | tcp | RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in res["rows"]:
            lines.append(
                f"| {r['fault']} | {r['step']} | {r['kind']} | {r['phase']} | {r['ranks']} | {r['decision']}"
                f"{' on ' + r['apply_on'] if r['apply_on'] else ''} | {r['rounds']} | {r['total_ms_max']:.0f} | "
                f"{r['threads_max']:.0f} | {r['fds_max']:.0f} | {r['tcp_max']:.0f} | {r['rss_mib_max']:.0f} |"
            )
        base = res["baseline"][0]
        lines += [
            "",
            f"Baseline before the first fault (rank 0): threads {base['threads']}, fds {base['fds']}, "
            f"tcp {base['tcp']}, RSS {base['rss_mib']:.0f} MiB. Worst-rank change after the last fault: "
            + ", ".join(f"{k} {res['leak'][k]:+.1f}" for k in RESOURCES)
            + "."
            + (
                f" Settled, {SETTLE_S:.0f} s after the last step: "
                + ", ".join(f"{k} {res['leak_settled'][k]:+.1f}" for k in RESOURCES)
                + "."
                if res.get("leak_settled")
                else ""
            ),
            *fd_kind_lines(res),
            "",
            "Mismatches against the reference: " + ("none." if not res["diffs"] else "; ".join(res["diffs"][:10])),
            "",
        ]
    if soak:
        lines += soak_lines(soak)
    lines += [
        "## How to read it",
        "",
        "- total ms: a rank's detection to its first good collective on the new generation, slowest rank "
        "(the hang's includes nothing of the timeout: detection is separate).",
        "- decision: retry (no rank committed: every rank re-runs the step from the same batch and RNG "
        "state) or roll_forward (the vote completed on some ranks: the others apply the step from the "
        "reduced gradients they hold). Either way no step is lost, none is applied twice.",
        *_driver.closing_lines(runtime, prov),
    ]
    return "\n".join(lines) + "\n"


def keep_soak_section(new_table: str, old_path: Path) -> str:
    """``new_table`` (the short runs only) with the soak section of the table.md at ``old_path`` put back
    where table_md puts it, before "## How to read it"."""
    old = old_path.read_text() if old_path.exists() else ""
    before_guide = old.partition("## How to read it")[0]
    soak = ("## Soak" + before_guide.split("## Soak", 1)[1]) if "## Soak" in before_guide else ""
    head, sep, tail = new_table.partition("## How to read it")
    return head + soak + sep + tail
