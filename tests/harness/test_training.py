"""Real 2-rank gloo runs through `python -m harness`: results row, plot, index, bit-identical state."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from harness_test_helpers import REPO, TINY, harness_cmd, harness_env, read_row, worker_processes

from harness.identity import compare_runs, load_identity

STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs started together: a, b identical (seed 0); c with seed 1."""
    tmp = tmp_path_factory.mktemp("train")
    specs = {"a": 0, "b": 0, "c": 1}
    procs = {}
    for name, seed in specs.items():
        args = [*TINY, f"train.steps={STEPS}", f"train.seed={seed}", f"hydra.run.dir={tmp / name}"]
        procs[name] = subprocess.Popen(
            harness_cmd(args, tmp),
            cwd=tmp,
            env=harness_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=280)
        out[name] = (proc.returncode, stdout, stderr)
    return tmp, out


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); test_strategies runs the harness end to end
def test_runs_finish_with_row_plot_and_index(runs):
    tmp, out = runs
    for name in "abc":
        code, stdout, stderr = out[name]
        assert code == 0, stderr[-3000:]
        run_dir = tmp / name
        row = read_row(run_dir)
        assert row["status"] == "ok" and row["steps_done"] == STEPS and row["world_size"] == 2
        assert row["backend"] == "gloo" and row["model"] == "mistral_tiny" and row["tokens_per_s"] > 0
        assert row["ranks_agree"] is True
        assert (run_dir / "loss_throughput.png").stat().st_size > 1000
        assert (run_dir / "config.yaml").exists() and (run_dir / "logs" / "rank1.log").exists()
    index = pd.read_csv(tmp / "index.csv")
    assert len(index) == 3 and set(index["status"]) == {"ok"}
    assert worker_processes(str(tmp)) == []


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); three harness runs; test_strategies checks bit-identity
def test_identical_runs_have_identical_state_and_another_seed_differs(runs):
    tmp, _ = runs
    same = compare_runs(tmp / "a", tmp / "b")
    assert same.equal, same.describe()
    other = compare_runs(tmp / "a", tmp / "c")
    assert not other.equal
    assert any("param/model.layers.0" in d for d in other.differing)
    records = load_identity(tmp / "a")
    assert [r["rank"] for r in records] == [0, 1]
    # Ranks hold different shards of the same state.
    assert records[0]["shards"]["param/lm_head.weight"] != records[1]["shards"]["param/lm_head.weight"]


@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); shares the three runs above
def test_identity_cli(runs):
    tmp, _ = runs
    ok = subprocess.run(
        [sys.executable, "-m", "harness.identity", str(tmp / "a"), str(tmp / "b")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "identical" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "harness.identity", str(tmp / "a"), str(tmp / "c")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "DIFFERENT" in bad.stdout and "param/" in bad.stdout


def test_rank_processes_never_import_hydra():
    code = (
        "import sys, harness.rank.worker, harness.rank.train, harness.rank.strategies.none, harness.identity, harness.models;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf'));"
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
