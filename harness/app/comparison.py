"""The comparison as the app runs it: the Hydra callback around a comparison sweep, and its reference run.

``ComparisonCallback`` (``conf/config.yaml``'s ``hydra.callbacks``) runs the fault-free reference before
a faulted sweep (:func:`run_reference`; the trials sweeper runs one per trial itself) and, at the end,
reads every run's row and hands them to the report (``harness.report.compare.trial_rows`` and
``harness.report.verdict``), which builds the table. What the table says is the report's business
(``harness.report.compare``); running runs is the app's, so the report never imports the parent.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from harness.faults import planned
from harness.report.compare import REFERENCE, is_fault_free, reference_config, trial_rows
from harness.report.paper import PAPER_GAIN
from harness.schema import CompareConfig

# The sweep's reference directory, set by on_multirun_start; jobs that run in this process (Hydra's
# local launcher) read it to compare themselves with the reference as they end. Jobs on other
# machines (Slurm) see None, and the table compares them at the end instead.
_sweep_reference: dict[str, Path] = {}


def sweep_reference_dir() -> Path | None:
    return _sweep_reference.get("dir")


def needs_reference(config: Any) -> bool:
    """Whether a multirun over ``config`` is a comparison: its base injects a fault, or it sweeps one."""
    from harness.app.config import to_run_config  # lazy: OmegaConf, psutil

    return planned.injects(to_run_config(config)) or "fault" in _swept_keys(config)


def run_reference(config: Any, out: Path, required: bool = True) -> Path | None:
    """Run the fault-free reference of the multirun ``config`` into ``out``; the sweep's jobs compare
    themselves with it from then on. A failed reference raises when ``required``, else it is reported
    and the last good reference stays in use (a later trial's reference failing costs that trial only)."""
    from harness.app.config import to_run_config  # lazy: OmegaConf, psutil
    from harness.parent.run import run_one  # lazy: psutil, torch

    print(f"comparison: running the fault-free reference in {out}", flush=True)
    row = run_one(reference_config(to_run_config(config)), out, None, ["(reference of the sweep)"])
    if row["status"] != "ok":
        if required:
            raise RuntimeError(f"the fault-free reference run failed ({row['reason']}); see {out}/logs")
        print(
            f"warning: the fault-free reference in {out} failed ({row['reason']}); this trial's gains are left out",
            flush=True,
        )
        return None
    _sweep_reference["dir"] = out
    return out


def _uses_trials_sweeper(config: Any) -> bool:
    target = str(config.hydra.get("sweeper", {}).get("_target_", "")) if "hydra" in config else ""
    return target.endswith("TrialsSweeper")


class ComparisonCallback(Callback):
    """Runs the reference before a faulted sweep and the comparison table after it (module docstring).
    Under ``hydra/sweeper=trials`` the sweeper runs one reference per trial instead."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        _sweep_reference.clear()
        if _uses_trials_sweeper(config) or not needs_reference(config):
            return  # the trials sweeper runs its own; or not a fault sweep: nothing to compare
        run_reference(config, Path(str(config.hydra.sweep.dir)) / REFERENCE)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from harness.report.verdict import finish_trials  # lazy: numpy, scipy

        sweep_dir = Path(str(config.hydra.sweep.dir))
        entries: list[tuple[Path, dict[str, Any]]] = []
        for summary in sorted([*sweep_dir.glob("*/summary.json"), *sweep_dir.glob("trial*/*/summary.json")]):
            row = json.loads(summary.read_text()).get("row", {})
            if row:
                entries.append((summary.parent, row))
        faulted = [(d, r) for d, r in entries if not is_fault_free(r)]
        if not faulted:
            return
        base = faulted[0][1]
        title = (
            f"goodput: {base.get('model')}, {base.get('world_size')} x {base.get('backend')}, "
            f"{base.get('steps')} steps, checkpoint every {base.get('checkpoint_interval')} steps "
            f"({base.get('checkpoint_mode')}), sweep {sweep_dir}"
        )
        cmp = _compare_settings(config)
        finish_trials(
            sweep_dir,
            trial_rows(sweep_dir, entries, cmp.ours),
            entries,
            title,
            PAPER_GAIN,
            method=cmp.interval,
            min_effect=cmp.min_effect,
            ours=cmp.ours,
            level=cmp.level,
        )
        failed = [str(d.relative_to(sweep_dir)) for d, r in faulted if r.get("status") != "ok"]
        if failed:
            print(f"error: run(s) {', '.join(failed)} failed; see their logs/ and summary.json", file=sys.stderr)
            sys.exit(1)


def _compare_settings(config: Any) -> CompareConfig:
    """The sweep's ``compare`` settings (the defaults where the config has none)."""
    from omegaconf import OmegaConf  # lazy: OmegaConf

    raw = OmegaConf.select(config, "compare", default=None)
    if raw is None:
        return CompareConfig()
    known = {f.name for f in dataclasses.fields(CompareConfig)}
    return CompareConfig(**{k: v for k, v in OmegaConf.to_container(raw, resolve=True).items() if k in known})  # type: ignore[union-attr]


def _swept_keys(config: Any) -> set[str]:
    """Top-level keys the sweep varies (from the config's sweeper params and the command line)."""
    keys = {str(k).split(".")[0].split("/")[0] for k in (config.hydra.get("sweeper", {}).get("params") or {})}
    for override in config.hydra.overrides.get("task", []):
        if "," in override:
            keys.add(override.split("=", 1)[0].lstrip("+~").split(".")[0].split("/")[0])
    return keys
