"""The parent -> rank contract: environment variables, and the spec file that carries the config.

Common ground of the two processes: the parent (``harness.parent``) writes both, a rank
(``harness.rank.worker``) reads them; neither side imports the other.

``ACCELPACT_CONTROL_ADDR`` / ``ACCELPACT_JOB_TOKEN`` name the parent's long-lived store and this
job's token; every data-plane key is prefixed with the token so a stray process from another job
cannot join. Pure: no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import strategies
from harness.schema import RunConfig, run_config_from_dict, to_dict
from harness.slurm_env import rank_identity

CONTROL_ADDR = "ACCELPACT_CONTROL_ADDR"
JOB_TOKEN = "ACCELPACT_JOB_TOKEN"
# The snapshots' token (accelpact.snapshot.job_token_from_env): one per run, unlike the job token, which is
# new in each incarnation; a relaunched rank finds the previous incarnation's snapshots under it.
SNAPSHOT_TOKEN = "ACCELPACT_SNAPSHOT_TOKEN"
INCARNATION = "HARNESS_INCARNATION"
T_LAUNCH = "HARNESS_T_LAUNCH"
PARENT_PID = "HARNESS_PARENT_PID"
# n > 0: this process replaces a lost process of its rank (the n-th replacement of the run) and joins
# the running job in memory (accelpact.recovery.rejoin) instead of starting with everyone.
REPLACEMENT = "HARNESS_REPLACEMENT"


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    control_host: str
    control_port: int
    token: str
    incarnation: int = 0
    t_launch: float = 0.0
    parent_pid: int = 0
    replacement: int = 0

    @property
    def control_addr(self) -> str:
        return f"{self.control_host}:{self.control_port}"

    def data_plane_prefix(self, generation: int = 0) -> str:
        """Store prefix of data-plane process group generation ``generation``."""
        return f"{self.token}/dp/gen{generation}"

    def to_environ(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            CONTROL_ADDR: self.control_addr,
            JOB_TOKEN: self.token,
            INCARNATION: str(self.incarnation),
            T_LAUNCH: repr(self.t_launch),
            PARENT_PID: str(self.parent_pid),
            REPLACEMENT: str(self.replacement),
        }

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> RankEnv:
        """From the parent's variables; an ``srun`` task (cluster.launch=srun) that was given no RANK takes
        rank, world size and local rank from Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)."""
        slurm = None if "RANK" in env else rank_identity(env)
        if slurm is not None:
            rank, world_size, local_rank = slurm
            env = {**env, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank)}
        missing = [k for k in ("RANK", "WORLD_SIZE", CONTROL_ADDR, JOB_TOKEN) if k not in env]
        if missing:
            raise RuntimeError(
                f"rank process started without {', '.join(missing)}; start ranks with `python -m harness`"
            )
        host, _, port = env[CONTROL_ADDR].rpartition(":")
        return cls(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            control_host=host,
            control_port=int(port),
            token=env[JOB_TOKEN],
            incarnation=int(env.get(INCARNATION, "0")),
            t_launch=float(env.get(T_LAUNCH, "0")),
            parent_pid=int(env.get(PARENT_PID, "0")),
            replacement=int(env.get(REPLACEMENT, "0")),
        )


SPEC_NAME = "worker_spec.json"


def write_spec(run_dir: str | Path, cfg: RunConfig) -> Path:
    """Write the run's config for its ranks (plain JSON: a rank never imports Hydra or OmegaConf)."""
    path = Path(run_dir) / SPEC_NAME
    path.write_text(json.dumps({"run_dir": str(run_dir), "config": to_dict(cfg)}, indent=1))
    return path


def read_spec(path: str | Path) -> tuple[str, RunConfig]:
    """(run dir, config) from a spec file :func:`write_spec` wrote."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data["run_dir"], run_config_from_dict(data["config"], strategies.config_class)
