"""Provenance of committed results: which command, code, machine and moment produced them.

Every ``results/<name>/`` carries a ``provenance.json`` (the exact command, git sha and whether the
tree was dirty, the date, the machine: cores, memory, CPU model, torch, python, GPU, load average)
and its ``table.md`` carries the same facts as a short markdown block. Every committed figure gets a
footer naming the same (``stamp_figure``). ``paper_vs_ours_table`` renders the paper's figure beside
ours with a verdict that says, with its reason, when ours is worse.

The formatting functions are pure (``Provenance`` in, text out); only ``collect`` probes the host.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.machine import usable_cores
from harness.report.gitinfo import git_state

PROVENANCE_FILE = "provenance.json"
PROVENANCE_MD = "provenance.md"
REPO_ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "Provenance",
    "ClaimRow",
    "collect",
    "current_command",
    "write_provenance",
    "provenance_markdown",
    "footer_text",
    "stamp_figure",
    "verdict",
    "paper_vs_ours_table",
]


@dataclass(frozen=True)
class Provenance:
    command: str
    git_sha: str
    git_dirty: bool | None  # None: not a git checkout (or git missing)
    date: str  # ISO 8601, UTC
    machine: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        return cls(
            **{k: data[k] for k in ("command", "git_sha", "git_dirty", "date", "machine")},
            extra=dict(data.get("extra", {})),
        )

    @property
    def short_sha(self) -> str:
        return self.git_sha[:10] + ("-dirty" if self.git_dirty else "")


# ---- probing (impure) --------------------------------------------------------------------------
def current_command(argv: Sequence[str] | None = None, module: str | None = None) -> str:
    """The command line that reproduces this process, relative to the repo root.

    ``module`` given: ``python -m <module> <args>`` (how experiments are run); else ``sys.argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if module:
        return " ".join(["python", "-m", module, *map(shlex.quote, args)])
    return " ".join(["python", *map(shlex.quote, [sys.argv[0], *args])])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """Cores, memory, CPU model, torch/python versions, GPUs and the load average right now."""
    import psutil

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_cores": usable_cores(),
        "mem_total_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "mem_available_gib": round(psutil.virtual_memory().available / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        info["load_avg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        info["load_avg_1_5_15"] = None
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpus"] = (
            [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available()
            else []
        )
    except ImportError:
        info["torch"], info["gpus"] = None, []
    return info


def collect(command: str, extra: Mapping[str, Any] | None = None) -> Provenance:
    """Provenance of a result produced now, by ``command``, from this checkout, on this machine."""
    # Dirty means the CODE differs from the commit: results/ is what the experiments rewrite.
    sha, dirty = git_state(exclude=("results",))
    return Provenance(
        command=command,
        git_sha=sha or "unknown",
        git_dirty=dirty,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        machine=machine_info(),
        extra=dict(extra or {}),
    )


def write_provenance(out_dir: str | Path, command: str, extra: dict[str, Any]) -> Path:
    """Write ``provenance.json`` and ``provenance.md`` (the block to include in table.md) into
    ``out_dir``; returns the JSON's path. Read back with ``load_provenance``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prov = collect(command, extra)
    path = out / PROVENANCE_FILE
    path.write_text(json.dumps(prov.to_dict(), indent=1, default=str) + "\n")
    (out / PROVENANCE_MD).write_text(provenance_markdown(prov))
    return path


def load_provenance(out_dir: str | Path) -> Provenance:
    return Provenance.from_dict(json.loads((Path(out_dir) / PROVENANCE_FILE).read_text()))


# ---- formatting (pure) -------------------------------------------------------------------------
def _machine_line(m: Mapping[str, Any]) -> str:
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    load = m.get("load_avg_1_5_15")
    load_txt = f", load average {'/'.join(str(x) for x in load)} (1/5/15 min) at the start" if load else ""
    return (
        f"{m.get('cpu_cores')} cores ({m.get('cpu_model')}), {m.get('mem_total_gib')} GiB memory, {gpus}, "
        f"torch {m.get('torch')}, python {m.get('python')}{load_txt}"
    )


def provenance_markdown(prov: Provenance) -> str:
    """A short markdown block: command, code, date, machine (for table.md)."""
    dirty = {True: " (working tree had uncommitted changes)", False: "", None: " (not a git checkout)"}[prov.git_dirty]
    lines = [
        "### Provenance",
        "",
        f"- command: `{prov.command}`",
        f"- code: git `{prov.git_sha}`{dirty}",
        f"- date: {prov.date}",
        f"- machine: {_machine_line(prov.machine)}",
    ]
    for key, value in prov.extra.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            lines.append(f"- {key}: {value}")
    return "\n".join(lines) + "\n"


def footer_text(prov: Provenance) -> str:
    """One or two short lines for the bottom of a figure."""
    m = prov.machine
    gpu = (m.get("gpus") or ["no GPU"])[0]
    return (
        f"{prov.command}\ngit {prov.short_sha} | {prov.date[:10]} | {m.get('cpu_cores')} cores, "
        f"{m.get('mem_total_gib')} GiB, {gpu}, torch {m.get('torch')}"
    )


def stamp_figure(fig: Any, prov: Provenance, fontsize: float = 6.5) -> None:
    """Write the provenance footer into a matplotlib figure, below the axes (call before savefig;
    leaves room at the bottom so the footer overlaps nothing)."""
    fig.subplots_adjust(bottom=max(fig.subplotpars.bottom, 0.2))
    fig.text(0.01, 0.01, footer_text(prov), fontsize=fontsize, color="0.35", ha="left", va="bottom", family="monospace")


@dataclass(frozen=True)
class ClaimRow:
    """One row of a paper-vs-ours table.

    ``better``: the direction in which OUR figure supports the paper's claim more strongly than the
    paper's own ("higher", "lower"), or None where no direction is better (a setting, a size).
    ``reason`` is required whenever the verdict is "worse" or "not comparable": it is the
    explanation, with measurements, that the table must carry.
    """

    claim: str
    paper: str  # the paper's figure as printed, e.g. "+656.7%"; "" when the paper reports none
    ours: str  # our figure as printed
    paper_value: float | None = None
    ours_value: float | None = None
    better: str | None = None
    reason: str = ""
    comparable: bool = True
    tolerance: float = 0.10  # relative difference still called a match

    def __post_init__(self) -> None:
        if self.better not in (None, "higher", "lower"):
            raise ValueError(f"ClaimRow({self.claim!r}).better={self.better!r}: use 'higher', 'lower' or None")


def verdict(row: ClaimRow) -> str:
    """The verdict cell: 'matches the paper', 'better than the paper', 'worse than the paper: <why>',
    'differs from the paper: <why>', 'not comparable: <why>' or 'no paper figure'."""
    if not row.comparable:
        _need_reason(row, "not comparable")
        return f"not comparable: {row.reason}"
    if not row.paper or row.paper_value is None:
        return "no paper figure" + (f": {row.reason}" if row.reason else "")
    if row.ours_value is None or (isinstance(row.ours_value, float) and math.isnan(row.ours_value)):
        _need_reason(row, "not measured")
        return f"not measured: {row.reason}"
    scale = max(abs(row.paper_value), 1e-12)
    rel = (row.ours_value - row.paper_value) / scale
    if abs(rel) <= row.tolerance:
        return "matches the paper" + (f" ({row.reason})" if row.reason else "")
    if row.better is None:
        _need_reason(row, "differs from the paper")
        return f"differs from the paper: {row.reason}"
    ours_better = rel > 0 if row.better == "higher" else rel < 0
    if ours_better:
        return "better than the paper" + (f" ({row.reason})" if row.reason else "")
    _need_reason(row, "worse than the paper")
    return f"worse than the paper: {row.reason}"


def _need_reason(row: ClaimRow, what: str) -> None:
    if not row.reason.strip():
        raise ValueError(
            f"claim {row.claim!r} is {what} (paper {row.paper!r}, ours {row.ours!r}) but has no reason: "
            "set ClaimRow.reason to the explanation, with the measurements behind it"
        )


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def paper_vs_ours_table(rows: Iterable[ClaimRow | Mapping[str, Any]]) -> str:
    """Markdown table: claim | paper | ours | verdict. Rows may be ClaimRow or dicts of its fields."""
    parsed = [r if isinstance(r, ClaimRow) else ClaimRow(**r) for r in rows]
    if not parsed:
        raise ValueError("paper_vs_ours_table needs at least one row")
    lines = ["| claim | paper | ours | verdict |", "|---|---|---|---|"]
    for r in parsed:
        lines.append(
            f"| {_cell(r.claim)} | {_cell(r.paper or '(not reported)')} | {_cell(r.ours)} | {_cell(verdict(r))} |"
        )
    return "\n".join(lines) + "\n"
