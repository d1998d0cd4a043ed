"""The replacement template (harness.parent.template, harness.rank.template), on real processes.

Default suite: a template started as the parent starts it forks a child that is a process of its own
(its own pid, session and process group, the template as its parent, stdio on the rank's log) whose exit
code comes back over the pipe, also when the child is SIGKILLed; a template that holds a second thread
refuses to fork and says so. Slow: no process is left behind after a Ctrl-C of the parent or a SIGKILL
of the parent after a replacement was forked from the template.
(The heal runs with the template as the default, and the fallback to a spawn when the template was
killed, are in test_heal.py.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from harness_test_helpers import TINY, harness_cmd, harness_env, worker_processes


def _launcher(tmp_path: Path, extra_env: dict[str, str] | None = None):
    from harness.contract import write_spec
    from harness.parent.launcher import Launcher
    from harness.schema import RunConfig
    from harness.strategies.snapshot_config import AccelpactConfig

    run = RunConfig(strategy=AccelpactConfig(name="accelpact"))
    run.cluster.pg_timeout_s = 60.0
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    launcher = Launcher(run, run_dir, write_spec(run_dir, run))
    launcher.extra_env.update(extra_env or {})
    return launcher


def _ready(template, timeout_s: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while template.ready is None:
        assert template.alive(), f"the template exited with {template.proc.returncode}"
        assert time.monotonic() < deadline, f"the template was not ready after {timeout_s} s"
        time.sleep(0.1)
        template.pump()
    return template.ready


def test_a_forked_replacement_is_its_own_process_and_its_exit_comes_back(tmp_path):
    from harness.parent.template import ReplacementTemplate

    # A control store that accepts connections and never answers: the child blocks in its first store
    # call, so its session can be looked at while it lives.
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    launcher = _launcher(tmp_path)
    launcher.control = ("127.0.0.1", mute.getsockname()[1])
    template = ReplacementTemplate.start(launcher)
    try:
        ready = _ready(template)
        assert ready["threads"] == 1, ready
        env = launcher.rank_environ(1, 0, time.time(), replacement=1)
        child = template.fork(env, launcher.spec_path, launcher.log_path(1), str(tmp_path), None)
        assert child.pid not in (template.proc.pid, os.getpid())
        assert os.getsid(child.pid) == child.pid and os.getpgid(child.pid) == child.pid  # killpg reaches it
        with open(f"/proc/{child.pid}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == template.proc.pid  # its parent: the template
        # The child's first line reaches the rank's log (it then blocks on the mute store). Waited for:
        # under load the SIGKILL below came before the child had written it (CI run at 7211870).
        deadline = time.monotonic() + 60
        while "replacement forked from template" not in launcher.log_path(1).read_text():
            assert child.poll() is None and time.monotonic() < deadline, launcher.log_path(1).read_text()
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL  # reaped by the template, reported over the pipe

        # A child that fails on its own: its exit code and traceback, as a spawned worker's.
        del env["ACCELPACT_CONTROL_ADDR"]
        failing = template.fork(env, launcher.spec_path, launcher.log_path(0), str(tmp_path), None)
        assert failing.wait(timeout=60) == 1
        assert "rank process started without ACCELPACT_CONTROL_ADDR" in launcher.log_path(0).read_text()
    finally:
        template.close()
        mute.close()
    assert template.proc.returncode is not None


def test_a_template_with_a_second_thread_refuses_to_fork(tmp_path):
    from harness.parent.template import ReplacementTemplate, TemplateUnavailable

    # OpenBLAS (imported with torch via numpy) starts a pool thread at import when allowed two threads.
    launcher = _launcher(tmp_path, {"OPENBLAS_NUM_THREADS": "2"})
    launcher.control = ("127.0.0.1", 1)
    template = ReplacementTemplate.start(launcher)
    try:
        ready = _ready(template)
        if ready["threads"] == 1:
            pytest.skip("OpenBLAS started no pool thread here (one core?): nothing to refuse")
        env = launcher.rank_environ(1, 0, time.time(), replacement=1)
        with pytest.raises(TemplateUnavailable, match=f"the template has {ready['threads']} threads"):
            template.fork(env, launcher.spec_path, launcher.log_path(1), str(tmp_path), None)
    finally:
        template.close()


def _start(tmp_path: Path, extra: list[str]) -> subprocess.Popen:
    args = [
        *TINY,
        "strategy=accelpact_heal",
        "fault=kill",
        "fault.ranks=[1]",
        *extra,
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    return subprocess.Popen(
        harness_cmd(args, tmp_path),
        cwd=tmp_path,
        env=harness_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}: " + proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(0.2)


def _no_leftovers(tmp_path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while worker_processes(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker_processes(str(tmp_path)) == []


def _templates(tmp_path: Path) -> list:
    return [p for p in worker_processes(str(tmp_path)) if "harness.rank.template" in " ".join(p.cmdline())]


@pytest.mark.slow
def test_ctrl_c_of_the_parent_leaves_no_template(tmp_path):
    proc = _start(tmp_path, ["train.steps=400", "fault.at_step=390"])
    try:
        _wait_for(lambda: bool(_templates(tmp_path)), proc, "template process")
        events = tmp_path / "run" / "events" / "rank0.jsonl"
        _wait_for(lambda: events.exists() and '"kind": "step"' in events.read_text(), proc, "training step")
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    _no_leftovers(tmp_path)


@pytest.mark.slow
def test_a_killed_parent_takes_its_template_and_the_forked_replacement_with_it(tmp_path):
    proc = _start(tmp_path, ["train.steps=400", "fault.at_step=3", "fault.phase=vote"])
    events = tmp_path / "run" / "events"
    try:
        # The replacement was forked from the template (the parent's "replacement" event says so).
        _wait_for(
            lambda: any('"start": "template"' in p.read_text() for p in events.glob("*.jsonl")),
            proc,
            "replacement forked from the template",
        )
        assert len(worker_processes(str(tmp_path))) >= 3  # rank 0, the template, the forked rank 1
        os.kill(proc.pid, signal.SIGKILL)  # no teardown at all: only the kernel's parent-death signals
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    _no_leftovers(tmp_path)
