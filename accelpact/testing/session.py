"""The multi-rank session: N real gloo ranks over 127.0.0.1 running the caller's scenarios.

:func:`run_session` hosts the out-of-band control store in the calling process (which no injected
fault touches), starts one rank process (:mod:`accelpact.testing.rank`) per rank (forked from a
preloaded template after :func:`use_template`, see :mod:`accelpact.testing.rank_template`), waits, and returns
a :class:`Session` with every rank's per-scenario results, exit codes and log tails. The ranks run
the caller's scenarios through the caller's own *scenario runner*, named by an import path
``"package.module:function"`` (see :mod:`accelpact.testing.rank`): the scenarios and what a rank
does with them stay with each caller, so tests, experiments and benchmarks share this launcher
without sharing (and weakening) each other's cases.

Files in ``out_dir``: ``config.rank{r}.json`` (what rank r was told), ``log.rank{r}.txt`` (its
stdout and stderr), ``results.rank{r}.json`` (scenario name -> result, rewritten after every
scenario so a crash keeps what came before) and whatever the runner saves, by convention
``{scenario}.rank{r}.pt`` for :meth:`Session.tensors` and :mod:`accelpact.testing.compare`.

The calling process only hosts a store and reads JSON: nothing here imports a model library, and
torch.load is imported only by :meth:`Session.tensors`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from accelpact.run.template import TemplateUnavailable
from accelpact.testing.rank_template import RankTemplate

_log = logging.getLogger("accelpact.testing")

__all__ = [
    "Session",
    "SessionError",
    "run_session",
    "default_timeout_s",
    "load_average",
    "use_template",
    "stop_template",
]

# Seconds a rank needs to start (interpreter, torch and the caller's imports, the gloo rendezvous)
# on a loaded 2-core host, and per scenario step, per rank sharing those cores. Only a hang should
# ever reach the resulting timeout; it exists so that a hang fails with the log tails, not forever.
_STARTUP_S = 60.0
_PER_SCENARIO_S = 20.0
_PER_STEP_S = 4.0
_LOG_TAIL = 4000
_RANK_ENTRY = Path(__file__).resolve().with_name("rank.py")
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


class SessionError(RuntimeError):
    """A rank failed: its exit code was not 0, it did not finish a scenario, or a scenario raised."""


@dataclass
class Session:
    """What one multi-rank session produced. ``results[rank][scenario]`` is that rank's result dict."""

    out_dir: Path
    world_size: int
    results: list[dict[str, Any]]
    returncodes: list[int]
    logs: list[str] = field(default_factory=list)  # the last few KB of each rank's log
    wall_s: float = 0.0
    timed_out: bool = False
    started: str = ""  # "forked from the template", or "spawned: " and why (accelpact.testing.rank_template)

    def result(self, scenario: str, rank: int) -> dict[str, Any] | None:
        """Rank ``rank``'s result of ``scenario``, or None if it never finished that scenario."""
        return self.results[rank].get(scenario)

    def job(self, scenario: str) -> list[dict[str, Any]]:
        """Every rank's result of ``scenario``; SessionError naming the rank and its error if one failed."""
        out = []
        for rank in range(self.world_size):
            res = self.result(scenario, rank)
            if res is None:
                raise SessionError(
                    f"rank {rank} did not finish scenario {scenario!r} (exit code "
                    f"{self.returncodes[rank]}); log tail:\n{self.logs[rank]}"
                )
            if res.get("error"):
                err = res["error"]
                raise SessionError(
                    f"rank {rank}, scenario {scenario!r}: {err['type']}: {err['message']}\n{err.get('traceback', '')}"
                )
            out.append(res)
        return out

    def tensors(self, scenario: str, rank: int) -> dict[str, Any]:
        """What rank ``rank`` saved for ``scenario`` (``{scenario}.rank{rank}.pt``)."""
        import torch  # lazily: a launcher that only reads JSON never pays for it

        saved: dict[str, Any] = torch.load(self.out_dir / f"{scenario}.rank{rank}.pt", weights_only=True)
        return saved

    def check(self, allowed_to_fail: Sequence[int] = ()) -> Session:
        """Raise SessionError for the first rank (outside ``allowed_to_fail``) that exited non-zero."""
        for rank, code in enumerate(self.returncodes):
            if code != 0 and rank not in allowed_to_fail:
                why = "killed at the session timeout" if self.timed_out else f"exit code {code}"
                raise SessionError(
                    f"rank {rank} of {self.world_size} failed ({why}); see "
                    f"{self.out_dir / f'log.rank{rank}.txt'}. Log tail:\n{self.logs[rank]}"
                )
        return self


_TEMPLATE: RankTemplate | None = None


def use_template(preload: Sequence[str] = ()) -> None:
    """Fork the ranks of later sessions from one preloaded process (accelpact.testing.rank_template).

    ``preload``: modules the runners import (e.g. the model code), imported once in the template. The
    template starts with the first session that can use it and ends at :func:`stop_template` (or with
    this process). A session it cannot serve spawns its ranks as before."""
    global _TEMPLATE
    stop_template()
    _TEMPLATE = RankTemplate(preload)


def stop_template() -> None:
    """End the template; later sessions spawn their ranks."""
    global _TEMPLATE
    if _TEMPLATE is not None:
        _TEMPLATE.close()
        _TEMPLATE = None


def default_timeout_s(scenarios: Sequence[Mapping[str, Any]], world_size: int) -> float:
    """A session timeout that grows with the work: start-up, scenarios and steps, scaled by how many
    ranks share the host's cores (every rank runs every step)."""
    cores = os.cpu_count() or 1
    crowding = max(1.0, world_size / cores)
    steps = sum(int(sc.get("steps", 1)) for sc in scenarios)
    return _STARTUP_S * crowding + (_PER_SCENARIO_S * len(scenarios) + _PER_STEP_S * steps) * crowding


def load_average() -> list[float]:
    """The host's 1, 5 and 15 minute load averages, rounded (recorded beside timing figures)."""
    return [round(x, 2) for x in os.getloadavg()]


def run_session(
    out_dir: Path,
    runner: str,
    scenarios: Sequence[Mapping[str, Any]],
    *,
    world_size: int = 2,
    settings: Mapping[str, Any] | None = None,
    pg_timeout_s: float = 120.0,
    control_deadline_s: float = 60.0,
    timeout_s: float | None = None,
    barrier: bool = False,
    pythonpath: Sequence[Path | str] = (),
    env_extra: Mapping[str, str] | None = None,
    check: bool = True,
    allowed_to_fail: Sequence[int] = (),
    control_addr: tuple[str, int] | None = None,
    spawn: bool = False,
) -> Session:
    """Run ``scenarios`` on ``world_size`` gloo ranks, each through ``runner`` ("module:function").

    ``settings`` reach every scenario unchanged (e.g. the FSDP flavour); ``barrier`` makes every rank
    wait for the others before each scenario (start-up skew must not look like a hang to a short
    timeout). ``timeout_s`` bounds the whole session (default: :func:`default_timeout_s`); ranks
    still running then are killed. ``pythonpath`` entries go first on the ranks' PYTHONPATH (e.g. an
    older accelpact to compare with). With ``check`` a rank that exited non-zero, other than those in
    ``allowed_to_fail`` (a rank a scenario kills on purpose), raises SessionError naming it.
    ``control_addr``: a control store the caller hosts elsewhere (e.g. in a process a test kills)
    instead of one in this process. ``spawn``: start every rank from scratch even after
    :func:`use_template` (a case that depends on what a fresh interpreter has not imported yet).
    """
    from accelpact.control import new_job_token, start_control_server

    if ":" not in runner:
        raise ValueError(
            f"runner {runner!r} must be 'package.module:function', e.g. 'experiments.workloads.fsdp_scenarios:run'"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if timeout_s is None:
        timeout_s = default_timeout_s(scenarios, world_size)
    # The caller's working directory (where its runner module is importable from), then the tree
    # this accelpact came from; ``pythonpath`` first, so that it wins over both.
    here = os.getcwd()
    path = os.pathsep.join(dict.fromkeys([*map(str, pythonpath), here, str(_SOURCE_ROOT)]))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1", **(env_extra or {}))
    server, port = start_control_server() if control_addr is None else (None, int(control_addr[1]))
    host = "127.0.0.1" if control_addr is None else control_addr[0]
    token = new_job_token()
    procs: list[Any] = []  # Popen, or ForkedRank from the template
    logs = []
    why_spawn = (
        "no template (use_template was not called)"
        if _TEMPLATE is None
        else "the caller asked for fresh processes (spawn=True)"
        if spawn
        else _TEMPLATE.why_not(env, here, extra=bool(pythonpath) or env_extra is not None)
    )
    t0 = time.time()
    try:
        for rank in range(world_size):
            cfg = {
                "rank": rank,
                "world_size": world_size,
                "host": host,
                "port": port,
                "job_token": token,
                "out_dir": str(out_dir),
                "pg_timeout_s": pg_timeout_s,
                "control_deadline_s": control_deadline_s,
                "runner": runner,
                "settings": dict(settings or {}),
                "barrier": barrier,
                "scenarios": [dict(sc) for sc in scenarios],
            }
            cfg_path = out_dir / f"config.rank{rank}.json"
            cfg_path.write_text(json.dumps(cfg))
            log = open(out_dir / f"log.rank{rank}.txt", "w")
            logs.append(log)
            if not why_spawn:
                try:
                    template = cast(RankTemplate, _TEMPLATE)  # why_spawn is set when there is none
                    procs.append(template.fork(env, here, cfg_path, out_dir / f"log.rank{rank}.txt"))
                    continue
                except TemplateUnavailable as exc:
                    why_spawn = f"the template failed: {exc}"
                    _log.warning("session %s: spawning rank %d on: %s", out_dir, rank, why_spawn)
            # By file, not ``-m``: with an older accelpact first on the path (``pythonpath``), the
            # entry point must still be this one, while everything it imports comes from there.
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(_RANK_ENTRY), str(cfg_path)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=here,
                )
            )
        codes, timed_out = _wait_all(procs, time.time() + timeout_s)
    finally:
        for p in procs:  # only reached alive on an exception here (e.g. KeyboardInterrupt)
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
        del server  # the store lives exactly as long as the ranks need it
    results = []
    for rank in range(world_size):
        res_path = out_dir / f"results.rank{rank}.json"
        results.append(json.loads(res_path.read_text()) if res_path.exists() else {})
    tails = [(out_dir / f"log.rank{r}.txt").read_text(errors="replace")[-_LOG_TAIL:] for r in range(world_size)]
    started = "spawned: " + why_spawn if why_spawn else "forked from the template"
    session = Session(out_dir, world_size, results, codes, tails, time.time() - t0, timed_out, started)
    return session.check(allowed_to_fail) if check else session


def _wait_all(procs: list[Any], deadline: float) -> tuple[list[int], bool]:
    """Exit codes of every process; those still running at ``deadline`` are killed (and flagged).

    Before the kill, every live rank gets SIGUSR1, on which it writes the Python stack of each of its
    threads to its log (see ``rank.py``): a hang then names the call it hung in.
    """
    codes: list[int] = []
    timed_out = False
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            if not timed_out:
                _dump_stacks(procs)
            timed_out = True
            p.kill()
            codes.append(p.wait())
    return codes, timed_out


def _dump_stacks(procs: list[Any], wait_s: float = 2.0) -> None:
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            p.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            pass
    if live:
        time.sleep(wait_s)  # faulthandler writes from a signal handler: a moment is plenty
