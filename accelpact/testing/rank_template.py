"""Session ranks forked from one preloaded process instead of each started from scratch.

A session rank started with ``python rank.py`` spends seconds importing torch, FSDP, transformers and
the runner before it joins the session (docs/design.md's module table has the figure). A *template* pays for those imports once
and then forks every later rank: ``accelpact.run``'s own script template (``accelpact.run.script_template``,
which a user's replacement ranks come from, so the fork path the suite uses is the product's) runs
``accelpact.testing.rank`` as ``__main__`` in each child, with the rank's environment, directory and log.

Opt-in (:func:`accelpact.testing.session.use_template`): the test suite turns it on; benchmarks that
time start-up do not. A session's ranks are spawned the old way when the template cannot serve it; the
reason is logged and kept in ``Session.started``:

- its ranks must import another tree first (``pythonpath``, a before/after benchmark) or get extra
  environment (``env_extra``), which a preloaded process has already read at import;
- the session's ``PYTHONPATH``, directory or interpreter differ from the template's;
- the template refused the fork (it has more than one thread), died, or does not answer
  (``accelpact.run.template.TemplateUnavailable``); it is then closed and not used again.

Why a fork is safe here is ``accelpact.run.forkserver``'s argument: the template never starts a thread,
and checks before each fork.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from accelpact.run.template import ForkedRank, TemplateClient, TemplateUnavailable, start_script_template

__all__ = ["RankTemplate", "ENTRY_MODULE"]

ENTRY_MODULE = "accelpact.testing.rank"


class RankTemplate:
    """One template process for session ranks, started at the first session that can use it."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self.preload = [ENTRY_MODULE, *preload]
        self.client: TemplateClient | None = None
        self.key: tuple[str, str, str] | None = None  # (PYTHONPATH, cwd, interpreter) it was started with
        self.broken: str = ""  # why it is not used any more
        self.log_path: Path | None = None

    def why_not(self, env: Mapping[str, str], cwd: str, extra: bool) -> str:
        """Why a session with this environment cannot be forked ('' when it can)."""
        if self.broken:
            return f"the template is not used any more: {self.broken}"
        if extra:
            return "the session sets pythonpath or env_extra, which the template's imports did not see"
        key = (env.get("PYTHONPATH", ""), cwd, sys.executable)
        if self.key is not None and key != self.key:
            return f"the template was started with PYTHONPATH, cwd, interpreter {self.key}; this session has {key}"
        return ""

    def fork(self, env: Mapping[str, str], cwd: str, cfg_path: Path, log_path: Path) -> ForkedRank:
        """A rank process running ``accelpact.testing.rank <cfg_path>``; TemplateUnavailable if it cannot."""
        if self.client is None:
            self._start(env, cwd)
        assert self.client is not None
        try:
            return self.client.fork(
                {
                    "env": dict(env),
                    "cwd": cwd,
                    "netns": None,
                    "log": str(log_path),
                    "entry": {"script": None, "module": ENTRY_MODULE, "args": [str(cfg_path)]},
                }
            )
        except TemplateUnavailable as exc:
            self.broken = f"{exc} (its log: {self.log_path})"
            self.close()
            raise TemplateUnavailable(self.broken) from exc

    def _start(self, env: Mapping[str, str], cwd: str) -> None:
        entry = {"script": None, "module": ENTRY_MODULE, "args": [], "preload": self.preload}
        fd, name = tempfile.mkstemp(prefix="accelpact-rank-template-", suffix=".log")
        self.log_path = Path(name)
        try:  # the template dies with this process (ACCELPACT_AGENT_PID), its ranks with the template
            self.client = start_script_template(
                sys.executable, entry, dict(env, ACCELPACT_AGENT_PID=str(os.getpid())), stderr=fd, cwd=cwd
            )
        finally:
            os.close(fd)
        self.key = (env.get("PYTHONPATH", ""), cwd, sys.executable)

    def close(self) -> None:
        """End the template (children still running are killed with it)."""
        if self.client is not None:
            self.client.close()
            self.client = None
