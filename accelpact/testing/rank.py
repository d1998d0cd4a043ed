"""One rank of a multi-rank session: joins gloo and the control channel, runs the caller's scenarios.

Started by :func:`accelpact.testing.session.run_session` as ``python .../accelpact/testing/rank.py
<config.json>``. The config names a scenario runner ``"package.module:function"``; this rank imports
it and calls ``runner(scenario, ctx)`` for each scenario in order, where ``ctx`` is a
:class:`RankContext`. A runner returns a JSON-serialisable dict (``"error": None`` or an error dict
when it caught a failure itself); an exception escaping it is recorded as that scenario's error.
Results are written after every scenario, and the rank stops at the first error, because after an
unrecoverable one the process group is gone.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Run as a file: its own directory lands first on sys.path, where inject.py, session.py, ... would
    # shadow any top-level module of the same name. The package is imported through PYTHONPATH.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _here]

import torch
import torch.distributed as dist

from accelpact.control import ControlChannel, ControlConfig

__all__ = ["RankContext", "load_runner", "error_dict", "main"]

Runner = Callable[[dict[str, Any], "RankContext"], dict[str, Any]]


@dataclass
class RankContext:
    """What a scenario runner gets besides its scenario: who this rank is and its channels."""

    rank: int
    world_size: int
    control: ControlChannel
    store: Any  # the session's TCPStore client (the init rendezvous used it under "{token}/init")
    out_dir: Path
    exclude_ports: list[int]  # store ports a socket-reset fault must leave alone
    pg_timeout_s: float
    settings: dict[str, Any] = field(default_factory=dict)  # the caller's session-wide settings

    def barrier(self, tag: str) -> None:
        """Wait for every rank on the control channel (never on the data plane a fault may break)."""
        self.control.barrier(tag, self.control.generation)

    def error(self, exc: BaseException, **extra: Any) -> dict[str, Any]:
        """:func:`error_dict` of ``exc``, for a runner that catches a failure and reports it itself.

        A method, so that runners need not import this module: with an older accelpact first on
        the path (a before/after benchmark) only the entry point is this file.
        """
        return error_dict(exc, **extra)


def load_runner(spec: str) -> Runner:
    """The function named by ``"package.module:function"``."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"runner {spec!r} must be 'package.module:function'")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"runner {spec!r}: {module} has no function {name!r}")
    runner: Runner = fn
    return runner


def error_dict(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """How a rank reports an exception: type, message, the ranks / last committed step accelpact's
    errors carry, and the traceback (both trimmed: results files stay readable)."""
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "ranks": list(getattr(exc, "ranks", ()) or ()),
        "last_committed_step": getattr(exc, "last_committed_step", None),
        "traceback": traceback.format_exc()[-4000:],
        **extra,
    }


def _connect(cfg: dict[str, Any]) -> tuple[Any, ControlChannel]:
    rank, world = cfg["rank"], cfg["world_size"]
    client = dist.TCPStore(cfg["host"], cfg["port"], world, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"{cfg['job_token']}/init", client),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=cfg["pg_timeout_s"]),
    )
    control = ControlChannel.connect(
        ControlConfig(
            host=cfg["host"],
            port=cfg["port"],
            rank=rank,
            world_size=world,
            job_token=cfg["job_token"],
            deadline_s=cfg["control_deadline_s"],
        )
    )
    return client, control


def main(argv: list[str] | None = None) -> None:
    """Run the scenarios of the config file ``argv[0]`` and exit without gloo teardown."""
    args = sys.argv[1:] if argv is None else argv
    cfg = json.loads(Path(args[0]).read_text())
    # The session sends SIGUSR1 before it kills a rank at its timeout: every thread's stack goes to
    # this rank's log, so a hang names the call it hung in.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # accelpact logs each recovery's milestones at INFO: the rank's log then tells its rounds apart.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("accelpact").setLevel(logging.INFO)
    torch.set_num_threads(1)  # every rank shares the host's few cores
    runner = load_runner(cfg["runner"])
    store, control = _connect(cfg)
    ctx = RankContext(
        rank=cfg["rank"],
        world_size=cfg["world_size"],
        control=control,
        store=store,
        out_dir=Path(cfg["out_dir"]),
        exclude_ports=[cfg["port"]],
        pg_timeout_s=cfg["pg_timeout_s"],
        settings=cfg.get("settings", {}),
    )
    results: dict[str, Any] = {}
    out = ctx.out_dir / f"results.rank{ctx.rank}.json"
    for sc in cfg["scenarios"]:
        name = sc["name"]
        if sc.get("barrier", cfg.get("barrier", False)):
            ctx.barrier(f"scenario/{name}")  # start together: start-up skew must not look like a hang
        t0 = time.time()
        logging.getLogger("accelpact.testing").info("rank %d: scenario %s", ctx.rank, name)
        try:
            results[name] = runner(sc, ctx)
        except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which decides
            results[name] = {"error": error_dict(exc, elapsed_s=time.time() - t0)}
        results[name].setdefault("wall_s", time.time() - t0)
        out.write_text(json.dumps(results, default=str))
        if results[name].get("error"):
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip gloo teardown: retired generations are gone, nothing is left to flush


if __name__ == "__main__":
    main()
