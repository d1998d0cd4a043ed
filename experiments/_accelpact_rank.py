"""One rank of an accelpact experiment session: runs a list of jobs and writes what it measured.

Launched by experiments/_accelpact_session.py as ``python -m experiments._accelpact_rank <cfg.json>``.
Two job kinds:

- ``rebind``: for each model depth, build a tiny-width Mistral under FSDP2 or FSDP1, run one step
  (FSDP initialises lazily), build the binding table, then time ``rebinds`` rebinds back and forth
  between the live groups and a second real set of groups with the same members;
- ``train``: N steps of the same model, either a plain loop (the fault-free reference) or under an
  attached guard with armed faults (accelpact.testing.FaultInjector: real socket resets, stalls,
  resets during recovery); records every loss, every recovery event, the injections, per-step
  resources (threads, fds, TCP sockets, RSS), torch._dynamo's counters when compiled, and saves
  every local parameter shard and optimizer-state tensor for a bit-identity comparison.

The experiments share this so the numbers come from one code path; tests keep their own copy
(tests/accelpact/_rank.py) so that changing an experiment can never weaken a test.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accelpact import testing as fault_testing  # noqa: E402
from accelpact.bindings import BindingTable  # noqa: E402
from accelpact.control import ControlChannel, ControlConfig  # noqa: E402
from accelpact.guard import attach, clip_gradients  # noqa: E402

SEED = 1234


def model_config(job: dict) -> dict[str, int]:
    """mistral_tiny width unless the job overrides a field."""
    base = {"vocab": 4096, "hidden": 256, "inter": 768, "layers": 4, "heads": 8, "kv_heads": 4,
            "seq": 64, "batch": 2}
    base.update({k: v for k, v in job.get("model", {}).items()})
    return base


def build(flavour: str, m: dict[str, int], compile_backend: str | None = None):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(SEED)
    config = MistralConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["inter"],
        num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
        max_position_embeddings=m["seq"] * 2, tie_word_embeddings=False,
    )
    model = MistralForCausalLM(config).float()
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
            if compile_backend:
                layer.compile(backend=compile_backend)
        fully_shard(model)
        root, middle = model, model.model.layers[m["layers"] // 2]
    elif flavour in ("fsdp1", "fsdp1_orig"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({MistralDecoderLayer}),
                     use_orig_params=(flavour == "fsdp1_orig"), device_id=torch.device("cpu"))
        root, middle = model, model.module.model.layers[m["layers"] // 2]
    else:
        raise ValueError(f"unknown flavour {flavour!r}: use fsdp2, fsdp1 or fsdp1_orig")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return model, optimizer, root, middle


def batch_for(step: int, rank: int, m: dict[str, int]) -> torch.Tensor:
    """Deterministic tokens: a pure function of (seed, step, rank)."""
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step * 1009 + rank)
    return torch.randint(0, m["vocab"], (m["batch"], m["seq"]), generator=g)


def local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def state_of(model, optimizer) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = local(p)
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optim/{name}/{k}"] = local(v)
    return out


def resources(exclude_ports) -> dict[str, float]:
    import psutil

    gc.collect()
    proc = psutil.Process()
    return {"threads": proc.num_threads(), "fds": proc.num_fds(),
            "tcp": len(fault_testing.tcp_socket_inodes(exclude_ports)),
            "rss_mib": proc.memory_info().rss / 2**20}


def dynamo_counters() -> dict[str, int]:
    import torch._dynamo.utils as dyn_utils

    return {f"{group}/{key}": int(n) for group, d in dyn_utils.counters.items() for key, n in d.items()
            if isinstance(n, int)}


def step_fn_for(model):
    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        return loss.detach()

    return step_fn


# ----------------------------------------------------------------------------- jobs


def job_rebind(job: dict, cfg: dict, control: ControlChannel) -> dict:
    rank = cfg["rank"]
    out: dict[str, Any] = {"by_depth": {}}
    for depth in job["depths"]:
        m = model_config({"model": {**job.get("model", {}), "layers": depth}})
        model, opt, _root, _middle = build(job["flavour"], m)
        step_fn = step_fn_for(model)
        step_fn(batch_for(0, rank, m))  # FSDP builds its per-group state lazily, on the first forward
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        table = BindingTable.build(model, opt)
        build_s = time.perf_counter() - t0
        olds = list(table.groups)
        twins = [dist.new_group(sorted(dist.get_process_group_ranks(g)), backend="gloo") for g in olds]
        fwd, back = dict(zip(olds, twins)), dict(zip(twins, olds))
        times = []
        for i in range(job["rebinds"]):
            t = time.perf_counter()
            table.rebind(fwd if i % 2 == 0 else back)
            times.append(time.perf_counter() - t)
        if job["rebinds"] % 2:
            table.rebind(back)
        times.sort()
        out["by_depth"][str(depth)] = {
            "slots": len(table.slots), "groups": len(olds), "table_build_s": build_s,
            "median_s": statistics.median(times), "p10_s": times[len(times) // 10],
            "p90_s": times[(len(times) * 9) // 10], "n": len(times),
        }
        for g in twins:
            dist.destroy_process_group(g)
        del table, model, opt, olds, twins, fwd, back
        gc.collect()
    return out


def job_train(job: dict, cfg: dict, control: ControlChannel) -> dict:
    rank = cfg["rank"]
    m = model_config(job)
    model, optimizer, root, middle = build(job["flavour"], m, job.get("compile"))
    injector = fault_testing.FaultInjector(exclude_ports=cfg["exclude_ports"])
    injector.install(root, middle)
    for f in job.get("faults", []):
        if rank in f["ranks"]:
            injector.arm(f["step"], f["phase"], f.get("action", "reset"), stall_s=f.get("stall_s", 0.0))
    step_fn = step_fn_for(model)
    result: dict[str, Any] = {"events": [], "error": None, "resources": [], "step_s": []}
    guard = None
    if job.get("guard", True):
        guard = attach(model, optimizer, control, max_grad_norm=1.0,
                       pg_timeout=timedelta(seconds=cfg["pg_timeout_s"]))
        guard.phase_hooks.append(injector.on_phase)
    if job.get("compile"):
        from torch import _dynamo

        _dynamo.reset()  # a fresh model per job: start from an empty cache
    losses: list[torch.Tensor] = []
    t_job = time.time()
    try:
        for step in range(job["steps"]):
            tokens = batch_for(step, rank, m)
            t = time.perf_counter()
            if guard is not None:
                losses.append(guard.step(step_fn, tokens))
            else:
                injector.begin_step(step)
                losses.append(step_fn(tokens))
                clip_gradients(model, 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            result["step_s"].append(time.perf_counter() - t)
            if job.get("track_resources"):
                if step in (0, job["steps"] - 1):
                    # The leak figure is last minus first: take both at a quiet point, once every
                    # rank is done with the step, so no rank samples its sockets mid-handshake (one
                    # unsynchronised baseline read 11 fds / 0 sockets where its steady state was 15 / 3).
                    control.barrier(f"resources/{job['name']}/{step}", control.generation)
                    time.sleep(0.2)
                result["resources"].append({"step": step, "recoveries": len(guard.events) if guard else 0,
                                            **resources(cfg["exclude_ports"])})
            if step == 0 and job.get("compile"):
                result["compile_after_warmup"] = dynamo_counters()
    except BaseException as exc:  # noqa: BLE001 - reported to the driver
        result["error"] = {"type": type(exc).__name__, "message": str(exc)[:2000],
                           "elapsed_s": time.time() - t_job, "traceback": traceback.format_exc()[-4000:]}
    if guard is not None:
        result["events"] = [e.to_dict() for e in guard.events]
        result["committed_step"] = guard.committed_step
        guard.close()
    if job.get("compile"):
        result["compile_at_end"] = dynamo_counters()
    injector.remove()
    result["fired"] = [{"step": f.step, "phase": f.phase, "action": f.action, "at": f.fired_at}
                       for f in injector.fired]
    result["losses"] = [float(x) for x in losses]
    if result["error"] is None and job.get("save_state", True):
        torch.save({"losses": losses, "state": state_of(model, optimizer)},
                   Path(cfg["out_dir"]) / f"{job['name']}.rank{rank}.pt")
    del model, optimizer, guard, root, middle
    if job.get("track_resources") and result["error"] is None:
        result["resources_after_teardown"] = resources(cfg["exclude_ports"])
    return result


JOBS = {"rebind": job_rebind, "train": job_train}


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    rank, world = cfg["rank"], cfg["world_size"]
    store = dist.PrefixStore(f"{cfg['job_token']}/init", dist.TCPStore(
        cfg["host"], cfg["port"], world, is_master=False, timeout=timedelta(seconds=300)))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["pg_timeout_s"]))
    control = ControlChannel.connect(ControlConfig(
        host=cfg["host"], port=cfg["port"], rank=rank, world_size=world, job_token=cfg["job_token"],
        deadline_s=cfg["control_deadline_s"]))
    cfg["exclude_ports"] = [cfg["port"]]
    results: dict[str, Any] = {}
    for job in cfg["jobs"]:
        if job.get("barrier", True):
            # Start every job together: start-up skew on a loaded host must not look like a hang.
            control.barrier(f"job/{job['name']}", control.generation)
        t0 = time.time()
        try:
            results[job["name"]] = JOBS[job["kind"]](job, cfg, control)
        except BaseException as exc:  # noqa: BLE001
            results[job["name"]] = {"error": {"type": type(exc).__name__, "message": str(exc)[:2000],
                                              "traceback": traceback.format_exc()[-4000:]}}
        results[job["name"]]["wall_s"] = time.time() - t0
        Path(cfg["out_dir"], f"results.rank{rank}.json").write_text(json.dumps(results, default=str))
        if results[job["name"]].get("error"):
            break  # after an unrecoverable error the process group is gone
    os._exit(0)  # skip gloo teardown of retired generations


if __name__ == "__main__":
    main()
