"""accelpact.run's pure parts: the command line (torchrun's flags), each rank's environment, how a script
learns it is a replacement, what the template preloads, and which deaths are healed (fake processes)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from accelpact.control import ControlChannel  # noqa: F401 - the channel reads what worker_env writes
from accelpact.control.launch_env import control_settings
from accelpact.run import replacement
from accelpact.run.agent import Agent, AgentConfig
from accelpact.run.attempt import Attempt
from accelpact.run.cli import config_from_args
from accelpact.run.env import RankPlace, worker_env
from accelpact.run.script_template import script_imports
from accelpact.run.workers import Workers
from accelpact.snapshot.launch import job_token_from_env


def test_torchrun_flags_are_accepted_in_both_spellings():
    cfg = config_from_args(
        [
            "--nnodes",
            "2",
            "--nproc_per_node",
            "4",
            "--node-rank",
            "1",
            "--rdzv-endpoint",
            "10.0.0.1:29400",
            "--rdzv-id",
            "job7",
            "--max-restarts",
            "2",
            "train.py",
            "--lr",
            "3",
        ]
    )
    assert (cfg.nnodes, cfg.nproc_per_node, cfg.node_rank, cfg.master_addr, cfg.master_port) == (
        2,
        4,
        1,
        "10.0.0.1",
        29400,
    )
    assert cfg.run_id == "job7" and cfg.max_restarts == 2 and cfg.entry == ("train.py", "--lr", "3")
    assert cfg.place(2).rank == 6 and cfg.world_size == 8
    one = config_from_args(["--standalone", "--nproc-per-node", "2", "train.py"])
    assert one.master_port == 0 and one.nnodes == 1 and one.run_id


def test_bad_command_lines_name_the_fix(capsys):
    with pytest.raises(SystemExit):
        config_from_args(["--nnodes", "2", "--rdzv-id", "x", "--master-addr", "h", "train.py"])
    assert "pass --master-port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config_from_args(["--nnodes", "1:4", "train.py"])
    assert "elastic node ranges are not supported" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config_from_args(["--nnodes", "2", "--node-rank", "2", "--master-port", "1", "--rdzv-id", "x", "t.py"])
    assert "--node-rank=2 must be in 0..1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config_from_args(["--hot-spares", "1", "--replacement", "none", "t.py"])
    assert "drop --replacement=none" in capsys.readouterr().err
    assert config_from_args(["--hot-spares", "2", "t.py"]).hot_spares == 2


def test_a_spare_takes_the_assigned_ranks_environment_and_log(tmp_path):
    """accelpact.run.spare against a real TCPStore: the spare blocks until its key is written."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from accelpact.run import spare

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    env = {"ACCELPACT_CONTROL_ADDR": f"127.0.0.1:{store.port}", spare.SPARE_ENV: "1", spare.SPARE_KEY_ENV: "k/spare0"}
    assert spare.is_spare(env)
    done = threading.Event()
    threading.Thread(target=lambda: (spare.wait_for_rank(env, redirect=False), done.set()), daemon=True).start()
    assert not done.wait(0.5)  # nothing assigned yet: still waiting
    store.set("k/spare0", spare.assignment({"RANK": "1", "ACCELPACT_REPLACEMENT": "1"}, str(tmp_path / "rank1.log")))
    assert done.wait(10)
    assert env["RANK"] == "1" and env["ACCELPACT_REPLACEMENT"] == "1" and not spare.is_spare(env)


def test_each_rank_gets_torchruns_variables_and_accelpacts():
    place = RankPlace(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, nnodes=2)
    env = worker_env(
        place,
        master_addr="10.0.0.1",
        master_port=29400,
        run_id="job7",
        attempt=2,
        max_restarts=3,
        snapshot_root="/dev/shm/x",
        base={"PATH": "/bin", "ACCELPACT_REPLACEMENT": "9"},
    )
    want = {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "job7",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "ACCELPACT_CONTROL_ADDR": "10.0.0.1:29400",
        "ACCELPACT_SNAPSHOT_ROOT": "/dev/shm/x",
        "PATH": "/bin",
    }
    assert {k: env[k] for k in want} == want
    # The control token is the one accelpact derives under torchrun; the snapshot token survives restarts.
    assert control_settings(env)["job_token"] == control_settings(env, torchrun_only=True)["job_token"]
    assert job_token_from_env(env) == "torchrun-job7"
    assert replacement(env) is None  # an inherited ACCELPACT_REPLACEMENT is dropped for a group rank


def test_a_replacement_learns_it_from_its_environment():
    place = RankPlace(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0, nnodes=1)
    env = worker_env(
        place,
        master_addr="h",
        master_port=1,
        run_id="r",
        attempt=0,
        max_restarts=0,
        replacement_of=(2, 4242, 1234.5),
        base={},
    )
    assert replacement(env) == replacement(env) and replacement(env).number == 2
    assert replacement(env).replaces_pid == 4242 and replacement(env).t_launch == 1234.5


def test_the_template_preloads_the_scripts_top_level_imports(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nimport torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\ndef f():\n    import json\n"
    )
    assert script_imports(str(script)) == [
        "os",
        "torch.nn",
        "torch.distributed.fsdp",
        "torch.distributed.fsdp.fully_shard",
    ]


class _Proc(SimpleNamespace):
    def poll(self):
        return self.code


@pytest.mark.parametrize(
    "code, mode, used, alive, healed",
    [
        (-signal.SIGKILL, "template", 0, True, True),
        (-signal.SIGKILL, "spawn", 0, True, True),
        (3, "template", 0, True, False),  # its own exit code: it would fail again
        (-signal.SIGKILL, "none", 0, True, False),
        (-signal.SIGKILL, "template", 3, True, False),  # --max-replacements spent
        (-signal.SIGKILL, "template", 0, False, False),  # no survivor on the only node
    ],
)
def test_which_deaths_get_a_replacement(code, mode, used, alive, healed):
    agent = Agent(AgentConfig(entry=("t.py",), nproc_per_node=2, replacement=mode, max_replacements=3))
    agent.replacements = used
    att = Attempt(0, Workers(procs={0: _Proc(pid=10, code=None if alive else -9), 1: _Proc(pid=11, code=code)}))
    why = agent._why_not_replaced(att, 1, code)
    assert (why is None) == healed, why
    if why is not None:
        assert "rank 1" in why


class _KeyStore:
    """The agent's store reads (check, get) over a dict."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        self.keys = keys

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]


@pytest.mark.parametrize("code", [-signal.SIGABRT, -signal.SIGKILL])
def test_a_rank_that_closed_its_guard_after_finish_is_never_replaced(code, capsys):
    """The closed mark (guard.finish, then close) makes any later exit a report, never a replacement."""
    from accelpact.recovery.heal_wait import closed_key_of
    from accelpact.run.env import job_token

    agent = Agent(AgentConfig(entry=("t.py",), nproc_per_node=2, run_id="r1"))
    agent.store = _KeyStore({closed_key_of(job_token("r1", 0), 0): b"7"})
    att = Attempt(0, Workers(procs={0: _Proc(pid=10, code=code), 1: _Proc(pid=11, code=0)}))
    agent._replace = lambda *a: pytest.fail("a rank that ended the run was replaced")
    assert agent._handle_deaths(att) is None  # no group restart either
    assert att.ended == {0: code} and agent.replacements == 0
    assert agent._handle_deaths(att) is None and att.ended == {0: code}  # reported once
    err = capsys.readouterr().err
    assert err.count("after it ended the run at step 7") == 1 and "not replaced; its training is complete" in err
    # Without the mark the same exit is a killed rank: replaced (rank 1 still runs).
    agent.store = _KeyStore({})
    att = Attempt(0, Workers(procs={0: _Proc(pid=10, code=code), 1: _Proc(pid=11, code=None)}))
    replaced = []
    agent._replace = lambda att, rank, code: replaced.append(rank)
    assert agent._handle_deaths(att) is None and replaced == [0]


def test_the_agent_removes_the_jobs_snapshots_under_either_token_style(tmp_path):
    """The run's snapshot token (job_token_from_env) and each attempt's control token (control.job_token)."""
    from accelpact.run.env import job_token, snapshot_token
    from accelpact.snapshot.layout import job_dir

    agent = Agent(AgentConfig(entry=("t.py",), run_id="r9", snapshot_root=str(tmp_path)))
    mine = [job_dir(tmp_path, t) for t in (snapshot_token("r9"), job_token("r9", 0), job_token("r9", 1))]
    other = job_dir(tmp_path, snapshot_token("another-run"))
    for d in (*mine, other):
        (d / "rank0" / "slot0").mkdir(parents=True)
        (d / "rank0" / "slot0" / "payload.bin").write_bytes(b"x")
    agent._remove_snapshots(attempts=2)
    assert not any(d.exists() for d in mine) and other.exists()


@pytest.mark.parametrize("planned", [False, True])
def test_a_replacement_still_waiting_for_a_plan_is_no_survivor(planned):
    """A whole job killed across two polls: rank 0's death was seen first and replaced; when rank 1's death
    is seen, the only live process is that replacement. Without a plan from survivors it can heal nobody,
    so the agent restarts the group at once instead of starting a second waiting replacement (which would
    wait out its plan's timeout). Once the survivors sent its plan, the replacement is a survivor."""
    from accelpact.recovery.heal_wait import plan_key_of
    from accelpact.run.env import job_token

    agent = Agent(AgentConfig(entry=("t.py",), nproc_per_node=2, replacement="template", max_replacements=3))
    keys = {plan_key_of(job_token(agent.cfg.run_id, 0), 0, 20): b"{}"} if planned else {}
    agent.store = _KeyStore(keys)
    att = Attempt(0, Workers(procs={0: _Proc(pid=20, code=None), 1: _Proc(pid=11, code=-signal.SIGKILL)}))
    att.replaced[0] = 20
    why = agent._why_not_replaced(att, 1, -signal.SIGKILL)
    if planned:
        assert why is None
    else:
        assert why is not None and "no survivor to heal from" in why and "rank 1" in why
