"""Host-side housekeeping of network namespaces: running `ip`, probing availability, finding and removing
the leftovers of a job that died (``cleanup_stale``). ``harness.faults.netns`` builds the topology itself.

Every process of a job carries its prefix in ``TAG_ENV``, and every name it creates starts with that
prefix, so a leftover can always be traced to its job.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from harness.faults import registry
from harness.faults.addressing import PREFIX_RE, check_prefix, new_prefix
from harness.faults.snapshot_roots import job_roots, remove_job_roots, root_prefixes

TAG_ENV = "ACCELPACT_NETNS"  # every process of the job carries its prefix here, so leftovers can be found


class NetnsError(RuntimeError):
    """A namespace operation failed; the message names the command and what to do."""


# --------------------------------------------------------------------------------------------------
# Running commands


def _run(argv: Sequence[str], timeout_s: float = 15.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in {timeout_s} s") from e
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (rc {done.returncode}): {done.stderr.strip()}")
    return done


def _ip_batch(netns: str | None, lines: Sequence[str]) -> None:
    """Several `ip` commands in one process (inside ``netns`` when given)."""
    argv = ["ip", *(("-n", netns) if netns else ()), "-batch", "-"]
    try:
        done = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in 15 s") from e
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip()} (commands: {lines})")


# --------------------------------------------------------------------------------------------------
# Availability

_AVAILABLE: tuple[bool, str] | None = None


def namespaces_available() -> tuple[bool, str]:
    """(True, how) when this process can build network namespaces, else (False, why and what still works).

    Probes by creating and deleting one throwaway namespace; the answer is cached per process."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = _probe()
    return _AVAILABLE


def _probe() -> tuple[bool, str]:
    specs = [registry.get(k) for k in registry.kinds()]
    netns_kinds = ", ".join(s.kind for s in specs if s.needs_netns)
    still = f"Fault kinds that need no namespaces still work: {', '.join(s.kind for s in specs if s.injects and not s.needs_netns)}."
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are Linux-only (this is {sys.platform}). {still}"
    missing = [tool for tool in ("ip", "tc", "ss") if shutil.which(tool) is None]
    if missing:
        return False, f"{', '.join(missing)} not found (install iproute2). {still}"
    if os.geteuid() != 0:
        userns = subprocess.run(["unshare", "-Urn", "true"], capture_output=True).returncode == 0
        hint = (
            "unprivileged user namespaces (`unshare -Urn`) do work here, but this harness builds its "
            "namespaces with `ip netns`, which needs real root"
            if userns
            else "unprivileged user namespaces (`unshare -Urn`) are not allowed here either"
        )
        return False, f"network-namespace faults ({netns_kinds}) need root; {hint}. Run as root. {still}"
    probe = f"{new_prefix()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, f"`ip netns add` failed as root: {made.stderr.strip()}. {still}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, "running as root: `ip netns` works"


# --------------------------------------------------------------------------------------------------
# Finding and removing what a job left behind


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_prefixes() -> list[str]:
    """Job prefixes that own at least one namespace or snapshot root right now (live or stale)."""
    found = {name.split("-", 1)[0] for name in _netns_list() if "-" in name}
    return sorted({p for p in found if PREFIX_RE.match(p)} | set(root_prefixes()))


def _tagged_pids(prefix: str) -> set[int]:
    """Processes of this job found by their tag: ``$ACCELPACT_NETNS`` == prefix, or the job's store server
    (``--tag prefix``). Never this process or its ancestors (a shell that typed the prefix is not the job)."""
    import psutil  # lazy: psutil

    spared = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    pids: set[int] = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] in spared:
            continue
        try:
            argv = proc.info["cmdline"] or []
            is_server = "harness.faults.store_server" in argv and prefix in argv
            if is_server or proc.environ().get(TAG_ENV) == prefix:
                pids.add(proc.info["pid"])
        except (psutil.Error, OSError):
            continue
    return pids


def _ns_pids(names: Sequence[str]) -> set[int]:
    pids: set[int] = set()
    for name in names:
        out = _run(["ip", "netns", "pids", name], check=False).stdout
        pids.update(int(tok) for tok in out.split() if tok.isdigit())
    pids.discard(os.getpid())
    return pids


def leftovers(prefix: str) -> list[str]:
    """Everything of job ``prefix`` still on the machine: namespaces, root-namespace links, processes."""
    check_prefix(prefix)
    found = [f"netns {n}" for n in _netns_list() if n.startswith(prefix + "-")]
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if prefix in line]
    qdiscs = _run(["tc", "qdisc", "show"], check=False).stdout
    found += [f"qdisc {line.strip()}" for line in qdiscs.splitlines() if prefix in line]
    found += [f"process {pid}" for pid in sorted(_tagged_pids(prefix))]
    found += [f"snapshots {root}" for root in job_roots(prefix)]
    return found


def cleanup_stale(prefix: str) -> list[str]:
    """Kill every process of job ``prefix``, delete its namespaces and its hosts' snapshot directories;
    return what was removed.

    For a job that died without tearing down (SIGKILL). Safe to call on a live job only if you mean to
    end it."""
    check_prefix(prefix)
    names = [n for n in _netns_list() if n.startswith(prefix + "-")]
    pids = _ns_pids(names) | _tagged_pids(prefix)
    removed = [f"process {pid}" for pid in sorted(pids)]
    _kill_and_wait(pids)
    for name in names:
        _run(["ip", "netns", "del", name], check=False)
    removed += [f"netns {n}" for n in names]
    removed += remove_job_roots(prefix)  # the hosts' snapshot directories, after their writers are dead
    return removed


def _kill_and_wait(pids: set[int], timeout_s: float = 5.0) -> None:
    import psutil  # lazy: psutil

    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=timeout_s)


# --------------------------------------------------------------------------------------------------
# Teardown on every exit path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.faults.netns list | leftovers PREFIX | cleanup PREFIX [PREFIX ...]``"""
    parser = argparse.ArgumentParser(
        prog="python -m harness.faults.netns", description="find and remove jobs' namespaces"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="job prefixes that own namespaces now (live or stale)")
    sub.add_parser("leftovers", help="what a job left behind").add_argument("prefix")
    sub.add_parser("cleanup", help="kill a job's processes and delete its namespaces").add_argument("prefix", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(list_prefixes()))
    elif args.cmd == "leftovers":
        print("\n".join(leftovers(args.prefix)))
    else:
        for prefix in args.prefix:
            for item in cleanup_stale(prefix):
                print(f"removed {item}")
    return 0
