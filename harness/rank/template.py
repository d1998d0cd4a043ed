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

The pipe protocol and the fork itself live in ``accelpact.run.forkserver`` (shared with
``accelpact.run``'s template for users' scripts); this module supplies what is harness-specific: the
preload and ``become_replacement``. Fork safety in short: the template never creates a thread (no
process group, no CUDA, no store client, no intra-op pool: a meta-device model computes nothing), and
it checks ``/proc/self/task`` before every fork; more than one thread: the request is refused with the
count, and the parent spawns instead.

Lifetime: the template dies with the parent (PR_SET_PDEATHSIG), its children die with it (the worker's
own die-with-parent check, with the template as its parent), and on EOF of its request pipe (the parent
closed it) it SIGKILLs the sessions of children still running and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# The fork server itself (pipe protocol, fork safety, reaping) is shared with accelpact.run's template.
from accelpact.run import enter_netns, fork_one, reap, serve, thread_count  # noqa: F401
from harness import strategies
from harness.contract import read_spec
from harness.plugins import load_plugins


def preload(spec_path: str) -> None:
    """Import everything a replacement imports before it arrives, and build the meta model once."""
    load_plugins()  # before the spec: its strategy may be a plugin's, with its own config class
    _, cfg = read_spec(spec_path)
    import accelpact
    import accelpact.snapshot  # noqa: F401
    import harness.rank.train  # noqa: F401 - torch, torch.distributed, FSDP, the strategies
    from accelpact.control import ControlChannel  # noqa: F401
    from harness.models import meta_model  # lazy: torch

    spec = strategies.get(cfg.strategy.name)
    for entry in (spec.rejoin, spec.rank_entry):
        if entry:
            __import__(entry.split(":")[0])
    strategies.resolve(spec.rank_class)
    meta_model(cfg.model)  # transformers' model class and everything it imports lazily


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
    what = "replacement" if req["env"].get("HARNESS_REPLACEMENT", "0") not in ("", "0") else "rank"
    print(f"{what} forked from template {os.getppid()} (pid {os.getpid()})", flush=True)
    from harness.rank.worker import main

    return main([req["spec"]])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.rank.template <run_dir>/worker_spec.json", file=sys.stderr)
        return 2
    from accelpact.run import die_with_parent

    die_with_parent(int(os.environ.get("HARNESS_PARENT_PID", "0") or 0))
    # The pipes: requests on fd 0, replies on fd 1. A child re-points 0/1/2 at /dev/null and its log.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed by an import goes to the template's log, not into the protocol
    t0 = time.perf_counter()
    preload(argv[0])
    ready = {"ready": True, "import_s": time.perf_counter() - t0, "threads": thread_count()}
    print(
        f"template {os.getpid()} ready: imports {ready['import_s']:.2f} s, {ready['threads']} thread(s)",
        file=sys.stderr,
        flush=True,
    )
    reply.write(json.dumps(ready) + "\n")
    reply.flush()
    serve(0, reply, become_replacement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
