"""What every experiment driver does around its measurement: arguments, output dir, provenance, timing.

Each ``experiments/<name>.py`` builds its parser with :func:`parser` (``--quick`` and ``--out``, the
flags ``experiments.reproduce`` relies on), resolves where it writes with :func:`output_dir`
(``results/<name>/``, or a fresh temp dir for ``--quick`` so a check never overwrites committed
results), and records how the results were made with :class:`Timing` and the provenance helpers
below. Standard library only, plus experiments.provenance.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.provenance import current_command, load_provenance, provenance_markdown

__all__ = [
    "RESULTS_ROOT",
    "results_dir",
    "parser",
    "output_dir",
    "command",
    "load_average_text",
    "Timing",
    "record_runtime",
    "add_end_load",
    "write_csv",
    "number",
    "read_csv",
]

RESULTS_ROOT = Path(__file__).resolve().parent.parent / "results"


def results_dir(name: str) -> Path:
    """Where the full run of experiment ``name`` writes its committed results."""
    return RESULTS_ROOT / name


def parser(doc: str | None, name: str, quick_help: str) -> argparse.ArgumentParser:
    """An argument parser with the flags every experiment has: ``--quick`` and ``--out``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default=None, help=f"output dir (default results/{name}/; --quick: a temp dir)")
    return ap


def scratch_dir(args: argparse.Namespace, name: str) -> Path:
    """``--scratch`` if given (created if missing), else a new temp dir for the runs' raw outputs."""
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix=f"{name}_runs_"))
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch


def output_dir(args: argparse.Namespace, name: str, *, rederive: bool = False) -> Path:
    """``--out`` if given; else a new temp dir for ``--quick`` (never results/) or results/<name>/.

    ``rederive``: the directory holding the committed measurement to re-derive from (never a temp dir).
    Created if missing.
    """
    if args.out:
        out = Path(args.out)
    elif args.quick and not rederive:
        out = Path(tempfile.mkdtemp(prefix=f"{name}_quick_"))
    else:
        out = results_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    return out


def command(argv: Sequence[str] | None, name: str) -> str:
    """The command line that reproduces this run: ``python -m experiments.<name> <args>``."""
    return current_command(argv, module=f"experiments.{name}")


def load_average_text(sep: str = " ") -> str:
    """The host's 1/5/15 minute load averages (timings on a shared host need them beside)."""
    return sep.join(str(round(x, 2)) for x in os.getloadavg())


@dataclass
class Timing:
    """Wall time and load average of a measurement, from construction on."""

    t0: float = field(default_factory=time.time)
    load_start: str = field(default_factory=load_average_text)

    @property
    def elapsed_s(self) -> float:
        return time.time() - self.t0

    def extra(self) -> dict[str, Any]:
        """Provenance extras of a finished run: load at start and end, run time in whole seconds."""
        return {
            "load_avg_start": self.load_start,
            "load_avg_end": load_average_text(),
            "runtime_s": round(self.elapsed_s),
        }


def _update_extra(out: Path, **values: Any) -> None:
    path = out / "provenance.json"
    prov = json.loads(path.read_text())
    prov["extra"].update(values)
    path.write_text(json.dumps(prov, indent=1, default=str) + "\n")
    (out / "provenance.md").write_text(provenance_markdown(load_provenance(out)))


def record_runtime(out: Path, runtime_s: float) -> None:
    """Add the run time to a provenance written before the measurement (its load is the start's)."""
    _update_extra(out, runtime_s=round(runtime_s, 1))


def add_end_load(out: Path) -> None:
    """Add the load average at the end too: the machine is shared, and the start alone can mislead."""
    _update_extra(out, load_avg_at_end="/".join(f"{x:.2f}" for x in os.getloadavg()))


def closing_lines(runtime_s: float, prov: Any) -> list[str]:
    """The last lines of every table.md: the run time and the provenance block."""
    return [f"- Run time: {runtime_s / 60:.1f} min.", "", provenance_markdown(prov)]


def write_csv(path: Path, rows: Sequence[dict[str, Any]], float_spec: str = "") -> None:
    """``rows`` as CSV with the first row's keys as header; floats formatted with ``float_spec``
    (e.g. ".6g"; empty: as Python prints them), None as an empty cell. No rows: an empty file."""
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (format(v, float_spec) if float_spec and isinstance(v, float) else v) for k, v in r.items()})


def number(v: str) -> Any:
    """A CSV cell read back: an int, else a float, else the text unchanged."""
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def read_csv(path: Path, cell: Callable[[str, str], Any] = lambda key, v: number(v)) -> list[dict[str, Any]]:
    """Rows of a CSV as dicts, each cell converted by ``cell(column, text)`` (default: :func:`number`)."""
    with path.open() as f:
        return [{k: cell(k, v) for k, v in r.items()} for r in csv.DictReader(f)]
