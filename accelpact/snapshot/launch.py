"""The snapshot job token and the restart count, from what the launcher exported.

Snapshots must outlive a restart, so their token must NOT change with it: under torchrun it is the
run id alone (``torchrun-<TORCHELASTIC_RUN_ID>``), whereas the control channel's token also carries
the restart count (each attempt's store keys are kept apart). ``ACCELPACT_SNAPSHOT_TOKEN``, then
``ACCELPACT_JOB_TOKEN`` override it (the harness exports the latter, the same for a job's
replacements).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accelpact.errors import AccelPactError

__all__ = ["job_token_from_env", "restart_count", "check_snapshot_token"]


def job_token_from_env(env: Mapping[str, str] | None = None) -> str:
    """``$ACCELPACT_SNAPSHOT_TOKEN``, ``$ACCELPACT_JOB_TOKEN``, else ``torchrun-<TORCHELASTIC_RUN_ID>``."""
    env = os.environ if env is None else env
    for name in ("ACCELPACT_SNAPSHOT_TOKEN", "ACCELPACT_JOB_TOKEN"):
        if env.get(name):
            return env[name]
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torchrun-" + env["TORCHELASTIC_RUN_ID"].replace("/", "_")
    raise AccelPactError(
        "no snapshot job token: export ACCELPACT_JOB_TOKEN (the same on every rank and across "
        "restarts of one job, new for each job) or start the job with torchrun"
    )


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times the launcher restarted this worker group (``TORCHELASTIC_RESTART_COUNT``; 0 elsewhere)."""
    env = os.environ if env is None else env
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def check_snapshot_token(job_token: str, env: Mapping[str, str] | None = None) -> None:
    """AccelPactError when ``job_token`` is this attempt's control token (``ACCELPACT_JOB_TOKEN``) while the
    launcher exported a snapshot token that survives restarts (``ACCELPACT_SNAPSHOT_TOKEN``, accelpact.run):
    snapshots named after the former are never found by a restarted group."""
    env = os.environ if env is None else env
    snap, attempt = env.get("ACCELPACT_SNAPSHOT_TOKEN"), env.get("ACCELPACT_JOB_TOKEN")
    if snap and attempt and job_token == attempt != snap:
        raise AccelPactError(
            f"snapshot job_token={job_token!r} is this attempt's control token (ACCELPACT_JOB_TOKEN), which changes "
            "with every group restart: the restarted group would find none of these snapshots. Use "
            f"accelpact.snapshot.job_token_from_env() ({snap!r} here, the same in every attempt)"
        )
