"""The files of a parent-side fault's handshake: the rank's request and the parent's ack.

A rank that reached the (step, phase) of a parent-side fault writes its request
(``harness.rank.faults``) and waits for the ack the fault driver writes (``harness.faults.driver``).
Both sides name the files from here: the rank and the parent share this module, not each other's.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.faults.schedule import FAULTS_DIR


def request_path(run_dir: str | os.PathLike[str], index: int, rank: int) -> Path:
    return Path(run_dir) / FAULTS_DIR / f"request_{index}_rank{rank}.json"


def ack_path(run_dir: str | os.PathLike[str], index: int, rank: int) -> Path:
    return Path(run_dir) / FAULTS_DIR / f"ack_{index}_rank{rank}"
