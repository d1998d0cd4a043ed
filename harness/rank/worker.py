"""Rank process entry point: ``python -m harness.rank.worker <run_dir>/worker_spec.json``.

Started by the parent (``harness.parent.launcher``) with RANK / WORLD_SIZE / ACCELPACT_* in the environment.
Never imports Hydra or OmegaConf: the spec is the plain-JSON form of the typed RunConfig.
Exit status: 0 when training finished; 1 with the traceback on stderr (the rank's log) otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from accelpact.run import die_with_parent
from harness.rank.env import RankEnv
from harness.schema import RunConfig, run_config_from_dict

SPEC_NAME = "worker_spec.json"


def write_spec(run_dir: str | Path, cfg: RunConfig) -> Path:
    from harness.schema import to_dict

    path = Path(run_dir) / SPEC_NAME
    path.write_text(json.dumps({"run_dir": str(run_dir), "config": to_dict(cfg)}, indent=1))
    return path


def read_spec(path: str | Path) -> tuple[str, RunConfig]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data["run_dir"], run_config_from_dict(data["config"])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.rank.worker <run_dir>/worker_spec.json", file=sys.stderr)
        return 2
    env = RankEnv.from_environ()
    # An srun task numbered itself from SLURM_PROCID & co.: export the result, so that everything that
    # reads the standard variables (accelpact's ControlChannel.from_env, torch) sees the same numbers.
    os.environ.update({"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank)})
    die_with_parent(env.parent_pid)
    run_dir, cfg = read_spec(argv[0])
    from harness.plugins import load_plugins

    load_plugins()  # strategies and fault kinds of plugins, as in the parent
    from harness.parent.replacements import SPARE_ENV

    if os.environ.get(SPARE_ENV):  # a hot spare: wait, fully imported, for the rank of the first death
        from harness.rank.spare import become_rank

        env = become_rank(cfg, env)
    from harness.rank.train import train  # torch import after the cheap checks

    try:
        result = train(cfg, env, run_dir)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    print(f"rank {env.rank}: done, {result.steps_committed} steps, state {result.identity['state_hash'][:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
