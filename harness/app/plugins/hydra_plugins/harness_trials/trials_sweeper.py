"""``hydra/sweeper=trials``: a comparison sweep run as ``compare.trials`` interleaved rounds.

The jobs are Hydra's basic sweep (the Cartesian product of the sweep's values, e.g. every age x every
strategy). Each round runs the sweep's fault-free reference (in this process, as the comparison
callback does) and every job once, in ``harness.report.trials.round_order`` (rotated by the round), so
each trial has its own reference measured beside its runs. With more than one trial, the runs of
trial k go to ``<sweep dir>/trial<k>/<subdir>``; with one, the layout is the plain comparison's
(``<sweep dir>/reference``, ``<sweep dir>/<subdir>``).

Jobs are launched one at a time (the order is the point); a parallel launcher gains nothing here.
A sweep that injects no fault and sweeps none (e.g. a checkpoint-overhead sweep) gets no reference.
No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module without
registering it in sys.modules, where a dataclass with string annotations cannot resolve them.
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from harness.report import compare

REFERENCE = object()  # the reference's place in a round


@dataclass
class TrialsSweeperConf:
    _target_: str = "hydra_plugins.harness_trials.trials_sweeper.TrialsSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="trials", node=TrialsSweeperConf, provider="harness")


def trial_prefix(trial: int, trials: int) -> str:
    """The directory runs of ``trial`` go under, relative to the sweep dir ("" for a single trial)."""
    from harness.report.trials import TRIAL_DIR  # lazy: numpy, scipy

    return "" if trials == 1 else f"{TRIAL_DIR}{trial}/"


class TrialsSweeper(BasicSweeper):
    """The basic sweeper's jobs, in ``compare.trials`` rounds each with its own reference (module docstring)."""

    def sweep(self, arguments: List[str]) -> Any:
        from harness.app import comparison
        from harness.report.trials import interleave  # lazy: numpy, scipy

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = self.split_arguments(overrides, None)[0]
        trials = int(OmegaConf.select(self.config, "compare.trials", default=1) or 1)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)["subdir"]  # type: ignore[index, call-overload]
        with_reference = comparison.needs_reference(self.config)
        items: list[Any] = ([REFERENCE] if with_reference else []) + list(range(len(jobs)))
        plan = interleave(items, trials)
        if trials > 1:
            print(f"comparison: {trials} trials of {len(items)} runs each, interleaved ({len(plan)} runs)", flush=True)
        self.validate_batch_is_legal(jobs)
        returns = []
        job_idx = 0
        t0 = time.time()
        for n, (trial, item) in enumerate(plan):
            prefix = trial_prefix(trial, trials)
            if trials > 1 and n and n % len(items) == 0:
                print(
                    f"comparison: trial {trial} of {trials} starts ({(time.time() - t0) / 60:.1f} min so far)",
                    flush=True,
                )
            if item is REFERENCE:
                comparison.run_reference(self.config, sweep_dir / prefix / compare.REFERENCE, required=trial == 0)
                continue
            job = [*jobs[item], f"compare.trial={trial}"]
            if prefix:
                job.append(f"hydra.sweep.subdir={prefix}{subdir}")
            results = self.launcher.launch([job], initial_job_idx=job_idx)
            for r in results:
                _ = r.return_value  # a job that raised raises here, as in the basic sweeper
            job_idx += 1
            returns.append(results)
        return returns
