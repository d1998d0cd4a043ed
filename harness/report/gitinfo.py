"""Which code produced a result: the checkout's HEAD sha and whether the code differs from it.

The one place results rows (``harness.report.results``) and experiment provenance
(``experiments.provenance``) ask git. Standard library only, so either can import it cheaply.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(repo: Path = REPO_ROOT, exclude: Sequence[str] = ()) -> tuple[str | None, bool | None]:
    """(HEAD sha, dirty) of ``repo``; (None, None) outside a git checkout.

    Dirty means a tracked file differs from HEAD, leaving out the paths in ``exclude`` (e.g.
    ``results``, which the experiments themselves rewrite: a clean clone running ``make reproduce``
    must not call its own later results dirty)."""
    sha = _git(repo, "rev-parse", "HEAD")
    if sha is None:
        return None, None
    status = _git(
        repo, "status", "--porcelain", "--untracked-files=no", "--", ".", *(f":(exclude){p}" for p in exclude)
    )
    return sha, None if status is None else bool(status)
