"""One snapshot-token rule: the token that survives a group restart, and a per-attempt token refused under accelpact.run."""

from __future__ import annotations

import pytest

from accelpact.errors import AccelPactError
from accelpact.run.env import RankPlace, worker_env
from accelpact.snapshot.launch import check_snapshot_token, job_token_from_env


def test_the_snapshot_token_is_the_same_in_every_attempt_and_the_control_token_is_refused():
    place = RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0, nnodes=1)
    envs = [
        worker_env(place, master_addr="h", master_port=1, run_id="job9", attempt=a, max_restarts=2, base={})
        for a in range(3)
    ]
    assert {job_token_from_env(e) for e in envs} == {"torchrun-job9"}
    for env in envs:
        check_snapshot_token(job_token_from_env(env), env)  # the documented token passes
        with pytest.raises(AccelPactError, match="job_token_from_env"):
            check_snapshot_token(env["ACCELPACT_JOB_TOKEN"], env)  # control.job_token: a new one per attempt
    # Outside accelpact.run (the harness exports ACCELPACT_JOB_TOKEN only): any token is the job's own.
    check_snapshot_token("tok", {"ACCELPACT_JOB_TOKEN": "tok"})
