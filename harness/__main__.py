"""``python -m harness [overrides]``: compose conf/, validate, launch the ranks, write the results row.

Thin on purpose. A preflight check composes and validates the command line before Hydra creates a
run directory, so a bad input exits with one line (status 2) and leaves nothing behind. Outputs go
under Hydra's run directory (``hydra.run.dir``); the working directory is never changed.
The return value (tokens/s) is the metric sweepers optimise. A sweep over faulted runs (the default
experiment is one) is compared with its fault-free reference by ``harness.report.compare``.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.app import capabilities
from harness.app.config import CONF_DIR, CONFIG_NAME, load_catalogue, register_schemas, to_run_config
from harness.app.validate import ConfigError, validate
from harness.machine import probe
from harness.plugins import load_plugins
from harness.schema import Device

EXIT_BAD_CONFIG = 2
EXIT_RUN_FAILED = 1

load_plugins()  # before the schemas: a plugin's strategy or fault kind becomes a config option
register_schemas()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=CONFIG_NAME)
def hydra_main(cfg: DictConfig) -> float:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    overrides = list(hc.overrides.task)
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        run = to_run_config(cfg)
        memory = validate(run, probe(with_gpus=run.cluster.device == Device.cuda), load_catalogue(), overrides)
        capabilities.check_runnable(run)
    except ConfigError as err:
        # Normally caught by the preflight; here for configs only known after composition
        # (e.g. an experiment's own sweep values). Remove what Hydra created for this job.
        _remove_fresh_run_dir(run_dir)
        _report_config_error(err)
        if multirun:
            return math.nan
        sys.exit(EXIT_BAD_CONFIG)

    from harness.app.comparison import sweep_reference_dir
    from harness.parent.run import run_one  # lazy: torch

    row = run_one(
        run,
        run_dir,
        memory,
        overrides,
        reference_dir=sweep_reference_dir() if multirun else None,
        show_plan=not multirun or hc.job.num == 0,
    )
    if row["status"] != "ok":
        if multirun:
            return math.nan
        sys.exit(EXIT_RUN_FAILED)
    return float(row["tokens_per_s"] or math.nan)


def _report_config_error(err: ConfigError) -> None:
    if err.memory_plan is not None:
        print(err.memory_plan.table(), flush=True)
    print(f"error: {err}", file=sys.stderr, flush=True)


def _remove_fresh_run_dir(run_dir: Path) -> None:
    """Delete the job directory Hydra just made, only if it holds nothing but Hydra's own files."""
    if run_dir.is_dir() and all(p.name in {".hydra"} or p.suffix == ".log" for p in run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    from harness.app import preflight

    if preflight.VALIDATE_ONLY_FLAG in sys.argv[1:]:  # check the composition(s), run nothing
        sys.exit(preflight.validate_only(sys.argv[1:]))
    if "experiment=project_scale" in sys.argv[1:]:  # the cluster-scale simulator: its own keys, no ranks
        from harness.scale.entry import main as scale_main  # lazy: PyYAML, numpy

        sys.exit(scale_main(sys.argv[1:]))
    try:
        preflight.check(sys.argv[1:])
    except ConfigError as err:
        _report_config_error(err)
        sys.exit(EXIT_BAD_CONFIG)
    hydra_main()


if __name__ == "__main__":
    main()
