"""Shared helpers of the harness tests: run `python -m harness` as a user would, find leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

# A model small enough that a test run is dominated by process start-up, not compute.
TINY = ["experiment=smoke", "model.num_layers=2", "model.seq_len=32", "model.batch_size=2", "progress=false"]


def harness_cmd(args: Sequence[str], tmp: Path) -> list[str]:
    return [sys.executable, "-m", "harness", f"index_path={tmp / 'index.csv'}", *args]


def harness_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def run_harness(args: Sequence[str], tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the harness with cwd=tmp, so its default outputs/ would land in tmp."""
    return subprocess.run(
        harness_cmd(args, tmp), cwd=tmp, env=harness_env(), capture_output=True, text=True, timeout=timeout
    )


def start_harness(args: Sequence[str], tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        harness_cmd(args, tmp), cwd=tmp, env=harness_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def worker_processes(marker: str) -> list[psutil.Process]:
    """Live rank processes whose command line mentions ``marker`` (e.g. the test's tmp dir): workers, the
    replacement template and the replacements it forked (their command line is the template's)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if ("harness.rank.worker" in cmd or "harness.rank.template" in cmd) and marker in cmd:
            found.append(proc)
    return found


def read_row(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["row"]
