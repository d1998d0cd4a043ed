"""Rank process entry point: ``python -m harness.rank.worker <run_dir>/worker_spec.json``.

Started by the parent (``harness.parent.launcher``) with RANK / WORLD_SIZE / ACCELPACT_* in the environment.
Never imports Hydra or OmegaConf: the spec is the plain-JSON form of the typed RunConfig.
Exit status: 0 when training finished; 1 with the traceback on stderr (the rank's log) otherwise.
"""

from __future__ import annotations

import os
import sys
import traceback

from accelpact.run import die_with_parent
from accelpact.run.spare import SPARE_ENV
from harness.contract import RankEnv, read_spec
from harness.plugins import load_plugins


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.rank.worker <run_dir>/worker_spec.json", file=sys.stderr)
        return 2
    env = RankEnv.from_environ()
    # An srun task numbered itself from SLURM_PROCID & co.: export the result, so that everything that
    # reads the standard variables (accelpact's ControlChannel.from_env, torch) sees the same numbers.
    os.environ.update({"RANK": str(env.rank), "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank)})
    die_with_parent(env.parent_pid)
    load_plugins()  # strategies and fault kinds of plugins, as in the parent (the spec's strategy may be one)
    run_dir, cfg = read_spec(argv[0])
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
