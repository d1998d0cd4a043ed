"""GPU check of the NCCL path: N ranks on N GPUs, one real communicator abort mid-backward, recovered,
and every parameter and optimizer-state shard compared with a fault-free run of the same seed.

NOT RUN YET: written on a machine without a GPU. It is the prepared check for a GPU machine; it
imports and answers ``--help`` on CPU and exits with a clear message when CUDA is missing.

    python benchmarks/gpu_check.py              # all visible GPUs (needs >= 2)
    python benchmarks/gpu_check.py --nproc 2 --pg-timeout-s 20

Why N GPUs: NCCL refuses two ranks on one device (duplicate GPU), so a single GPU cannot host the
check. Each rank binds ``cuda:<rank>`` (``init_process_group('nccl', device_id=...)``) with
``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (abort the communicator, keep the process), then:

1. trains a small FSDP2 MLP stack for ``--steps`` steps without a guard and keeps every local
   parameter and optimizer-state shard (the fault-free reference);
2. builds the same model from the same seed, attaches an accelpact guard, and trains again; on
   ``--fault-rank`` at ``--fault-step`` a gradient hook in the middle block (mid-backward, before
   that block's reduce-scatter) aborts this rank's NCCL communicator (ncclCommAbort). That rank fails
   at once; its peers fail when NCCL reports the remote error or, at the latest, when the watchdog
   times the collective out after ``--pg-timeout-s``;
3. prints one row per rank: recovered?, decision, detection and recovery time, and whether every
   shard is bit-identical to the reference. Exit 0 only if every rank recovered and matched.

``--data-plane reconfigure`` (torch >= 2.15, whose default ``nccl`` is the torchcomms-based backend):
the default group is created with ``enable_reconfigure=True`` and connected by a first reconfigure,
the fault is this rank's communicator abort (on 2.15's ``nccl`` that is ``ncclCommRevoke``), and the
guard must recover through the reconfigure path: the SAME group object reconfigured in place, no
rebinding. Every rank's recovery event must say ``reconfigure`` (a fall back to rebuild-and-rebind
fails the check, with the reason the event gives). ``--data-plane rebind`` (default) is the 2.13 path.

    python benchmarks/gpu_check.py --data-plane reconfigure      # torch 2.15 + NCCL >= 2.28.7

Budget: NCCL start-up plus two short runs plus one detection of at most ``--pg-timeout-s``: about
1-2 minutes with the defaults; the parent gives up after ``--timeout-s`` (default 540 s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nproc", type=int, default=0, help="ranks, one per GPU (default: all visible GPUs, >= 2)")
    p.add_argument("--steps", type=int, default=6, help="training steps per run (default 6)")
    p.add_argument("--fault-step", type=int, default=2, help="step whose backward is hit (default 2)")
    p.add_argument("--fault-rank", type=int, default=1, help="rank whose communicator is aborted (default 1)")
    p.add_argument("--layers", type=int, default=8, help="MLP blocks, one FSDP2 unit each (default 8)")
    p.add_argument("--hidden", type=int, default=1024, help="block width (default 1024)")
    p.add_argument(
        "--pg-timeout-s",
        type=float,
        default=30.0,
        help="NCCL collective timeout: the latest a peer notices the fault (default 30)",
    )
    p.add_argument("--timeout-s", type=float, default=540.0, help="give up on the ranks after this (default 540)")
    p.add_argument(
        "--data-plane",
        choices=("rebind", "reconfigure"),
        default="rebind",
        help="the recovery path the guard must take (reconfigure: torch >= 2.15; default rebind)",
    )
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- rank side


def _build(args, device):
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1234)
    blocks = [nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.GELU()) for _ in range(args.layers)]
    model = nn.Sequential(*blocks, nn.Linear(args.hidden, 16)).to(device)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), blocks[args.layers // 2]


def _batch(args, step: int, rank: int, device):
    import torch

    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x, y = torch.randn(32, args.hidden, generator=g), torch.randn(32, 16, generator=g)
    return x.to(device), y.to(device)


def _shards(model, optimizer) -> dict:
    """Every local parameter and optimizer-state shard, copied to the CPU."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return (t.to_local() if isinstance(t, DTensor) else t).detach().cpu().clone()

    out = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = local(p)
        for k, v in optimizer.state.get(p, {}).items():
            if hasattr(v, "shape"):
                out[f"optim/{name}/{k}"] = local(v)
    return out


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import accelpact
    from accelpact.backends import NcclBackend
    from accelpact.control import ControlChannel, ControlConfig

    NcclBackend.configure()  # before init_process_group: the watchdog must not kill the process
    rank, world = args.rank, args.nproc
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.pg_timeout_s)
    store = dist.TCPStore("127.0.0.1", args.port, world, is_master=False, timeout=datetime.timedelta(seconds=120))
    init_store = dist.PrefixStore(f"{args.token}/init", store)
    dist.init_process_group(
        "nccl", store=init_store, rank=rank, world_size=world, timeout=timeout, **init_kwargs(args.data_plane, device)
    )
    if args.data_plane == "reconfigure":
        connect_in_place(dist.group.WORLD, dist.PrefixStore("connect", init_store), rank)

    def step_fn_for(model):
        def step_fn(b):
            loss = F.mse_loss(model(b[0]), b[1])
            loss.backward()
            return loss.detach()

        return step_fn

    # 1. Fault-free reference: the same math as guard.step.
    model, optimizer, _ = _build(args, device)
    for step in range(args.steps):
        step_fn_for(model)(_batch(args, step, rank, device))
        accelpact.clip_gradients(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    reference = _shards(model, optimizer)
    del model, optimizer
    torch.cuda.synchronize()

    # 2. Guarded run with one communicator abort mid-backward on the fault rank.
    model, optimizer, middle = _build(args, device)
    control = ControlChannel.connect(
        ControlConfig("127.0.0.1", args.port, rank, world, args.token, deadline_s=args.pg_timeout_s * 3 + 60)
    )
    guard = accelpact.attach(
        model, optimizer, control, max_grad_norm=1.0, pg_timeout=timeout, data_plane=args.data_plane
    )
    state = {"step": -1, "armed": rank == args.fault_rank, "fired_at": None}

    def on_phase(phase: str, step: int) -> None:
        if phase == "step_start":
            state["step"] = step

    def abort_hook(grad):
        if state["armed"] and state["step"] == args.fault_step:
            state["armed"] = False
            state["fired_at"] = time.time()
            for pg in guard.process_groups:  # ncclCommAbort (2.15 nccl: ncclCommRevoke): what a dying link leaves
                pg._get_backend(device).abort()
        return grad

    def install(module, inputs):
        if torch.is_grad_enabled() and state["armed"] and state["step"] == args.fault_step:
            for t in inputs:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(abort_hook)
                    break

    middle.register_forward_pre_hook(install)
    guard.phase_hooks.append(on_phase)
    guard.injection_clock = lambda t_start: state["fired_at"] if (state["fired_at"] or 0) >= t_start else None
    error = None
    try:
        for step in range(args.steps):
            guard.step(step_fn_for(model), _batch(args, step, rank, device))
    except BaseException as exc:  # noqa: BLE001 - reported in the table
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    result = {
        "rank": rank,
        "error": error,
        "committed_step": guard.committed_step,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "events": [e.to_dict() for e in guard.events],
        "fired": state["fired_at"] is not None,
    }
    if error is None:
        got = _shards(model, optimizer)
        result["shards"] = len(reference)
        result["differ"] = sorted(k for k in reference if k not in got or not torch.equal(reference[k], got[k]))
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # skip NCCL teardown of aborted generations


def init_kwargs(data_plane: str, device) -> dict:
    """``init_process_group`` keywords for the path: the reconfigure regime leaves the device to the
    reconfigure (2.15's nccl picks none at creation in that regime), the rebuild path binds it."""
    if data_plane == "reconfigure":
        return {"enable_reconfigure": True}
    return {"device_id": device}


def connect_in_place(pg, store, rank: int) -> float:
    """A group created in the reconfigure regime has no communicator yet: the first reconfigure makes it
    (the same handle exchange a recovery uses, accelpact.backends.reconfigure)."""
    from accelpact.backends import generations as comm
    from accelpact.backends.reconfigure import reconfigure_group

    return reconfigure_group(pg, comm.group_spec(pg), store, rank)


def path_problem(data_plane: str, api: bool, cuda: bool, devices: int, nproc: int) -> str | None:
    """Why this check cannot run as asked (None: it can). Pure: the parent's refusal, unit-tested."""
    if not cuda:
        return (
            "no CUDA device visible (torch.cuda.is_available() is False). This check needs a machine with >= 2 "
            "GPUs and a CUDA build of torch; nothing was run."
        )
    if nproc < 2 or nproc > devices:
        return (
            f"needs 2 <= --nproc <= visible GPUs ({devices}), got {nproc}. NCCL refuses two ranks on one GPU, "
            "so a single-GPU machine cannot run this check."
        )
    if data_plane == "reconfigure" and not api:
        return (
            "--data-plane reconfigure needs torch >= 2.15 (dist._reconfigure); this torch has no reconfigure "
            "API. Run with --data-plane rebind, or install torch 2.15 (make setup-torch215)"
        )
    return None


def judge(results: list[dict], data_plane: str) -> tuple[bool, list[str]]:
    """Every rank recovered, took ``data_plane``'s path, and is bit-identical: (verdict, one line per rank)."""
    ok = True
    lines = []
    for r in results:
        ev = r.get("events") or []
        differ = r.get("differ")
        paths = sorted({e.get("data_plane", {}).get("path", "rebind") for e in ev})
        identical = "n/a" if differ is None else ("yes" if not differ else f"NO ({len(differ)})")
        row_ok = r.get("error") is None and len(ev) >= 1 and differ == [] and paths == [data_plane]
        ok &= row_ok
        action = ev[0]["decision"]["action"] if ev else "-"
        detect = f"{ev[0]['detection_s'] * 1e3:.1f}" if ev else "-"
        recover = f"{ev[0]['total_s'] * 1e3:.1f}" if ev else "-"
        path = ",".join(paths) or "-"
        why = (
            ""
            if paths in ([data_plane], [])
            else f" path {path}: " + "; ".join(e.get("data_plane", {}).get("why", "") for e in ev)
        )
        lines.append(
            f"{r['rank']:>4} {('yes' if ev else 'no'):>9} {action:>12} {path:>11} {detect:>9} {recover:>10} "
            f"{r.get('committed_step', '-'):>9} {identical:>12}  {r.get('error') or ''}{why}"
        )
        if differ:
            lines.append(f"      first differing shards: {differ[:5]}")
    return ok, lines


# ----------------------------------------------------------------------------- parent side


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank is not None:
        rank_main(args)
        return 0
    import torch

    from accelpact.backends.reconfigure import api_available

    cuda = torch.cuda.is_available()
    n = args.nproc or (torch.cuda.device_count() if cuda else 0)
    problem = path_problem(args.data_plane, api_available(), cuda, torch.cuda.device_count() if cuda else 0, n)
    if problem is not None:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    if not (0 <= args.fault_rank < n and 0 <= args.fault_step < args.steps):
        print("gpu_check: --fault-rank must be a rank and --fault-step a step of the run", file=sys.stderr)
        return 2
    from accelpact.control import new_job_token, start_control_server

    server, port = start_control_server()
    token = new_job_token()
    base = [
        sys.executable,
        __file__,
        "--nproc",
        str(n),
        "--port",
        str(port),
        "--token",
        token,
        "--steps",
        str(args.steps),
        "--fault-step",
        str(args.fault_step),
        "--fault-rank",
        str(args.fault_rank),
        "--layers",
        str(args.layers),
        "--hidden",
        str(args.hidden),
        "--pg-timeout-s",
        str(args.pg_timeout_s),
        "--data-plane",
        args.data_plane,
    ]
    t0 = time.time()
    procs = [subprocess.Popen(base + ["--rank", str(r)], stdout=subprocess.PIPE, text=True) for r in range(n)]
    results = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, args.timeout_s - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        lines = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
        results.append(json.loads(lines[-1]) if lines else {"rank": r, "error": f"no result (exit {p.returncode})"})
    del server
    versions = sorted({f"torch {r.get('torch')}, NCCL {r.get('nccl')}" for r in results if r.get("torch")})
    print(
        f"\nNCCL recovery check ({'; '.join(versions) or 'versions unknown'}): {n} ranks, data plane "
        f"{args.data_plane}, fault (communicator abort) on rank {args.fault_rank} in the backward "
        f"of step {args.fault_step}, {args.steps} steps, {time.time() - t0:.0f} s\n"
    )
    print(
        f"{'rank':>4} {'recovered':>9} {'decision':>12} {'path':>11} {'detect ms':>9} {'recover ms':>10} "
        f"{'committed':>9} {'identical':>12}  error"
    )
    ok, lines = judge(results, args.data_plane)
    print("\n".join(lines))
    print(
        f"\nverdict: {'PASS' if ok else 'FAIL'} (every rank recovered through the {args.data_plane} path and is bit-identical "
        "to the fault-free run)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
