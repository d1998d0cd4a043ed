"""The parent process's hold on the ranks of one run: control store, rank processes, polling, teardown.

``Launcher`` owns the processes of one run:
- ``start_control_store()`` hosts the long-lived TCPStore (the out-of-band control channel; ranks
  get ``ACCELPACT_CONTROL_ADDR``, a random ``ACCELPACT_JOB_TOKEN`` per incarnation and one
  ``ACCELPACT_SNAPSHOT_TOKEN`` for the whole run),
- ``start_ranks(incarnation)`` starts ``world_size`` ``python -m harness.rank.worker`` processes, each in
  its own session (process group) so it can be killed with everything it started,
- ``poll()`` reports exits and writes a death notice (accelpact.detection.liveness) for each rank that failed, so
  survivors stop waiting for it within milliseconds, not at their control deadline,
- ``kill_all()`` tears down every rank (SIGTERM, then SIGKILL),
- ``signal_rank()`` is for parent-side faults (SIGSTOP / SIGKILL a rank at a step),
- ``step_hooks`` are called with every rank-0 step event (fault schedules, relaunch policies).
A relaunch (``harness.parent.run``, following the strategy's policy) is ``kill_all`` + ``start_ranks(n+1)``.
A heal (``replace_dead``: the strategy heals a lost rank in memory) is ``harness.parent.replacements``: one
new process (or a hot spare) for the dead rank only, under the same job token, while the survivors wait.

The rank processes themselves (start in a session, reap, death notices, replacement order, teardown) are
``accelpact.run.workers``, the same code ``accelpact.run``'s agent runs users' scripts with; this module
adds the harness's part: the control store of a benchmark run, network-namespace hosts, srun, parent-side
fault hooks and the strategies' policies.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from accelpact.run import Notices, Workers, describe_exit, raise_on_signals, spawn
from harness.contract import SNAPSHOT_TOKEN, RankEnv
from harness.events import Step, events_path
from harness.machine import usable_cores
from harness.parent.launch_start import SPAWN, TEMPLATE, is_shared, launch_method, shared_template
from harness.parent.progress import EventTailer, Progress
from harness.parent.replacements import SparePool, replace_the_dead
from harness.parent.template import ReplacementTemplate, TemplateUnavailable
from harness.schema import RankLaunch, RunConfig
from harness.slurm_env import srun_argv

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = "logs"
POLL_S = 0.05


class Interrupted(Exception):
    """The parent got SIGINT / SIGTERM / SIGHUP."""


@dataclass
class PollResult:
    running: list[int]
    exited: dict[int, int]  # rank -> exit code (negative: killed by that signal)

    @property
    def failed(self) -> dict[int, int]:
        return {r: c for r, c in self.exited.items() if c != 0}

    @property
    def all_ok(self) -> bool:
        return not self.running and not self.failed


@dataclass
class Outcome:
    status: str  # "ok" | "failed"
    reason: str = ""
    failed_rank: int | None = None
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)
    interrupted: bool = False


@dataclass
class LaunchPlan:
    """Everything the parent decides about how the ranks of one run start and are watched, given to the
    ``Launcher`` at once (``harness.parent.run`` builds it from the cluster, the fault and the strategy).

    Where the ranks run: ``control`` (the control store's address; None: the launcher hosts one,
    ``start_control_store()``), ``store_set`` (setting a key on a store hosted elsewhere), and inside
    network namespaces the per-rank ``rank_env``, ``wrap`` (``ip netns exec``) and ``netns_of``, and
    ``store_netns``: the namespace where a strategy's own server (NVRx's store) must run, on the control
    store's host address, for every rank to reach it (None: the parent's namespace reaches them).
    ``extra_env``: for every rank. The strategy's part: ``settle_s`` (after the first failure, how long
    the others may finish on their own), ``replace_dead`` (heal in memory: start a replacement for a dead
    rank, at most ``max_replacements`` per run) with ``on_replace`` (the parent's event of each one),
    ``hot_spares`` and ``template_wanted`` (replacements forked from a preloaded process).
    ``tick_hooks``: called on every poll (parent-side faults)."""

    control: tuple[str, int] | None = None
    store_set: Callable[[str, bytes], None] | None = None
    rank_env: Callable[[int], dict[str, str]] | None = None
    wrap: Callable[[int, list[str]], list[str]] | None = None
    netns_of: Callable[[int], str] | None = None
    store_netns: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    settle_s: float = 0.0
    replace_dead: Callable[[int, int, dict[int, int | None]], bool] | None = None
    max_replacements: int = 0
    on_replace: Callable[[dict[str, Any]], None] | None = None
    hot_spares: int = 0
    template_wanted: bool = False
    tick_hooks: list[Callable[[], None]] = field(default_factory=list)


class Launcher:
    replacements: int  # replacement processes started in this run (set in __init__)

    def __init__(
        self,
        run: RunConfig,
        run_dir: Path,
        spec_path: Path,
        plan: LaunchPlan | None = None,
        python: str = sys.executable,
    ) -> None:
        plan = plan if plan is not None else LaunchPlan()
        self.run = run
        self.run_dir = Path(run_dir)
        self.spec_path = spec_path
        self.python = python
        self.token = secrets.token_hex(16)
        # The snapshots' token: the same in every incarnation (the job token is not), so that relaunched ranks
        # find the snapshots the previous incarnation left in shared memory (ACCELPACT_SNAPSHOT_TOKEN).
        self.snapshot_token = f"snap-{secrets.token_hex(8)}"
        self.store: Any = None
        self.workers = Workers()  # this incarnation's rank processes (accelpact.run.workers)
        self.incarnation = 0
        self.step_hooks: list[Callable[[Step], None]] = []
        # Called on every poll (parent-side fault injection).
        self.tick_hooks: list[Callable[[], None]] = list(plan.tick_hooks)
        # One reader for the whole run: rank 0 appends to the same events file in every incarnation,
        # and a fresh reader per wait() would hand the previous incarnation's steps out again.
        self._tailer: EventTailer | None = None
        # After the first rank failure, wait this long for the others to exit on their own (accelpact's
        # survivors write their fallback event before exiting) before tearing everything down.
        self.settle_s = plan.settle_s
        # Extra environment for every rank (NVRx's store port), and per-rank environment and command
        # wrapping (network namespaces: the topology's control store and `ip netns exec`).
        self.extra_env: dict[str, str] = dict(plan.extra_env)
        self.rank_env_fn = plan.rank_env
        self.wrap_fn = plan.wrap
        self.control = plan.control  # None: start_control_store() hosts one here
        # How to set a key on the control store when it is not hosted here (network namespaces).
        self.store_set_fn = plan.store_set
        self._first_failure: tuple[int, int] | None = None
        # Heal in memory: (rank, exit code, every rank's exit code) -> start a replacement for that rank?
        # None: a failure ends the incarnation (the strategy's relaunch policy decides what follows).
        self.replace_dead: Callable[[int, int, dict[int, int | None]], bool] | None = None
        if plan.replace_dead is not None:
            policy, most = plan.replace_dead, plan.max_replacements
            self.replace_dead = lambda rank, code, codes: self.replacements < most and policy(rank, code, codes)
        self.on_replace = plan.on_replace  # parent-side event of each one
        self.replacements = 0  # replacement processes started in this run
        self.spares = SparePool(plan.hot_spares)  # hot spares (harness.parent.replacements)
        # Replacements forked from a preloaded process (harness.parent.template): set template_wanted before
        # start_ranks; netns_of names a rank's network namespace (namespace hosts) for the forked child.
        self.template_wanted = plan.template_wanted
        self.template: ReplacementTemplate | None = None
        # How the current launch's ranks started (harness.parent.launch_start), and why not from the template.
        self.launched_by, self.launch_why = SPAWN, ""
        self.first_launch = ""  # how incarnation 0 started (the results row's first_launch)
        self.netns_of = plan.netns_of
        self.store_netns = plan.store_netns  # where a strategy hosts a server its namespaced ranks reach
        # Called with the incarnation before its ranks start (state a relaunched world must not share: NVRx's store).
        self.before_start: list[Callable[[int], None]] = []

    @property
    def procs(self) -> dict[int, Any]:
        """rank -> its current process (a Popen, or a ForkedRank from the replacement template)."""
        return self.workers.procs

    def store_setter(self) -> Callable[[str, bytes], None] | None:
        """How to set a key on the control store: the hosted store's ``set``, or ``LaunchPlan.store_set``
        for one hosted elsewhere (network namespaces); None when there is neither."""
        return self.store.set if self.store is not None else self.store_set_fn

    def notices(self) -> Notices | None:
        """Where this incarnation's death notices go (None: no store to write them to)."""
        fn = self.store_setter()
        return None if fn is None else Notices(fn, self.token, by="harness parent (waitpid)")

    # -- control channel ---------------------------------------------------------------------
    def start_control_store(self) -> None:
        import torch.distributed as dist  # lazy: torch

        # Port 0: the kernel picks a free port, no race with other runs or tests.
        self.store = dist.TCPStore(
            self.run.cluster.master_addr,
            0,
            None,
            True,
            timeout=timedelta(seconds=self.run.cluster.pg_timeout_s),
            wait_for_workers=False,
        )

    @property
    def control_port(self) -> int:
        if self.control is not None:
            return self.control[1]
        return int(self.store.port)

    @property
    def control_host(self) -> str:
        return self.control[0] if self.control is not None else self.run.cluster.master_addr

    # -- ranks -------------------------------------------------------------------------------
    def rank_environ(self, rank: int, incarnation: int, t_launch: float, replacement: int = 0) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RankEnv(
                rank=rank,
                world_size=self.run.cluster.world_size,
                local_rank=rank,
                control_host=self.control_host,
                control_port=self.control_port,
                token=self.token,
                incarnation=incarnation,
                t_launch=t_launch,
                parent_pid=os.getpid(),
                replacement=replacement,
            ).to_environ()
        )
        env[SNAPSHOT_TOKEN] = self.snapshot_token
        ranks_here = max(1, self.run.cluster.world_size // max(self.run.cluster.nodes, 1))
        threads = max(1, usable_cores() // ranks_here)
        env.update(
            {
                "HF_HUB_OFFLINE": "1",  # never a hub download, even by accident
                "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": str(threads),
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
            }
        )
        # c10d's TCPStore client logs each failed request as a C++ warning carrying the full C++ backtrace
        # ("Exception raised from ... frame #0 ..."): a dead control store printed 2-3 of those per rank on
        # top of accelpact's one line. The same text reaches Python as the exception accelpact reports
        # (and keeps as the cause), so warnings are off unless the user asks: TORCH_CPP_LOG_LEVEL=WARNING.
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        env.update(self.extra_env)
        if self.rank_env_fn is not None:
            env.update(self.rank_env_fn(rank))
        return env

    def start_ranks(self, incarnation: int) -> None:
        if self.store is None and self.control is None:
            raise RuntimeError("start_control_store() before start_ranks()")
        if incarnation > 0:
            # A fresh token per incarnation: the relaunched ranks rendezvous on never-used store keys,
            # and a straggler of the previous incarnation cannot join them.
            self.token = secrets.token_hex(16)
        self.incarnation = incarnation
        self._first_failure = None
        self.workers = Workers(self.notices(), say=lambda msg: print(f"launcher: {msg}", file=sys.stderr, flush=True))
        for hook in self.before_start:
            hook(incarnation)
        (self.run_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
        t_launch = time.time()
        if self.run.cluster.launch == RankLaunch.srun:
            self._start_srun(incarnation, t_launch)
            return
        how, self.launch_why = launch_method(
            incarnation, self.run.cluster.first_launch, self.run.cluster.launch, self.wrap_fn is not None
        )
        shared = shared_template(self) if how == TEMPLATE else None
        for rank in range(self.run.cluster.world_size):
            self.procs[rank] = self._start_rank(rank, incarnation, t_launch, shared)
        self.launched_by = how if shared is not None and not self.launch_why else SPAWN
        if incarnation == 0:
            self.first_launch = self.launched_by
        self.spares.start(self, incarnation)
        if self.template_wanted and (self.template is None or not self.template.alive()):
            if self.template is not None and not is_shared(self.template):
                self.template.close()
            # The run's shared template forks its replacements too; without one, a template of its own.
            self.template = shared if shared is not None else ReplacementTemplate.start(self)

    def _start_rank(self, rank: int, incarnation: int, t_launch: float, template: ReplacementTemplate | None) -> Any:
        """``rank``'s process of this launch: forked from ``template`` when given and usable, else spawned."""
        if template is not None:
            env = self.rank_environ(rank, incarnation, t_launch)
            try:
                return template.fork(env, self.spec_path, self.log_path(rank), os.getcwd(), None)
            except TemplateUnavailable as exc:
                self.launch_why = f"the template was unusable ({exc})"
                print(f"launcher: {self.launch_why}: spawning rank {rank}", file=sys.stderr, flush=True)
        return self.spawn(rank, incarnation, t_launch)

    def spawn(self, rank: int, incarnation: int, t_launch: float, replacement: int = 0) -> subprocess.Popen[bytes]:
        """A fresh ``harness.rank.worker`` process for ``rank`` in its own session (not yet in ``procs``)."""
        argv = [self.python, "-m", "harness.rank.worker", str(self.spec_path)]
        if self.wrap_fn is not None:
            argv = self.wrap_fn(rank, argv)
        return spawn(
            argv, self.rank_environ(rank, incarnation, t_launch, replacement), self.log_path(rank), cwd=os.getcwd()
        )

    def _start_srun(self, incarnation: int, t_launch: float) -> None:
        """Every rank as a task of one ``srun`` step across the allocation (harness.slurm_env).

        The tasks number themselves from Slurm (SLURM_PROCID ...), so the environment carries no RANK. Each
        rank's entry in ``procs`` is the one srun process: srun exits when its last task does, so a failure
        shows once every rank has ended, with srun's exit code (the worst task's)."""
        env = self.rank_environ(0, incarnation, t_launch)
        # No parent pid either: a task's parent is slurmstepd, not this process (the rank's die-with-parent
        # check would end it at once); the step ends with the allocation or with kill_all's signal to srun.
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HARNESS_PARENT_PID"):
            env.pop(key, None)
        argv = srun_argv(
            self.run.cluster, [self.python, "-m", "harness.rank.worker", str(self.spec_path)], self.run_dir / LOG_DIR
        )
        with open(self.run_dir / LOG_DIR / "srun.log", "ab") as log:  # srun's own messages
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=os.getcwd(),
            )
        self.procs.update({rank: proc for rank in range(self.run.cluster.world_size)})

    def log_path(self, rank: int) -> Path:
        return self.run_dir / LOG_DIR / f"rank{rank}.log"

    def poll(self) -> PollResult:
        """Every rank's state now; each newly failed rank's death notice is written (Workers.reap)."""
        running, exited = self.workers.poll()
        self.workers.reap(exited)
        failed = {r: c for r, c in exited.items() if c != 0}
        if failed and self._first_failure is None:
            # Several may die in one poll (a killed rank takes its peers down): prefer the one a
            # signal killed, then the lowest rank, as the origin.
            rank = min(failed, key=lambda r: (failed[r] >= 0, r))
            self._first_failure = (rank, failed[rank])
        return PollResult(running, exited)

    def signal_rank(self, rank: int, sig: int) -> None:
        """Send ``sig`` to rank ``rank``'s process group (parent-side faults: SIGSTOP, SIGKILL)."""
        self.workers.signal(rank, sig)

    def kill_all(self) -> None:
        """Stop every rank, retired process and hot spare (Workers.stop: SIGTERM, then SIGKILL; reaped)."""
        self.workers.spares.extend(p for p in self.spares.all_procs() if p not in self.procs.values())
        self.workers.stop()
        self.spares.clear()

    def last_log_lines(self, rank: int, n: int = 15) -> list[str]:
        try:
            lines = self.log_path(rank).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        return [line for line in lines if line.strip()][-n:]

    def close(self) -> None:
        self.kill_all()
        if self.template is not None and not is_shared(self.template):
            self.template.close()  # after kill_all: it reports the exits of the replacements it forked
        self.template = None
        self.store = None  # the server thread stops when the last reference goes

    # -- the main loop -----------------------------------------------------------------------
    def wait(self, progress: Progress | None = None) -> Outcome:
        """Follow rank 0's events until every rank exits or one fails; then tear down on failure."""
        if self._tailer is None:
            self._tailer = EventTailer(events_path(self.run_dir, 0))
        tailer = self._tailer

        def drain() -> None:
            for event in tailer.read_new():
                if not isinstance(event, Step):
                    continue
                if progress is not None:
                    progress.update(event)
                for hook in self.step_hooks:
                    hook(event)

        # SIGTERM / SIGHUP raise Interrupted in the main loop (SIGINT already raises KeyboardInterrupt).
        with raise_on_signals((signal.SIGTERM, signal.SIGHUP), Interrupted):
            try:
                while True:
                    drain()
                    for tick in self.tick_hooks:
                        tick()
                    state = self.poll()
                    if replace_the_dead(self, state):
                        continue
                    if state.failed or not state.running:
                        break
                    time.sleep(POLL_S)
                if state.failed and state.running and self.settle_s > 0:
                    deadline = time.monotonic() + self.settle_s
                    while state.running and time.monotonic() < deadline:
                        drain()
                        for tick in self.tick_hooks:
                            tick()
                        time.sleep(POLL_S)
                        state = self.poll()
            except (KeyboardInterrupt, Interrupted) as exc:
                self.kill_all()
                what = "SIGINT (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
                return Outcome("failed", f"interrupted by {what}", exit_codes=self._codes(), interrupted=True)
            drain()
            if state.all_ok:
                return Outcome("ok", exit_codes=self._codes())
            self.kill_all()
            assert self._first_failure is not None
            rank, code = self._first_failure
            tail = self.last_log_lines(rank)
            last = next((line for line in reversed(tail) if line.strip()), "")
            reason = f"rank {rank} exited with code {describe_exit(code)}"
            if last:
                reason += f": {last.strip()[:300]}"
            return Outcome("failed", reason, failed_rank=rank, exit_codes=self._codes(), log_tail=tail)

    def _codes(self) -> dict[int, int | None]:
        return self.workers.codes()
