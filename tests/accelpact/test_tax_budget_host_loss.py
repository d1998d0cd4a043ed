"""A host loss after the tax budget chose a sparser cadence, under ``python -m accelpact.run``.

Two agents (``--nnodes 2``, one rank each, each node its own snapshot root) run ``examples/train_heal.py
--replicas --max-tax 0.0001 --max-bound 4 --tax-warmup 4``: a budget nothing meets, so at the decision
step (8) both ranks agree on the cheapest cadence within the bound, every=4 push_every=1, from step 12.
Rank 1 then loses its host (its node's shared memory deleted, SIGKILL) mid-step, so its replacement can
only heal from its buddy's replica, and has to learn the job's cadence from the store, not measure it.

- Kill at step 18: the survivor committed 17, the newest pushed step is 16: 1 step replayed.
- Kill at step 21: committed 20, a pushed step whose push may not have landed: 0 or 4 steps replayed.

Both end bit-identical to a fault-free run, within the bound K = 4, with nothing read from disk, and every
process (the replacement included) holds the same cadence.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_push_every_host_loss import assert_bit_identical, launch, results

STEPS, K = 24, 4
BUDGET = ["--max-tax", "0.0001", "--max-bound", str(K), "--tax-warmup", "4"]
SCHEDULE = "4,1,12,1,1"  # every=4 push_every=1 from step 12, after every=1 push_every=1


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("tax_budget")
    port = random.randint(20000, 29000)
    lose = ["--replicas", *BUDGET, "--lose-host", "--kill-rank", "1"]
    jobs = {"ref": [], "kill18": [*lose, "--kill-at", "18"], "kill21": [*lose, "--kill-at", "21"]}
    procs = {name: launch(tmp / name, port + i, args, steps=STEPS) for i, (name, args) in enumerate(jobs.items())}
    for name, pair in procs.items():
        for node, p in enumerate(pair):
            rc = p.wait(timeout=800)
            assert rc == 0, f"{name} agent {node}: {(tmp / name / f'agent{node}.log').read_text()[-4000:]}"
    return tmp


@pytest.mark.slow  # three launcher runs of 24 steps, two with a replacement (~2.5 min on this 2-core host)
@pytest.mark.parametrize("name,committed,allowed", [("kill18", 17, {1}), ("kill21", 20, {0, K})])
def test_budgeted_cadence_heals_a_lost_host_within_its_bound(runs, name, committed, allowed):
    run = runs / name
    assert_bit_identical(runs / "ref", run)
    [survivor] = results(run, 0)
    decision = survivor["cadence"]["decision"]
    assert (decision["step"], decision["every"], decision["push_every"], decision["fits"]) == (8, 4, 1, False)
    [heal] = [h for h in survivor["heals"] if h["role"] == "survivor"]
    assert heal["replayed"] in allowed and heal["replayed"] <= K, heal
    resumed_from = committed - heal["replayed"]
    assert resumed_from % K == 0 and heal["resume_step"] == resumed_from + 1  # a step pushed after the switch
    assert heal["bytes_read_from_disk"] == 0
    replacement = results(run, 1)[-1]
    assert replacement["replacement"] == 1 and replacement["heals"][0]["source"] == "buddy"
    assert replacement["cadence"]["decision"] is None  # it did not measure: it took the job's
    assert survivor["cadence"]["schedule"] == replacement["cadence"]["schedule"] == SCHEDULE
