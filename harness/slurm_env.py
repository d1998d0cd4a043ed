"""What a run under Slurm learns from Slurm's environment, instead of from this machine (pure but for
one optional ``scontrol`` call).

Under ``cluster.launch=srun`` (``cluster=slurm``) the harness parent runs inside an allocation (the job
that ``hydra/launcher=submitit_slurm`` submits with ``sbatch``, or ``salloc``) and starts every rank with
one ``srun`` step across the allocation's nodes, ``world_size / nodes`` tasks per node (one per GPU on
GPU nodes):

- the parent hosts the control store on the allocation's first node (``SLURM_JOB_NODELIST`` expanded by
  ``scontrol show hostnames``): that name is ``master_addr``, reachable from every node (run outside an
  allocation, e.g. a sweep's fault-free reference, srun allocates for itself and the store is here);
- each rank reads its rank, world size and local rank from the task's ``SLURM_PROCID``,
  ``SLURM_NTASKS`` and ``SLURM_LOCALID`` (``rank_identity``): the parent never numbers them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

AUTO = "auto"  # cluster.master_addr: the allocation's first node


class SlurmEnvError(RuntimeError):
    """Slurm's environment does not describe the allocation the config asks for; the message says how."""


def in_allocation(env: Mapping[str, str] = os.environ) -> bool:
    return "SLURM_JOB_ID" in env


def expand_nodelist(nodelist: str) -> list[str]:
    """``node[01-03,07],gpu5`` -> ``['node01', 'node02', 'node03', 'node07', 'gpu5']``.

    Slurm's own expansion (``scontrol show hostnames``) when scontrol is here, else this parser of the
    compressed form (one bracket group per name, zero-padded ranges kept)."""
    if shutil.which("scontrol"):
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and done.stdout.split():
            return done.stdout.split()
    return parse_nodelist(nodelist)


def parse_nodelist(nodelist: str) -> list[str]:
    hosts: list[str] = []
    # Split on commas outside brackets.
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            hosts.append(item)
            continue
        head, ranges, tail = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{head}{lo}{tail}")
                continue
            width = len(lo)
            hosts += [f"{head}{i:0{width}d}{tail}" for i in range(int(lo), int(hi) + 1)]
    return hosts


def rank_identity(env: Mapping[str, str] = os.environ) -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) of an ``srun`` task from ``SLURM_PROCID`` / ``SLURM_NTASKS`` /
    ``SLURM_LOCALID``; None outside a Slurm step."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
    return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0"))


def resolve_cluster(cluster, env: Mapping[str, str] = os.environ):
    """``cluster`` (a ClusterConfig with launch=srun) with ``master_addr=auto`` resolved.

    Inside an allocation (SLURM_JOB_ID; the job submitit submits): its first node, after checking the
    allocation has the nodes the config spreads ranks over. Outside one (a fault sweep's reference, run
    by the submitting process): this host's name, and srun makes an allocation of its own for the ranks,
    which then reach the control store here."""
    if shutil.which("srun") is None:
        raise SlurmEnvError(
            f"cluster={cluster.name} starts its ranks with srun, which is not on PATH here: run it "
            "where Slurm's client commands are installed (this machine: `make slurm-up`)"
        )
    if not in_allocation(env):
        master = socket.getfqdn() if cluster.master_addr == AUTO else cluster.master_addr
        return dataclasses.replace(cluster, master_addr=master)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    hosts = expand_nodelist(nodelist) if nodelist else []
    if len(hosts) < cluster.nodes:
        raise SlurmEnvError(
            f"cluster.nodes={cluster.nodes} but the allocation (SLURM_JOB_NODELIST={nodelist!r}) has {len(hosts)} "
            f"node(s); submit with hydra.launcher.nodes={cluster.nodes} or set cluster.nodes={max(len(hosts), 1)}"
        )
    master = hosts[0] if cluster.master_addr == AUTO else cluster.master_addr
    return dataclasses.replace(cluster, master_addr=master)


def srun_argv(cluster, argv: Sequence[str], log_dir: Path) -> list[str]:
    """One ``srun`` step that starts every rank: ``world_size`` tasks over ``nodes`` nodes.

    ``--overlap``: the step shares the CPUs of the step the parent itself runs in (submitit starts the
    parent with srun too), so it never waits for them. ``--kill-on-bad-exit=0``: a rank that dies must
    not take the survivors down with it (in-memory recovery, or their fallback event, needs them).
    ``--output`` keeps one log per rank (``%t`` is the task id = rank), as the local launcher does."""
    per_node = cluster.world_size // cluster.nodes
    return [
        "srun",
        "--overlap",
        f"--nodes={cluster.nodes}",
        f"--ntasks={cluster.world_size}",
        f"--ntasks-per-node={per_node}",
        "--kill-on-bad-exit=0",
        "--unbuffered",
        "--export=ALL",
        "--open-mode=append",
        "--job-name=accelpact-ranks",
        f"--output={log_dir}/rank%t.log",
        *argv,
    ]
