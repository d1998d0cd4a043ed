"""torchft 0.2.0 as measured by the harness here: the figures that set the simulator's torchft row.

    python -m harness.scale.torchft_measured RUN_DIR [RUN_DIR ...] > results/scale_projection/torchft_runs.csv

Each RUN_DIR is one ``python -m harness experiment=smoke strategy=torchft fault=kill`` run (2 gloo ranks,
two replica groups of one rank; rank 1 SIGKILLed). From its row.csv and its replacement's ``heal`` event,
one csv row: the run's identity (git sha, host, torch, the load average before and during the run), and
- ``torchft_retry_recovery_max_s``: the survivors' stop (detection + quorum + reconfigure of the retried
  step, the slowest rank): what every replica group pays per failure;
- ``heal_process_start_s`` and ``heal_transfer_s``: the failed group's own recovery, its fresh process up to
  the heal and the peer heal itself (tiny model); it pays them alone while the others go on;
- ``torchft_quorum_median_s``: torchft's per-step quorum (not charged by the simulator: see docs/scale.md).

``measured_torchft()`` reads the committed csv back for ``harness.scale.outcomes``: medians over its runs.
"""

from __future__ import annotations

import csv
import functools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.fleet.config import ScaleConfigError

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "results" / "scale_projection" / "torchft_runs.csv"
_ROW_KEYS = (
    "run_id",
    "git_sha",
    "git_dirty",
    "started_at",
    "host",
    "torch",
    "torchft_version",
    "overrides",
    "world_size",
    "steps",
    "status",
    "load_before",
    "load_mean",
    "load_max",
    "cores_used",
    "step_time_median_s",
    "goodput",
    "torchft_quorum_median_s",
    "torchft_quorum_max_s",
    "torchft_retry_recovery_max_s",
    "torchft_heals",
    "torchft_heal_max_s",
    "heal_process_start_s",
    "torchft_short_steps",
    "torchft_group_restarts",
)


def collect(run_dir: Path) -> dict[str, object]:
    """One run's row (see the module docstring) from its row.csv, goodput.json and replacement heal event."""
    with (run_dir / "row.csv").open() as fh:
        row = next(csv.DictReader(fh))
    out: dict[str, object] = {k: row.get(k, "") for k in _ROW_KEYS}
    faults = json.loads((run_dir / "goodput.json").read_text()).get("faults", [])
    out["fault_kind"] = faults[0]["kind"] if faults else ""
    out["fault_step"] = faults[0]["step"] if faults else ""
    from harness.events import Heal, load_events, of_type  # the typed events (pure: no torch)

    rep = [h for h in of_type(load_events(run_dir), Heal) if h.role == "replacement"]
    out["heal_transfer_s"] = rep[0].heal_transfer_s if rep else ""
    out["healed_at_step"] = rep[0].extra.get("to_step", "") if rep else ""  # torchft's own field
    return out


@dataclass(frozen=True)
class TorchftCosts:
    survivor_stop_s: float  # median torchft_retry_recovery_max_s
    replica_start_s: float  # median heal_process_start_s
    replica_heal_s: float  # median heal_transfer_s
    quorum_per_step_s: float  # median torchft_quorum_median_s (reported, not charged)
    runs: int
    load_mean: tuple[float, ...]
    source: str


@functools.lru_cache(maxsize=2)
def measured_torchft(path: str = str(CSV)) -> TorchftCosts:
    p = Path(path)
    if not p.exists():
        raise ScaleConfigError(
            f"{p} is missing: torchft's row takes its costs from it; make it with "
            "`python -m harness.scale.torchft_measured RUN_DIR...` (see its docstring)"
        )
    rows = [r for r in csv.DictReader(p.open()) if r.get("status") == "ok"]
    if not rows:
        raise ScaleConfigError(
            f"{p} has no ok run: rerun the torchft smoke runs (see harness/scale/torchft_measured.py)"
        )

    def med(key: str) -> float:
        try:
            return statistics.median(float(r[key]) for r in rows)
        except (KeyError, ValueError):
            raise ScaleConfigError(f"{p}: column {key!r} is missing or empty in a run: recollect the runs") from None

    try:
        shown = p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(p)
    return TorchftCosts(
        med("torchft_retry_recovery_max_s"),
        med("heal_process_start_s"),
        med("heal_transfer_s"),
        med("torchft_quorum_median_s"),
        len(rows),
        tuple(float(r["load_mean"]) for r in rows),
        f"{shown}, medians over {len(rows)} runs of torchft_retry_recovery_max_s, "
        "heal_process_start_s, heal_transfer_s",
    )


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [collect(d) for d in dirs]
    w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
