"""The replacement template: a preloaded process that forks replacement ranks (``strategy.replacement_start``).

``python -m harness.rank.template <run_dir>/worker_spec.json``, started by the parent
(``harness.parent.template``). A fresh replacement process spends seconds importing torch, accelpact and
transformers' model class before it can heal; the template pays for that once, at launch, while the run
is healthy, and then waits. When a rank dies the parent asks it over a pipe to fork a child that becomes
the replacement: its own pid and session, the rank's environment, stdio on the rank's log, optionally
the dead rank's network namespace, and then ``harness.rank.worker.main`` as a spawned worker would run.

The pipe protocol, one JSON object per line:

- template -> parent, once: ``{"ready": true, "import_s": s, "threads": n}`` (imports done);
- parent -> template: ``{"id": k, "env": {...}, "spec": path, "log": path, "cwd": dir, "netns": name|null}``;
- template -> parent: ``{"id": k, "pid": pid}`` or ``{"id": k, "refused": why}`` (the parent then spawns);
- template -> parent: ``{"exit": pid, "code": c}`` when a child ends (``c`` as ``Popen.returncode``: a
  negative code is the signal that killed it). The template is the children's parent: it reaps them.

Why fork is safe here: the template never creates a thread (no process group, no CUDA, no store client,
no intra-op pool: a meta-device model computes nothing), and it checks ``/proc/self/task`` before every
fork: a fork copies only the calling thread, so a lock another thread held would stay locked forever in
the child. More than one thread: the request is refused with the count, and the parent spawns instead.

Lifetime: the template dies with the parent (PR_SET_PDEATHSIG), its children die with it (the worker's
own die-with-parent check, with the template as its parent), and on EOF of its request pipe (the parent
closed it) it SIGKILLs the sessions of children still running and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from typing import Any

CLONE_NEWNET = 0x40000000
_REAP_EVERY_S = 0.05  # an exit is reported within this; the parent polls its ranks every 0.05 s too


def thread_count() -> int:
    """Threads of this process (Linux): a fork is safe only at 1."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1  # unknown: treated as unsafe


def preload(spec_path: str) -> None:
    """Import everything a replacement imports before it arrives, and build the meta model once."""
    from harness.plugins import load_plugins
    from harness.rank.worker import read_spec

    _, cfg = read_spec(spec_path)
    load_plugins()
    import accelpact  # noqa: F401
    import accelpact.snapshot  # noqa: F401
    import harness.rank.train  # noqa: F401 - torch, torch.distributed, FSDP, the strategies
    from accelpact.control import ControlChannel  # noqa: F401
    from harness import strategies
    from harness.rank.models import meta_model

    spec = strategies.get(cfg.strategy.name)
    for entry in (spec.rejoin, spec.rank_entry):
        if entry:
            __import__(entry.split(":")[0])
    strategies.rank_class(cfg.strategy.name)
    meta_model(cfg.model)  # transformers' model class and everything it imports lazily


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


def become_replacement(req: dict[str, Any]) -> int:
    """In the forked child: the rank's stdio, environment and directory, then the worker's main."""
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    env = dict(req["env"])
    env["HARNESS_PARENT_PID"] = str(os.getppid())  # the template: the worker dies with it
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    sys.argv = [sys.argv[0], req["spec"]]
    print(f"replacement forked from template {os.getppid()} (pid {os.getpid()})", flush=True)
    from harness.rank.worker import main

    return main([req["spec"]])


def fork_one(req: dict[str, Any], reply_fd: int) -> dict[str, Any]:
    """Fork the replacement of ``req``; the reply for the parent. ``reply_fd``: the template's end of the
    reply pipe, closed in the child (a child holding it would hide the template's death from the parent)."""
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
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, reply_fd)  # not close(): the reply file object still owns that descriptor number
            os.close(null)
            os.setsid()  # its own session and process group, as a spawned worker's (killpg reaches it)
            if req.get("netns"):
                enter_netns(req["netns"])
            os.close(ready_w)  # the template replies only now: killpg(pid) cannot miss the new group
            code = become_replacement(req)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - the child reports on its log and exits
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


def serve(read_fd: int, write: Any) -> None:
    """Answer fork requests on ``read_fd`` until EOF; report children's exits on ``write``."""
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
        if not chunk:  # the parent closed the pipe (or died): end what is left
            for pid in children:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            reply = fork_one(json.loads(line), write.fileno())
            if "pid" in reply:
                children.add(reply["pid"])
            send(reply)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.rank.template <run_dir>/worker_spec.json", file=sys.stderr)
        return 2
    from harness.rank.worker import die_with_parent

    die_with_parent(int(os.environ.get("HARNESS_PARENT_PID", "0") or 0))
    # The pipes: requests on fd 0, replies on fd 1. A child re-points 0/1/2 at /dev/null and its log.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed by an import goes to the template's log, not into the protocol
    t0 = time.perf_counter()
    preload(argv[0])
    ready = {"ready": True, "import_s": time.perf_counter() - t0, "threads": thread_count()}
    print(f"template {os.getpid()} ready: imports {ready['import_s']:.2f} s, {ready['threads']} thread(s)",
          file=sys.stderr, flush=True)
    reply.write(json.dumps(ready) + "\n")
    reply.flush()
    serve(0, reply)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
