"""Every bad input: exit non-zero, one readable line naming the fix, no traceback, nothing left behind.

All cases run as real `python -m harness ...` subprocesses, started together to share start-up time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from harness_test_helpers import harness_cmd, harness_env, worker_processes

CASES = {
    "unknown_group_value": (["model=mistral_huge"], "model=mistral_tiny"),
    "unknown_experiment": (["experiment=nope"], "experiment=compare"),  # the default experiment
    "type_error": (["train.steps=abc"], "train.steps"),
    "steps_zero": (["train.steps=0"], "train.steps=25"),
    "too_many_local_ranks": (["cluster.world_size=64"], "cluster.world_size="),
    "nccl_without_gpus": (["cluster=single_node_gpu", "cluster.world_size=2"], "cluster=local_cpu"),
    "paper_experiment_here": (["experiment=mistral7b_age18"], "experiment=mistral7b_age18"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    started = {}
    for name, (args, _) in CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        proc = subprocess.Popen(
            harness_cmd(args, tmp),
            cwd=tmp,
            env=harness_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[name] = (proc, tmp)
    done = {}
    for name, (proc, tmp) in started.items():
        out, err = proc.communicate(timeout=240)
        done[name] = (proc.returncode, out, err, tmp)
    return done


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_leaves_nothing(case, outcomes):
    code, out, err, tmp = outcomes[case]
    fix = CASES[case][1]
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err + out
    assert fix in lines[0], lines[0]
    # Nothing behind: no run dir, no row, no index, no processes.
    assert sorted(p.name for p in Path(tmp).iterdir()) == []
    assert worker_processes(str(tmp)) == []


def test_paper_experiment_prints_memory_plan_and_never_swaps_the_model(outcomes):
    code, out, err, _ = outcomes["paper_experiment_here"]
    assert "memory plan: model=mistral7b" in out
    assert "DOES NOT FIT" in out
    # The suggestion keeps the experiment and names the smaller model explicitly.
    suggestion = err.rsplit("`python -m harness ", 1)[1]
    assert "experiment=mistral7b_age18" in suggestion and " model=mistral_" in suggestion
