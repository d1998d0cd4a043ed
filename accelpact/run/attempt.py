"""One attempt of a job on one node (accelpact.run.agent): its ranks, and which of their deaths get a replacement.

:func:`why_not_replaced` is the rule (docs/launcher.md): only a rank killed by a signal is replaced,
within ``--max-replacements``, and only while a survivor can heal it (:func:`survivors`). A rank that
ended the run (:func:`ended_run`: its guard's closed mark) is never replaced. The agent's store reads
come in as ``peek(key)``: the key's value, or None when it is not set.

A rank that exits non-zero after it ended the run is reported, never replaced, and gets no death
notice (:func:`note_ended`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelpact.run.env import job_token
from accelpact.run.workers import Workers, describe_exit

if TYPE_CHECKING:
    from accelpact.run.agent_config import AgentConfig

__all__ = ["Attempt", "why_not_replaced", "survivors", "ended_run", "note_ended"]

Peek = Callable[[str], "bytes | None"]


@dataclass
class Attempt:
    """One attempt's ranks on this node (their processes: accelpact.run.workers, shared with the harness)."""

    number: int
    workers: Workers = field(default_factory=Workers)
    spares: list[tuple[str, Any]] = field(default_factory=list)  # idle hot spares: (store key, Popen)
    done_posted: bool = False
    modules: int | None = None  # the template's preload request of what the ranks loaded (its id), once sent
    ended: dict[int, int] = field(default_factory=dict)  # rank -> exit code, of ranks that exited after ending the run
    replaced: dict[int, int] = field(default_factory=dict)  # rank -> pid of its replacement started in this attempt

    @property
    def procs(self) -> dict[int, Any]:  # global rank -> Popen or ForkedRank
        return self.workers.procs


def why_not_replaced(cfg: AgentConfig, att: Attempt, rank: int, code: int, replacements: int, peek: Peek) -> str | None:
    """None when dead ``rank`` (exit ``code``) is to be replaced, this agent having started ``replacements``
    so far; else why not (the survivors and the user read it)."""
    pid = att.procs[rank].pid
    if cfg.replacement == "none":
        return f"rank {rank} (pid {pid}) exited with code {describe_exit(code)} and --replacement=none"
    if code >= 0:
        return (
            f"rank {rank} (pid {pid}) exited with code {describe_exit(code)} on its own (a process that "
            "failed by itself would fail again; only a rank killed by a signal is replaced): see its output"
        )
    if replacements >= cfg.max_replacements:
        return (
            f"rank {rank} (pid {pid}) was killed ({describe_exit(code)}) but this agent already started "
            f"{replacements} replacement(s) and --max-replacements={cfg.max_replacements} allows "
            "no more"
        )
    if cfg.nnodes == 1 and not survivors(cfg, att, rank, peek):
        return (
            f"every rank is dead or a replacement still waiting for survivors (rank {rank} with "
            f"{describe_exit(code)}): no survivor to heal from"
        )
    return None


def survivors(cfg: AgentConfig, att: Attempt, dead: int, peek: Peek) -> list[int]:
    """The ranks besides ``dead`` whose live process can heal it: a rank that trained, or a replacement the
    survivors already sent a plan. A replacement still waiting for one would wait for its plan's timeout
    when a whole job dies across two polls, so it does not count."""
    from accelpact.recovery.heal_wait import plan_key_of

    token = job_token(cfg.run_id, att.number)
    return [
        r
        for r, p in att.procs.items()
        if r != dead
        and p.poll() is None
        and (r not in att.replaced or peek(plan_key_of(token, r, att.replaced[r])) is not None)
    ]


def ended_run(cfg: AgentConfig, att: Attempt, rank: int, peek: Peek) -> int | None:
    """The step at which ``rank`` ended the run (its guard's closed mark, this attempt), or None."""
    from accelpact.recovery.heal_wait import closed_key_of

    raw = peek(closed_key_of(job_token(cfg.run_id, att.number), rank))
    return None if raw is None else int(raw.decode() or -1)


def note_ended(cfg: AgentConfig, att: Attempt, exited: dict[int, int], peek: Peek) -> list[tuple[int, int, int]]:
    """The ranks of ``exited`` (rank -> exit code) that exited non-zero after ending the run, each once, as
    (rank, code, step): recorded in ``att.ended`` and as noticed, so reaping skips them."""
    ended = []
    for rank, code in sorted(exited.items()):
        if code == 0 or rank in att.ended or rank in att.workers.noticed:
            continue
        step = ended_run(cfg, att, rank, peek)
        if step is None:
            continue
        att.ended[rank] = code
        att.workers.noticed.add(rank)  # reap() skips it: nothing is left to heal
        ended.append((rank, code, step))
    return ended
