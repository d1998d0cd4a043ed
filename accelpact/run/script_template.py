"""The template of ``accelpact.run``: a process that preloaded a user script's imports and forks its replacements.

``python -m accelpact.run.script_template`` is started by the agent (accelpact.run.agent) with the
entry point in ``ACCELPACT_TEMPLATE_ENTRY`` (JSON: ``script`` or ``module``, ``args``, ``preload``). It
imports torch, torch.distributed, FSDP, accelpact's heal path, then every module the script imports at
its top level (read with ``ast``, never executed) and the ``--preload`` modules; then it serves fork
requests (accelpact.run.forkserver). A forked child takes the rank's environment, directory and stdio
(the rank's log file, or the agent's stdout/stderr) and runs the script as ``__main__``, as
``python script.py args`` would; the script itself sees nothing different, except
``ACCELPACT_REPLACEMENT`` in its environment.

The pipes: requests on fd 0, replies on fd 1; the agent's own stdout arrives as the descriptor named by
``ACCELPACT_TEMPLATE_STDOUT_FD`` and becomes the template's (and its children's) fd 1.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import runpy
import sys
import time
from typing import Any

from accelpact.run.forkserver import die_with_parent, serve, thread_count

ENTRY_ENV = "ACCELPACT_TEMPLATE_ENTRY"
STDOUT_FD_ENV = "ACCELPACT_TEMPLATE_STDOUT_FD"
# What every replacement of an accelpact-healed FSDP script imports before it arrives.
BASE_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "accelpact",
    "accelpact.control",
    "accelpact.recovery.rejoin",
    "accelpact.recovery.heal",
    "accelpact.snapshot",
)


def script_imports(path: str) -> list[str]:
    """The modules ``path`` imports at its top level (``import a.b``, ``from a import b``: a and a.b)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
    return out


def preload(entry: dict[str, Any]) -> list[str]:
    """Import what a replacement would import before it arrives; the modules that failed (not fatal)."""
    if entry.get("script"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(entry["script"])))  # as `python script.py` does
    names = [
        *BASE_PRELOAD,
        *(script_imports(entry["script"]) if entry.get("script") else []),
        *entry.get("preload", []),
    ]
    return _import_all(names)


def _import_all(names: list[str]) -> list[str]:
    """Import each of ``names``; the ones that failed."""
    failed = []
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except ImportError:
            # `from a import b` names b, which is often not a module (a class): only a.b fails, a loaded.
            if "." not in name or name.rsplit(".", 1)[0] not in sys.modules:
                failed.append(name)
        except Exception as exc:  # noqa: BLE001 - a module failing at import fails in the spawned rank too
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    return failed


def preload_more(names: list[str]) -> dict[str, Any]:
    """A preload request (the modules the ranks loaded by their first step: accelpact.run.modules)."""
    t0 = time.perf_counter()
    new = [n for n in names if n not in sys.modules]
    failed = _import_all(new)
    return {
        "preloaded": len(new) - len(failed),
        "failed": len(failed),
        "import_s": time.perf_counter() - t0,
        "threads": thread_count(),
    }


def become(req: dict[str, Any]) -> int:
    """In the forked child: the rank's stdio, environment and directory, then the user's script."""
    die_with_parent(os.getppid())  # the template; it dies with the agent (a fork does not inherit the setting)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if req.get("log"):
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    entry = req["entry"]
    if entry.get("script"):
        sys.argv = [entry["script"], *entry["args"]]
        runpy.run_path(entry["script"], run_name="__main__")
    else:
        sys.argv = [entry["module"], *entry["args"]]
        runpy.run_module(entry["module"], run_name="__main__", alter_sys=True)
    return 0


def main() -> int:
    entry = json.loads(os.environ[ENTRY_ENV])
    die_with_parent(int(os.environ.get("ACCELPACT_AGENT_PID", "0") or 0))
    reply = os.fdopen(os.dup(1), "w")
    out_fd = int(os.environ.get(STDOUT_FD_ENV, "2"))
    os.dup2(out_fd, 1)  # prints (ours, the imports', the children's) go to the agent's stdout, not the protocol
    if out_fd > 2:
        os.close(out_fd)
    t0 = time.perf_counter()
    failed = preload(entry)
    ready = {"ready": True, "import_s": time.perf_counter() - t0, "threads": thread_count(), "failed": failed}
    print(
        f"accelpact.run: template {os.getpid()} ready: imports {ready['import_s']:.2f} s, {ready['threads']} "
        f"thread(s){', could not import ' + ', '.join(failed) if failed else ''}",
        file=sys.stderr,
        flush=True,
    )
    reply.write(json.dumps(ready) + "\n")
    reply.flush()
    serve(0, reply, become, preload_more)
    return 0


if __name__ == "__main__":
    sys.exit(main())
