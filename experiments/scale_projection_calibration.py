"""The calibration sections of the scale projection's table.md: how far the simulator's whole-run goodput
is from the measured runs it was fed (results/goodput_vs_age, and the heal's results/process_loss).

One row per (strategy, age) cell, or (fault, strategy, age) for the heal, with the error's median over
trials and its interval, and the sentences that name the largest miss and the replay check the 5% limit
applies to.
"""

from __future__ import annotations

from typing import Any

from harness.scale import calibrate as cal
from harness.scale import heal_measured as heal


def cell_order(cells: list[cal.CalibrationError]) -> list[cal.CalibrationError]:
    """The reference first, then by age, the strategies at one age in the order they come."""
    names = list(dict.fromkeys(c.strategy for c in cells))
    return sorted(cells, key=lambda c: (c.age is not None, -1 if c.age is None else c.age, names.index(c.strategy)))


def calibration_md(cells: list[cal.CalibrationError]) -> str:
    """One row per (strategy, age) cell: its trials, the medians over them, and the error's median [95%
    interval] (n)."""
    lines = [
        "| strategy | age | trials | measured goodput tok/s (median) | simulated (median) | "
        "error: median [95% interval] (n) | error with the median step (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cell_order(cells):
        lines.append(
            f"| {c.strategy} | {'-' if c.age is None else c.age} | {c.trials} | {c.measured:.0f} | "
            f"{c.simulated:.0f} | {c.text()} | {c.error_median_step:+.1%} |"
        )
    return "\n".join(lines)


def _worst(cells: list[Any]) -> Any:
    return max(cells, key=lambda c: abs(c.error_median))


def _age(cell: Any) -> Any:
    return "-" if cell.age is None else cell.age


_LIMIT_SENTENCE = f" The limit is {cal.LIMIT:.0%} on each cell's median error."


def _replay_sentence(fed: str, check: str, cell: str, text: str) -> str:
    """The replay check's largest miss (every run fed its own measured costs), which the 5% limit applies to."""
    return (
        f" Fed each run's own measured {fed} instead (the engine's replay check{check}), the largest miss is "
        f"{cell}, {text}; the limit, {cal.LIMIT:.0%} on each cell's median error, applies to that check "
        "(tests/scale)."
    )


def largest_miss_md(cells: list[cal.CalibrationError], replay: list[cal.CalibrationError] | None = None) -> str:
    """The sentence naming the cell with the largest |median error| over trials, with its interval; with
    ``replay`` (every run fed its own measured costs, ``calibrate(own=True)``), the same for that check,
    which is the one the 5% limit applies to."""
    w = _worst(cells)
    text = f"Largest miss (median error over trials): {w.strategy} age {_age(w)}, {w.text()}."
    if not replay:
        return text + _LIMIT_SENTENCE
    r = _worst(replay)
    over = [c for c in cells if abs(c.error_median) > cal.LIMIT]
    return (
        text
        + (
            f" {len(over)} cell(s) miss by more than {cal.LIMIT:.0%}: the recovery costs themselves moved "
            "from run to run (a strategy's median cost does not fit every run of a loaded host), "
            "which the intervals show."
            if over
            else ""
        )
        + _replay_sentence(
            "stop and destroyed work",
            ": only the schedule, rollback, replay and checkpoint accounting are the engine's",
            f"{r.strategy} age {_age(r)}",
            r.text(),
        )
    )


def heal_largest_miss_md(
    cells: list[heal.HealCalibrationCell], replay: list[heal.HealCalibrationCell] | None = None
) -> str:
    """The same for the heal's cells: the largest of a heal, then of any cell; with ``replay`` (every run fed
    its own measured costs), that check's largest miss, which the 5% limit applies to."""
    healed = _worst([c for c in cells if c.heals])
    w = _worst(cells)
    text = (
        f"Largest miss of a heal (median error over trials): {healed.fault} age {healed.age}, {healed.text()}; "
        f"of any cell: {w.strategy} {w.fault} age {_age(w)}, {w.text()}."
    )
    if not replay:
        return text + _LIMIT_SENTENCE
    r = _worst(replay)
    return text + _replay_sentence(
        "stop and thrown-away attempt", "", f"{r.strategy} {r.fault} age {_age(r)}", r.text()
    )


def trials_said(n: set[int]) -> str:
    """How many measured trials the cells have, in words ("3 trials", "2-3 trials"; one trial says that
    there is no interval)."""
    lo, hi = min(n), max(n)
    if hi == 1:
        return "1 trial, so no interval: each cell is one run"
    return f"{lo} trials" if lo == hi else f"{lo}-{hi} trials"


def heal_cell_order(cells: list[heal.HealCalibrationCell]) -> list[heal.HealCalibrationCell]:
    """Per fault (as they come), the reference first, then each strategy (as they come) by age."""
    faults = list(dict.fromkeys(c.fault for c in cells))
    names = list(dict.fromkeys(c.strategy for c in cells))
    return sorted(
        cells,
        key=lambda c: (
            faults.index(c.fault),
            c.age is not None,
            names.index(c.strategy),
            not c.heals,
            -1 if c.age is None else c.age,
        ),
    )


def heal_calibration_md(cells: list[heal.HealCalibrationCell]) -> str:
    lines = [
        "| fault (class) | strategy as run | recovery | age | trials | measured goodput tok/s (median) | "
        "simulated (median) | error: median [95% interval] (n) | median stop fed (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in heal_cell_order(cells):
        how = "heal in memory" if c.heals else ("-" if c.age is None else "restart + restore from disk")
        lines.append(
            f"| {c.fault} ({heal.FAULT_CLASS[c.fault]}) | {c.strategy} | {how} | "
            f"{'-' if c.age is None else c.age} | {c.trials} | {c.measured:.0f} | {c.simulated:.0f} | "
            f"{c.text()} | {c.stop_s:.2f} |"
        )
    return "\n".join(lines)


def heal_costs_md() -> str:
    lines = [
        "| harness fault | simulator class | "
        + " | ".join(heal.HEAL_PARTS)
        + " | attempt thrown away | runs | source |",
        "|---|---|" + "---|" * len(heal.HEAL_PARTS) + "---|---|---|",
    ]
    for fault, h in heal.measured_heal().items():
        lines.append(
            f"| {fault} | {heal.FAULT_CLASS[fault]} | "
            + " | ".join(f"{h.parts[p]:.3f} s" for p in heal.HEAL_PARTS)
            + f" | {h.destroyed_s:.3f} s | {h.runs} | {h.source} |"
        )
    return "\n".join(lines)
