"""The launcher's side of a replacement template (accelpact.run.forkserver): start it, ask it to fork, reap.

``TemplateClient(proc)`` wraps a started template process whose stdout is the reply pipe and stdin the
request pipe. ``fork(request)`` asks it for one replacement process and returns a :class:`ForkedRank`,
which a launcher keeps like the ``Popen`` of a spawned rank (``pid``, ``poll``, ``wait``): the template,
not the launcher, is the replacement's parent, so exit codes come back over the pipe. Anything that makes
the template unusable (not ready yet, exited, refused the fork, no answer) raises
:class:`TemplateUnavailable` with the reason; the caller then spawns a fresh process and says why.

Used by ``accelpact.run`` (users' scripts) and by the harness's parent (``harness.parent.template``).
Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from typing import Any

__all__ = [
    "TemplateClient",
    "TemplateUnavailable",
    "ForkedRank",
    "start_script_template",
    "FORK_REPLY_S",
    "READY_WAIT_S",
]

# A ready template forks and answers in milliseconds; this only bounds a template that stopped
# answering (it is then killed and the replacement spawned).
FORK_REPLY_S = 10.0
# A death before the template finished importing waits this long for it (see _wait_ready).
READY_WAIT_S = 60.0


class TemplateUnavailable(Exception):
    """The template cannot fork this replacement; the message says why."""


class TemplateClient:
    """One template process: started with the ranks, asked for replacements, closed at the end."""

    def __init__(self, proc: subprocess.Popen[bytes], started: float) -> None:
        self.proc = proc
        self.started = started
        self.ready: dict[str, Any] | None = None  # the template's ready record
        self.exits: dict[int, int] = {}  # child pid -> exit code, as reported
        self._replies: dict[int, dict[str, Any]] = {}
        self._buf = b""
        self._next_id = 0
        assert proc.stdout is not None
        self._out = proc.stdout.fileno()
        os.set_blocking(self._out, False)

    # -- the pipe ---------------------------------------------------------------------------
    def pump(self) -> None:
        """Read what the template wrote so far (never blocks)."""
        while True:
            try:
                chunk = os.read(self._out, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("ready"):
                self.ready = msg
            elif "exit" in msg:
                self.exits[int(msg["exit"])] = int(msg["code"])
            elif "id" in msg:
                self._replies[int(msg["id"])] = msg

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, request: dict[str, Any]) -> ForkedRank:
        """A replacement process forked from the template (raises TemplateUnavailable with the reason).

        ``request``: what the template's ``become`` reads (``env``, ``cwd``, ``netns`` at least)."""
        self._wait_ready()
        req_id = self._next_id
        self._next_id += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({**request, "id": req_id}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise TemplateUnavailable(f"the template's pipe is closed ({exc})") from exc
        deadline = time.monotonic() + FORK_REPLY_S
        while req_id not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                why = f"no answer within {FORK_REPLY_S:g} s" if left <= 0 else "it died while forking"
                self.close()
                raise TemplateUnavailable(f"the template failed: {why}")
            select.select([self._out], [], [], min(left, 0.05))
            self.pump()
        reply = self._replies.pop(req_id)
        if "refused" in reply:
            raise TemplateUnavailable(f"the template refused: {reply['refused']}")
        return ForkedRank(self, int(reply["pid"]))

    def preload(self, names: list[str]) -> int:
        """Ask the template to import ``names`` before its next fork (accelpact.run.modules); the request's id,
        whose reply :meth:`reply` returns once it came. Never blocks on the imports."""
        req_id = self._next_id
        self._next_id += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"preload": list(names), "id": req_id}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise TemplateUnavailable(f"the template's pipe is closed ({exc})") from exc
        return req_id

    def reply(self, req_id: int) -> dict[str, Any] | None:
        """The reply to request ``req_id`` if it came (taken), else None (never blocks)."""
        self.pump()
        return self._replies.pop(req_id, None)

    def _wait_ready(self) -> None:
        """Block until the template has imported everything (a death right after launch), or raise.

        Waiting beats spawning: a fresh process would do the same imports, started later, on the same
        cores. The launcher's loop is blocked meanwhile, at most READY_WAIT_S."""
        deadline = time.monotonic() + READY_WAIT_S
        self.pump()
        while self.ready is None and self.alive() and time.monotonic() < deadline:
            select.select([self._out], [], [], 0.05)
            self.pump()
        if not self.alive():
            self.pump()
            raise TemplateUnavailable(f"the template exited with code {self.proc.returncode}")
        if self.ready is None:
            raise TemplateUnavailable(
                f"the template was still importing {time.time() - self.started:.1f} s after its start"
            )

    def close(self) -> None:
        """End the template (it SIGKILLs children still running on EOF) and reap it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_script_template(
    python: str,
    entry: dict[str, Any],
    env: dict[str, str],
    *,
    stdout_fd: int | None = None,
    stderr: Any = None,
    cwd: str | None = None,
) -> TemplateClient:
    """Start ``python -m accelpact.run.script_template`` for ``entry`` and return its client.

    ``entry``: what the template preloads and what its children run (``script`` or ``module``, ``args``,
    ``preload``). ``env``: the template's environment (its children get their own with each request); it must
    name the launcher's pid in ``ACCELPACT_AGENT_PID`` so that the template dies with it. ``stdout_fd``: a
    descriptor that becomes the template's (and its children's) stdout; default its stderr. ``stderr``: as
    for ``Popen``."""
    from accelpact.run.script_template import ENTRY_ENV, STDOUT_FD_ENV

    env = dict(env)
    env[ENTRY_ENV] = json.dumps(entry)
    # numpy's OpenBLAS starts a pool thread at import unless told one: a template with two threads
    # cannot fork safely (accelpact.run.forkserver); torch's own pool starts in the child.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if stdout_fd is not None:
        env[STDOUT_FD_ENV] = str(stdout_fd)
    proc = subprocess.Popen(
        [python, "-m", "accelpact.run.script_template"],
        env=env,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        pass_fds=() if stdout_fd is None else (stdout_fd,),
        start_new_session=True,
    )
    return TemplateClient(proc, time.time())


class ForkedRank:
    """A replacement forked by the template, with the parts of ``Popen`` a launcher uses."""

    def __init__(self, template: TemplateClient, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.returncode: int | None = None
        self.args = ["(forked from the template)", str(pid)]

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self.template.pump()
        if self.pid in self.template.exits:
            self.returncode = self.template.exits[self.pid]
        elif not self.template.alive() and not _exists(self.pid):
            # The template died before reporting: its children got SIGKILL (their die-with-parent signal).
            self.template.pump()
            self.returncode = self.template.exits.get(self.pid, -signal.SIGKILL)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the process (as ``Popen.send_signal``; nothing once it has ended)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
