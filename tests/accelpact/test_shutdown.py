"""accelpact.shutdown: a thread of accelpact's inside a torch call when the interpreter exits no longer aborts it.

The bare case shows the failure the module exists for (a daemon thread returning from a torch call while
CPython finalizes: "terminate called without an active exception", SIGABRT); the registered cases, a
thread of the same kind and a real Heartbeat beating every millisecond that nobody stopped, exit 0. One
child of each, all at once: the bare one aborted in every run tried here (a thread in a TCPStore wait: 6 of
6); with register() a no-op the registered child aborts too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import sys, threading, time, torch
from accelpact import shutdown

class Busy:
    """A daemon thread that is inside a torch call (GIL released) nearly all the time."""
    def __init__(self):
        self.stop = threading.Event()
        a = torch.ones(192, 192)
        self.thread = threading.Thread(target=lambda: [torch.mm(a, a) for _ in iter(lambda: self.stop.is_set(), True)],
                                       daemon=True)
        self.thread.start()
    def stop_for_exit(self, deadline):
        self.stop.set()
        return shutdown.join_until(self.thread, deadline)

mode = sys.argv[1]
if mode == "heartbeat":
    import torch.distributed as dist
    from accelpact.detection.liveness import Heartbeat, LivenessConfig
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    beat = Heartbeat("127.0.0.1", server.port, "t", 0, config=LivenessConfig(0.001, 4)).start()
else:
    busy = Busy()
    if mode == "registered":
        shutdown.register(busy)
time.sleep(0.3)
print("main done", flush=True)
'''


def _start(mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_a_thread_inside_a_torch_call_at_exit_aborts_the_process_unless_registered():
    """One child of each kind, all at once (one interpreter start's wall time)."""
    procs = [(mode, _start(mode)) for mode in ("bare", "registered", "heartbeat")]
    done = {}
    for mode, p in procs:
        out, err = p.communicate(timeout=180)
        done.setdefault(mode, []).append((p.returncode, "main done" in out, err[-1500:]))
    assert any(code == -signal.SIGABRT for code, _, _ in done["bare"]), done["bare"]
    for mode in ("registered", "heartbeat"):
        assert all(code == 0 and ran for code, ran, _ in done[mode]), (mode, done[mode])
