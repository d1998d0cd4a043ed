"""accelpact.run's template of a user script: a fork runs the script with the rank's environment and
arguments and its exit code comes back over the pipe; a template with a second thread refuses to fork
(the agent then spawns). Real processes, no training: a few-line script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelpact.run.template import TemplateClient, TemplateUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
out = sys.argv[1]
with open(out, "w") as f:
    json.dump({"rank": os.environ["RANK"], "replacement": os.environ.get("ACCELPACT_REPLACEMENT"),
               "argv": sys.argv, "pid": os.getpid(), "ppid": os.getppid()}, f)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def start_template(tmp: Path, script: Path, preload: list[str]) -> TemplateClient:
    entry = {"script": str(script), "module": None, "args": [], "preload": preload}
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp), os.environ.get("PYTHONPATH", "")]),
        ACCELPACT_TEMPLATE_ENTRY=json.dumps(entry),
        OPENBLAS_NUM_THREADS="1",
        ACCELPACT_AGENT_PID=str(os.getpid()),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "accelpact.run.script_template"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    return TemplateClient(proc, time.time())


def test_a_fork_runs_the_script_as_the_rank_and_reports_its_exit(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    template = start_template(tmp_path, script, [])
    try:
        env = dict(os.environ, RANK="1", ACCELPACT_REPLACEMENT="1", EXIT_WITH="7")
        out = tmp_path / "out.json"
        req = {
            "env": env,
            "cwd": str(tmp_path),
            "netns": None,
            "log": str(tmp_path / "rank1.log"),
            "entry": {"script": str(script), "module": None, "args": [str(out), "--lr", "3"]},
        }
        child = template.fork(req)
        assert child.wait(timeout=120) == 7
        got = json.loads(out.read_text())
        assert got["rank"] == "1" and got["replacement"] == "1" and got["argv"] == [str(script), str(out), "--lr", "3"]
        assert got["pid"] == child.pid and got["ppid"] == template.proc.pid  # forked from the template
        assert template.ready["threads"] == 1
    finally:
        template.close()


def test_a_template_with_a_second_thread_refuses(tmp_path):
    (tmp_path / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    template = start_template(tmp_path, script, ["threaded"])
    try:
        with pytest.raises(TemplateUnavailable, match="the template refused: the template has 2 threads"):
            template.fork(
                {
                    "env": dict(os.environ, RANK="0"),
                    "cwd": str(tmp_path),
                    "netns": None,
                    "log": None,
                    "entry": {"script": str(script), "module": None, "args": [str(tmp_path / "x.json")]},
                }
            )
    finally:
        template.close()


def test_a_preload_request_gives_the_next_fork_what_the_ranks_loaded(tmp_path):
    """accelpact.run.modules: the modules named after the ranks' first step are in the forked child already."""
    (tmp_path / "lazy_model.py").write_text(
        "LOADED = True\n"
    )  # as transformers' modeling module: never a top-level import
    script = tmp_path / "train.py"
    script.write_text("import json, sys\njson.dump({'lazy': 'lazy_model' in sys.modules}, open(sys.argv[1], 'w'))\n")
    template = start_template(tmp_path, script, [])
    try:
        req = {
            "env": dict(os.environ, RANK="1"),
            "cwd": str(tmp_path),
            "netns": None,
            "log": None,
            "entry": {"script": str(script), "module": None, "args": [str(tmp_path / "before.json")]},
        }
        assert template.fork(req).wait(timeout=120) == 0
        req_id = template.preload(["lazy_model", "json", "no_such_module_here"])
        deadline = time.monotonic() + 120
        while (reply := template.reply(req_id)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reply == {**reply, "id": req_id, "preloaded": 1, "failed": 1, "threads": 1}, reply
        req["entry"]["args"] = [str(tmp_path / "after.json")]
        assert template.fork(req).wait(timeout=120) == 0
        assert json.loads((tmp_path / "before.json").read_text()) == {"lazy": False}
        assert json.loads((tmp_path / "after.json").read_text()) == {"lazy": True}
    finally:
        template.close()
