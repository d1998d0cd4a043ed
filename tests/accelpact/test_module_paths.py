"""The import paths users and launchers were told about keep working after the runtime's split into
subpackages: the public API, the re-exporting subpackages, and the old flat module names
(``accelpact.MOVED_MODULES``) that README, docs/ and launchers use, e.g. ``accelpact.liveness.publish_death``."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import accelpact

OLD_TO_NEW = {
    "accelpact.comm": "accelpact.backends.generations",
    "accelpact.heal": "accelpact.recovery.heal",
    "accelpact.heal_wait": "accelpact.recovery.heal_wait",
    "accelpact.liveness": "accelpact.detection.liveness",
    "accelpact.notice_auth": "accelpact.control.notice_auth",
    "accelpact.rejoin": "accelpact.recovery.rejoin",
}


@pytest.mark.parametrize("old,new", sorted(OLD_TO_NEW.items()))
def test_an_old_module_path_is_the_new_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    assert accelpact.MOVED_MODULES[old] is importlib.import_module(new)


def test_the_paths_the_docs_name_resolve_in_a_fresh_interpreter():
    code = "\n".join(
        [
            "import accelpact, accelpact.heal, accelpact.liveness",
            "from accelpact.control import ControlChannel, ControlConfig, new_job_token, start_control_server",
            "from accelpact.heal import HealPolicy, publish_no_replacement",
            "from accelpact.rejoin import RejoinTicket, rejoin",
            "from accelpact.guard import Guard, GuardConfig, attach, clip_gradients",
            "from accelpact import comm, snapshot",
            "assert accelpact.heal.HealPolicy is accelpact.HealPolicy",
            "assert callable(accelpact.liveness.publish_death) and callable(comm.store_ports)",
            "assert accelpact.rejoin is rejoin and callable(accelpact.rejoin)",  # the function, as before
            "assert callable(accelpact.snapshot.restore_latest)",
            "assert accelpact.is_comm_fault(RuntimeError('Connection closed by peer'))",
        ]
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
