"""The template process's side of a preloaded fork server: fork one replacement per request, reap them.

A replacement process that starts from scratch spends seconds importing torch (and whatever the training
code imports) before it can heal a lost rank. A *template* pays for those imports once, while the job is
healthy, then waits on a pipe; when a rank dies its launcher asks it to fork a child that becomes the
replacement. Two templates use this module: ``accelpact.run``'s (a user's torchrun-style script) and the
harness's (``harness.rank.template``). Each supplies ``become(request) -> exit code``, what the child
runs; everything else (the pipe protocol, fork safety, reaping, the end of the template) is here.

The pipe protocol, one JSON object per line:

- template -> launcher, once: ``{"ready": true, "import_s": s, "threads": n}`` (imports done);
- launcher -> template: ``{"id": k, "env": {...}, "cwd": dir, "netns": name|null, ...}`` (plus whatever
  ``become`` reads);
- template -> launcher: ``{"id": k, "pid": pid}`` or ``{"id": k, "refused": why}`` (the launcher then
  spawns a fresh process);
- template -> launcher: ``{"exit": pid, "code": c}`` when a child ends (``c`` as ``Popen.returncode``: a
  negative code is the signal that killed it). The template is the children's parent: it reaps them.

Why fork is safe: the template never creates a thread (no process group, no CUDA, no store client, no
intra-op pool), and :func:`fork_one` checks ``/proc/self/task`` before every fork: a fork copies only the
calling thread, so a lock another thread held would stay locked forever in the child. More than one
thread: the request is refused with the count. Launchers start templates with ``OPENBLAS_NUM_THREADS=1``,
or numpy's OpenBLAS starts a pool thread at import (docs/launcher.md, "The template").

Lifetime: the template dies with its launcher (:func:`die_with_parent`), and on EOF of its request pipe
it SIGKILLs the sessions of children still running and exits.

Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["thread_count", "enter_netns", "die_with_parent", "fork_one", "reap", "serve", "Become"]

CLONE_NEWNET = 0x40000000
_REAP_EVERY_S = 0.05  # an exit is reported within this; launchers poll their ranks every 0.05 s too

# In the forked child: set up and run the replacement; returns its exit code (never returns to serve()).
Become = Callable[[dict[str, Any]], int]


def thread_count() -> int:
    """Threads of this process (Linux): a fork is safe only at 1."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1  # unknown: treated as unsafe


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (no orphans if the launcher is killed)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    # The parent may already have died before prctl took effect.
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)


def enter_netns(name: str) -> None:
    """Join network namespace ``name`` (as ``ip netns exec`` does for the network; root only)."""
    import ctypes

    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def fork_one(req: dict[str, Any], reply_fd: int, become: Become, request_fd: int | None = None) -> dict[str, Any]:
    """Fork the replacement of ``req``; the reply for the launcher.

    ``reply_fd`` (and ``request_fd``): the template's ends of the pipes, pointed at /dev/null in the child
    (a child holding the reply end would hide the template's death from the launcher)."""
    threads = thread_count()
    if threads != 1:
        return {"id": req["id"], "refused": f"the template has {threads} threads (a fork is safe only with one)"}
    sys.stdout.flush()
    sys.stderr.flush()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the template's loop
        code = 1
        try:
            os.close(ready_r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (reply_fd, request_fd):
                if fd is not None:
                    os.dup2(null, fd)  # not close(): the template's file objects still own those numbers
            os.close(null)
            os.setsid()  # its own session and process group, as a spawned worker's (killpg reaches it)
            if req.get("netns"):
                enter_netns(req["netns"])
            os.close(ready_w)  # the template replies only now: killpg(pid) cannot miss the new group
            code = become(req)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - the child reports on its stderr and exits
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(ready_w)
    while os.read(ready_r, 1):  # EOF once the child has its session (or died trying)
        pass
    os.close(ready_r)
    return {"id": req["id"], "pid": pid}


def reap(children: set[int]) -> list[dict[str, Any]]:
    """Exit records of the children that ended."""
    out = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        children.discard(pid)
        out.append({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
    return out


def serve(
    read_fd: int, write: Any, become: Become, preload: Callable[[list[str]], dict[str, Any]] | None = None
) -> None:
    """Answer fork requests on ``read_fd`` until EOF; report children's exits on ``write``.

    A request ``{"id": k, "preload": [names]}`` imports those modules first (``preload(names)``, its reply
    sent with the id; refused without ``preload``), so that the next fork's child has them."""
    children: set[int] = set()
    buf = b""

    def send(obj: dict[str, Any]) -> None:
        write.write(json.dumps(obj) + "\n")
        write.flush()

    while True:
        ready, _, _ = select.select([read_fd], [], [], _REAP_EVERY_S)
        for record in reap(children):
            send(record)
        if not ready:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:  # the launcher closed the pipe (or died): end what is left
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            if "preload" in req:
                send(
                    {
                        "id": req["id"],
                        **(
                            preload(req["preload"])
                            if preload is not None
                            else {"refused": "this template does not preload on request"}
                        ),
                    }
                )
                continue
            reply = fork_one(req, write.fileno(), become, request_fd=read_fd)
            if "pid" in reply:
                children.add(reply["pid"])
            send(reply)
