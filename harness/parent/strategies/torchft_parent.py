"""The parent's side of ``strategy=torchft``: the Lighthouse, and torchrun's per-group restarts.

torchft's users run one Lighthouse per job and one torchrun per replica group, each with
``--max-restarts``: when a worker of a group fails, that group's torchrun agent stops the group's other
workers and starts the whole group again, while the other groups go on. ``TorchftJob`` does both here:

- it starts the Lighthouse process (``harness.parent.strategies.torchft_lighthouse``) before the ranks and
  hands its address to every rank as ``TORCHFT_LIGHTHOUSE``; it runs where every rank reaches it
  (``harness.server_home``: the parent's namespace, or the bridge namespace on the control
  network when the ranks run in network namespaces), so a lost host takes only its own ranks down;
- it is the launcher's ``replace_dead`` policy: a failed rank's whole replica group is restarted (its
  still-running members are SIGKILLed, as torchrun's agent stops them) within
  ``strategy.max_restarts`` replacement processes, and the group's new processes meet on a fresh
  group generation (``gen_key``) so they never read the dead group's store address (docs/peers.md).

Nothing here imports torch: the parent builds no process group for torchft.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.events import read_events
from harness.parent.strategies.torchft_lighthouse import Lighthouse
from harness.server_home import server_home
from harness.strategies.torchft_config import torchft_config
from harness.strategies.torchft_layout import LIGHTHOUSE_ENV, GroupLayout, gen_key
from harness.strategies.torchft_report import torchft_columns

LIGHTHOUSE_LOG = "lighthouse.log"


class TorchftJob:
    """What the parent keeps alive for a torchft run (``StrategySpec.parent_setup``); ``close()`` at the end."""

    def __init__(self, run: Any, launcher: Any) -> None:
        st = torchft_config(run.strategy)
        self.run = run
        self.launcher = launcher
        self.group_size = st.group_size
        self.restarts: dict[int, int] = {}  # group -> generation now starting
        self._pending: dict[int, set[int]] = {}  # group -> members of the current restart not yet replaced
        home = server_home(run, launcher)
        self.lighthouse = Lighthouse.start(
            Path(launcher.run_dir) / "logs" / LIGHTHOUSE_LOG,
            home.host,
            st.min_replicas,
            st.join_timeout_ms,
            st.quorum_tick_ms,
            st.heartbeat_timeout_ms,
            netns=home.netns,
        )
        launcher.extra_env[LIGHTHOUSE_ENV] = self.lighthouse.address
        launcher.replace_dead = self.replace_dead
        print(
            f"  torchft: Lighthouse {self.lighthouse.address} ({home.describe()}, pid {self.lighthouse.proc.pid}), "
            f"{run.cluster.world_size // st.group_size} replica group(s) of {st.group_size} rank(s)",
            flush=True,
        )

    def replace_dead(self, rank: int, code: int, codes: Mapping[int, int | None]) -> bool:
        """torchrun's per-group restart: restart ``rank``'s whole group (stop its live members first)."""
        if not self.lighthouse.alive():
            return False  # nothing to rejoin: the run ends with the failure
        if self.launcher.replacements >= self.run.strategy.max_restarts:
            return False
        layout = GroupLayout(rank, self.run.cluster.world_size, self.group_size)
        g = layout.group
        pending = self._pending.get(g)
        if not pending:  # a new failure of this group: a new generation, every member restarts
            finished = [m for m in layout.members() if m != rank and codes.get(m) == 0]
            if finished:
                # The group cannot restart whole: a finished rank is not restarted (only failed ones are), and
                # the restarted members would wait for it at the group's rendezvous until the run timed out.
                print(
                    f"  torchft: replica group {g} lost rank {rank} (exit {code}) after its rank(s) {finished} "
                    "finished; not restarting the group",
                    flush=True,
                )
                return False
            self.restarts[g] = self.restarts.get(g, 0) + 1
            pending = self._pending[g] = set(layout.members())
            self._set(gen_key(self.launcher.token, g), str(self.restarts[g]).encode())
            for mate in layout.members():
                if mate != rank and codes.get(mate) is None:
                    self.launcher.signal_rank(mate, signal.SIGKILL)
            print(
                f"  torchft: replica group {g} lost rank {rank} (exit {code}); restarting the group "
                f"(generation {self.restarts[g]})",
                flush=True,
            )
        pending.discard(rank)
        return True

    def _set(self, key: str, value: bytes) -> None:
        fn = self.launcher.store_setter()
        fn(key, value)

    def row_columns(self) -> dict[str, Any]:
        """torchft's columns of the row: quorum and heal times and short steps (from the events), the group
        restarts, and the Lighthouse's address (where it ran) and log."""
        run_dir = Path(self.launcher.run_dir)
        events = read_events(run_dir) if (run_dir / "events").exists() else []
        return {
            **torchft_columns(events),
            "torchft_group_restarts": sum(self.restarts.values()),
            "torchft_lighthouse": self.lighthouse.address,
            "torchft_lighthouse_log": str(self.lighthouse.log_path),
        }

    def close(self) -> None:
        self.lighthouse.close()
