"""One node's agent of ``accelpact.run``: the node's ranks, the control store, deaths, heals and restarts.

What an agent does (docs/launcher.md):

- **Store.** The agent of node 0 hosts a TCPStore on ``--master-addr:--master-port`` (port 0: a free one,
  single node only); the others connect to it. Every rank uses it for its process group's rendezvous
  (``TORCHELASTIC_USE_AGENT_STORE=True``, as under torchrun) and as accelpact's control channel. The
  agents coordinate through keys under ``accelpact-run/<run id>/``.
- **Start.** ``--nproc-per-node`` rank processes, each in its own session (``killpg`` reaches whatever it
  starts), with torchrun's and accelpact's environment (accelpact.run.env). Unless
  ``--replacement=spawn|none``, also one template process (accelpact.run.script_template).
- **A rank dies** (its exit code is not 0): the agent writes the death notice with the dead pid
  (``accelpact.detection.liveness.publish_death``), so survivors stop waiting for it within a poll. A rank killed by
  a signal is replaced, within ``--max-replacements``: one new process for that rank only, forked from
  the template, or taken by an idle hot spare (``--hot-spares``: accelpact.run.spare), or spawned when
  the template cannot fork (the reason is printed), with
  ``ACCELPACT_REPLACEMENT`` set; the survivors keep running and heal it in memory. Any other death (an
  exit code of its own: it would fail again; the budget spent; ``--replacement=none``) gets
  ``publish_no_replacement`` with the reason, and a group restart.
- **Group restart** (the heal is impossible): every agent stops its ranks, and all start attempt n + 1
  with ``TORCHELASTIC_RESTART_COUNT=n+1`` and a new job token; the script restores the newest snapshot
  every rank holds (``accelpact.snapshot.restore_latest``). Within ``--max-restarts``, else the job fails
  with the reason.
- **A rank that ended the run** (its guard wrote the closed mark: ``guard.finish()``, then ``close()``) is
  never replaced, whatever its exit: an exit by a signal after the mark is reported and counts as done
  (its training is complete); an exit code of its own after it fails the job without a restart (nothing
  is left to train; the script failed after training).
- **End.** The job succeeds when every rank of every node exited 0 or ended the run; node 0's agent keeps
  the store up until every other agent has seen that. Each agent then removes every snapshot of the job on
  its node, under the run's snapshot token and under each attempt's job token.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from accelpact.run.agent_config import AgentConfig
from accelpact.run.attempt import Attempt, note_ended, why_not_replaced
from accelpact.run.env import job_token, snapshot_token, worker_env
from accelpact.run.modules import MODULES_KEY_ENV
from accelpact.run.signals import Interrupted, raise_on_signals
from accelpact.run.template import TemplateClient, TemplateUnavailable, start_script_template
from accelpact.run.workers import HOT_SPARE, Notices, Workers, describe_exit, spawn, start_replacement

__all__ = ["AgentConfig", "Agent", "JobFailed"]

# ACCELPACT_RUN_NO_MODULE_PRELOAD=1: the template preloads the script's top-level imports only (a baseline
# for benchmarks/bench_heal_gpt2.py; the default also preloads what the ranks loaded: accelpact.run.modules).
NO_MODULES_ENV = "ACCELPACT_RUN_NO_MODULE_PRELOAD"
POLL_S = 0.05  # how often the agent reaps its ranks and reads the other agents' keys (torchrun: 0.1 s)


class JobFailed(Exception):
    """The job ended without success; the message says why and what to do."""


class Agent:
    """One node's agent (see the module docstring). ``run()`` returns the exit code of the job."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.store: Any = None
        self.port = cfg.master_port
        self.template: TemplateClient | None = None
        self.replacements = 0
        self.events: list[dict[str, Any]] = []  # what the agent did, also printed

    # -- output -------------------------------------------------------------------------------
    def say(self, msg: str, **event: Any) -> None:
        print(f"accelpact.run[node {self.cfg.node_rank}]: {msg}", file=sys.stderr, flush=True)
        if event:
            self.events.append({"t": time.time(), **event})

    # -- the store ----------------------------------------------------------------------------
    def key(self, *parts: object) -> str:
        return "/".join(["accelpact-run", self.cfg.run_id.replace("/", "_"), *map(str, parts)])

    def connect(self) -> None:
        import torch.distributed as dist

        timeout = timedelta(seconds=self.cfg.join_timeout_s)
        if self.cfg.node_rank == 0:
            self.store = dist.TCPStore(
                self.cfg.master_addr,
                self.cfg.master_port,
                None,
                True,
                timeout=timeout,
                wait_for_workers=False,
                multi_tenant=True,
            )
            self.port = int(self.store.port)
            self.say(f"hosting the store at {self.cfg.master_addr}:{self.port} (run id {self.cfg.run_id})")
        else:
            try:
                self.store = dist.TCPStore(self.cfg.master_addr, self.cfg.master_port, None, False, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - torch raises several kinds; the fix is the same
                raise JobFailed(
                    f"node {self.cfg.node_rank} could not reach the store of node 0 at "
                    f"{self.cfg.master_addr}:{self.cfg.master_port} within {self.cfg.join_timeout_s:g} s "
                    f"({exc}); start node 0's agent, and check --master-addr/--master-port"
                ) from exc

    def _peek(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None

    def _count(self, key: str) -> int:
        return int(self.store.add(key, 0))

    # -- processes ----------------------------------------------------------------------------
    def _env(
        self, local_rank: int, attempt: int, replacement_of: tuple[int, int, float] | None = None
    ) -> dict[str, str]:
        root = self.cfg.snapshot_root.replace("%n", str(self.cfg.node_rank)) if self.cfg.snapshot_root else None
        env = worker_env(
            self.cfg.place(local_rank),
            master_addr=self.cfg.master_addr,
            master_port=self.port,
            run_id=self.cfg.run_id,
            attempt=attempt,
            max_restarts=self.cfg.max_restarts,
            snapshot_root=root,
            replacement_of=replacement_of,
        )
        env["ACCELPACT_AGENT_PID"] = str(os.getpid())
        env.pop(MODULES_KEY_ENV, None)
        return env

    def _modules_key(self, attempt: int) -> str:
        return self.key("modules", attempt, self.cfg.node_rank)

    def _argv(self) -> list[str]:
        head = [self.cfg.python, "-u"] + (["-m"] if self.cfg.module else [])
        return head + list(self.cfg.entry)

    def _log(self, rank: int) -> Path | None:
        if self.cfg.log_dir is None:
            return None
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        return self.cfg.log_dir / f"rank{rank}.log"

    def _spawn(self, local_rank: int, attempt: int, replacement_of: tuple[int, int, float] | None = None) -> Any:
        return spawn(
            self._argv(), self._env(local_rank, attempt, replacement_of), self._log(self.cfg.place(local_rank).rank)
        )

    def _start_spares(self, att: Attempt) -> None:
        """``--hot-spares`` processes running the script, each blocked in ``accelpact.run.replacement()``."""
        from accelpact.run.spare import SPARE_ENV, SPARE_KEY_ENV

        for i in range(self.cfg.hot_spares):
            key = self.key("spare", att.number, self.cfg.node_rank, i)
            env = self._env(0, att.number)
            for var in ("RANK", "LOCAL_RANK", "ROLE_RANK"):  # no rank until assigned: a script reading one early fails
                env.pop(var, None)
            env.update({SPARE_ENV: str(i + 1), SPARE_KEY_ENV: key})
            log_path = self.cfg.log_dir / f"spare{i}.log" if self.cfg.log_dir is not None else None
            if log_path is not None:
                log_path.parent.mkdir(parents=True, exist_ok=True)
            att.spares.append((key, spawn(self._argv(), env, log_path)))

    def _take_spare(self, att: Attempt, local: int, replacement_of: tuple[int, int, float], rank: int) -> Any:
        """An idle spare, assigned ``rank`` (its environment and log go over the store); None when none is left."""
        from accelpact.run.spare import assignment

        while att.spares:
            key, proc = att.spares.pop(0)
            if proc.poll() is not None:  # a spare that died idle: say so, try the next
                self.say(f"hot spare pid {proc.pid} had exited ({describe_exit(proc.returncode)}); not used")
                att.workers.retired.append(proc)
                continue
            log = self._log(rank)
            self.store.set(key, assignment(self._env(local, att.number, replacement_of), str(log) if log else None))
            return proc
        return None

    def _start_template(self) -> None:
        if self.cfg.replacement != "template" or (self.template is not None and self.template.alive()):
            return
        entry = {**self._entry(), "preload": list(self.cfg.preload)}
        out = os.dup(1)  # the agent's stdout becomes the template's and its children's
        try:
            self.template = start_script_template(self.cfg.python, entry, self._env(0, 0), stdout_fd=out)
        finally:
            os.close(out)

    def _entry(self) -> dict[str, Any]:
        return {
            "script": None if self.cfg.module else self.cfg.entry[0],
            "module": self.cfg.entry[0] if self.cfg.module else None,
            "args": list(self.cfg.entry[1:]),
        }

    def _replace(self, att: Attempt, rank: int, code: int) -> None:
        """One new process for dead ``rank`` (forked from the template, else spawned)."""
        local = rank - self.cfg.node_rank * self.cfg.nproc_per_node
        dead = att.procs[rank]
        self.replacements += 1
        t0 = time.time()
        replacement_of = (self.replacements, dead.pid, t0)
        log = self._log(rank)
        template = self.template
        fork = (
            None
            if template is None
            else lambda: template.fork(
                {
                    "env": self._env(local, att.number, replacement_of),
                    "cwd": os.getcwd(),
                    "netns": None,
                    "log": str(log) if log else None,
                    "entry": self._entry(),
                }
            )
        )
        proc, how, why = start_replacement(
            rank,
            lambda: self._take_spare(att, local, replacement_of, rank),
            fork,
            lambda: self._spawn(local, att.number, replacement_of),
            self.say,
        )
        att.workers.replace(rank, proc)
        att.replaced[rank] = att.procs[rank].pid
        how = "hot spare" if how == HOT_SPARE else how
        self.say(
            f"rank {rank} (pid {dead.pid}) exited with code {describe_exit(code)}: replacement "
            f"{self.replacements} started ({how}, pid {att.procs[rank].pid}) while the survivors wait",
            kind="replacement",
            rank=rank,
            dead_pid=dead.pid,
            pid=att.procs[rank].pid,
            start=how,
            template_fallback=why,
            attempt=att.number,
            replacement=self.replacements,
            t_death_seen=t0,
            t_started=time.time(),
        )

    def _start(self, attempt: int) -> Attempt:
        att = Attempt(
            attempt,
            Workers(
                Notices(self.store.set, job_token(self.cfg.run_id, attempt), by="accelpact.run agent (waitpid)"),
                say=self.say,
            ),
        )
        for local in range(self.cfg.nproc_per_node):
            record = local == 0 and self.cfg.replacement == "template" and os.environ.get(NO_MODULES_ENV) != "1"
            extra = {MODULES_KEY_ENV: self._modules_key(attempt)} if record else {}
            att.procs[self.cfg.place(local).rank] = spawn(
                self._argv(), {**self._env(local, attempt), **extra}, self._log(self.cfg.place(local).rank)
            )
        self._start_template()
        self._start_spares(att)
        self.say(
            f"attempt {attempt}: started ranks {sorted(att.procs)} (pids {[p.pid for p in att.procs.values()]})",
            kind="start",
            attempt=attempt,
            pids={r: p.pid for r, p in att.procs.items()},
        )
        return att

    def _stop(self, att: Attempt) -> None:
        """Stop every rank and idle spare of the attempt (accelpact.run.workers.Workers.stop)."""
        att.workers.spares.extend(p for _, p in att.spares)  # idle spares end with the attempt
        att.spares.clear()
        att.workers.stop()

    def _preload_what_ranks_loaded(self, att: Attempt) -> None:
        """Once local rank 0 wrote what it loaded by its first step, the template imports it too
        (accelpact.run.modules): the next replacement pays none of those imports."""
        template = self.template
        if template is None or not template.alive():
            return
        try:
            if att.modules is None:
                raw = self._peek(self._modules_key(att.number))
                if raw is not None:
                    att.modules = template.preload(json.loads(raw))
            elif att.modules >= 0:
                reply = template.reply(att.modules)
                if reply is not None:
                    att.modules = -1
                    self.say(
                        f"template preloaded {reply.get('preloaded', 0)} module(s) the ranks loaded by their "
                        f"first step in {reply.get('import_s', 0):.2f} s ({reply.get('failed', 0)} failed, "
                        f"{reply.get('threads')} thread(s))",
                        kind="template_preload",
                        **reply,
                    )
        except TemplateUnavailable as exc:
            att.modules = -1
            self.say(f"the template could not preload the ranks' modules: {exc}")

    # -- deaths -------------------------------------------------------------------------------
    def _why_not_replaced(self, att: Attempt, rank: int, code: int) -> str | None:
        """None when ``rank`` is to be replaced; else why not (accelpact.run.attempt.why_not_replaced)."""
        return why_not_replaced(self.cfg, att, rank, code, self.replacements, self._peek)

    def _note_ended(self, att: Attempt, exited: dict[int, int]) -> None:
        """Ranks that exited non-zero after ending the run: reported, never replaced, no death notice."""
        for rank, code, step in note_ended(self.cfg, att, exited, self._peek):
            pid = att.procs[rank].pid
            after = "its training is complete" if code < 0 else "its script failed after training"
            self.say(
                f"rank {rank} (pid {pid}) exited with code {describe_exit(code)} after it ended the run at "
                f"step {step} (guard.finish, then close): not replaced; {after}",
                kind="exit_after_end",
                rank=rank,
                pid=pid,
                code=code,
                step=step,
                attempt=att.number,
            )

    def _handle_deaths(self, att: Attempt) -> str | None:
        """Reap this node's ranks (each death's notice written); replace the killed ones. The reason for a
        group restart, or None."""
        _, exited = att.workers.poll()
        self._note_ended(att, exited)
        for rank, code in att.workers.reap(exited).items():
            why = self._why_not_replaced(att, rank, code)
            if why is None:
                self._replace(att, rank, code)
                continue
            notices = cast(Notices, att.workers.notices)  # the agent's workers always have notices (_attempt)
            err = notices.no_replacement(rank, att.procs[rank].pid, why)
            if err is not None:
                self.say(err)
            return why
        return None

    # -- attempts -----------------------------------------------------------------------------
    def _run_attempt(self, attempt: int) -> str | None:
        """Run one attempt to its end: None when every rank of every node succeeded, else the restart reason."""
        att = self._start(attempt)
        restart_key = self.key("restart", attempt)
        done_key = self.key("done", attempt)
        try:
            while True:
                raw = self._peek(restart_key)
                if raw is not None:
                    return raw.decode()
                why = self._handle_deaths(att)
                self._preload_what_ranks_loaded(att)
                if why is not None:
                    self.store.set(restart_key, why.encode())
                    return why
                if not att.done_posted and all(p.poll() == 0 or r in att.ended for r, p in att.procs.items()):
                    failed = {r: c for r, c in att.ended.items() if c > 0}
                    if failed:  # training ended everywhere, the script failed after it: no restart can help
                        raise JobFailed(
                            f"rank(s) {sorted(failed)} ended the run (guard.finish, then close) and then "
                            f"exited with their own code(s) {failed}: training is complete, the script "
                            "failed after it; see their output"
                        )
                    att.done_posted = True
                    self.store.add(done_key, 1)
                    self.say(f"attempt {attempt}: every rank of this node finished", kind="node_done", attempt=attempt)
                if att.done_posted and self._count(done_key) >= self.cfg.nnodes:
                    return None
                time.sleep(POLL_S)
        finally:
            self._stop(att)

    def _barrier(self, name: str, timeout_s: float) -> None:
        """Every agent reaches ``name`` (a counter on the store), or JobFailed after ``timeout_s``."""
        key = self.key("barrier", name)
        self.store.add(key, 1)
        deadline = time.monotonic() + timeout_s
        while self._count(key) < self.cfg.nnodes:
            if time.monotonic() > deadline:
                raise JobFailed(
                    f"the agents did not all reach {name!r} within {timeout_s:g} s "
                    f"({self._count(key)} of {self.cfg.nnodes}): an agent was lost"
                )
            time.sleep(POLL_S)

    def _remove_snapshots(self, attempts: int) -> None:
        """An ended job's snapshots on this node are dead weight in shared memory: remove them, under the
        run's snapshot token and under the job token of each of its ``attempts`` (a script that named its
        snapshots after ``control.job_token``)."""
        from accelpact.snapshot.layout import default_root, remove_job

        root = self._env(0, 0).get("ACCELPACT_SNAPSHOT_ROOT") or default_root()
        tokens = [snapshot_token(self.cfg.run_id), *(job_token(self.cfg.run_id, a) for a in range(attempts))]
        for token in tokens:
            try:
                remove_job(root, token)
            except OSError as exc:
                self.say(f"could not remove this job's snapshots ({token}) under {root}: {exc}")

    def run(self) -> int:
        """Run the job; its exit code (0: every rank succeeded)."""
        attempt = 0
        with raise_on_signals():
            try:
                self.connect()
                self._barrier("start", self.cfg.join_timeout_s)
                while True:
                    why = self._run_attempt(attempt)
                    if why is None:
                        self.say(f"attempt {attempt}: every rank of every node succeeded", kind="success")
                        break
                    if attempt >= self.cfg.max_restarts:
                        raise JobFailed(
                            f"attempt {attempt} failed and --max-restarts={self.cfg.max_restarts} "
                            f"allows no group restart: {why}"
                        )
                    self.say(
                        f"a heal is impossible ({why}): restarting the whole worker group as attempt "
                        f"{attempt + 1} of at most {self.cfg.max_restarts + 1}; it resumes from the newest "
                        "snapshot every rank holds (a rank that finds none raises NoSnapshotToResumeError)",
                        kind="group_restart",
                        attempt=attempt + 1,
                        reason=why,
                    )
                    self._barrier(f"stopped{attempt}", self.cfg.join_timeout_s)
                    attempt += 1
                self._barrier("end", 60.0)  # node 0 keeps the store up until every agent has seen the end
                self._remove_snapshots(attempt + 1)
                return 0
            except JobFailed as exc:
                self.say(f"job failed: {exc}", kind="failed", reason=str(exc))
                self._remove_snapshots(attempt + 1)  # no later attempt will read them
                return 1
            except Exception as exc:  # noqa: BLE001 - e.g. node 0's store gone: say so, stop the ranks
                self.say(f"job failed: the agent hit {type(exc).__name__}: {exc}", kind="failed", reason=str(exc))
                return 1
            except Interrupted as exc:
                self.say(f"interrupted by {exc}: stopped every rank of this node", kind="interrupted")
                return 130
            finally:
                if self.template is not None:
                    self.template.close()
                    self.template = None
