"""One rank of a recovery test session: runs a list of scenarios and writes what it saw.

Launched by tests/accelpact/_session.py as ``python _rank.py <config.json>``. Each scenario builds
the tiny Mistral model from the same seed, wraps it (FSDP2, or FSDP1 with use_orig_params True or
False, optionally with torch.compile'd blocks), runs N steps either as a plain loop (the fault-free
reference) or under a guard with armed faults, and saves every loss, every local parameter shard
and every optimizer-state tensor, plus the guard's recovery events, for the test to compare.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from accelpact import testing as fault_testing  # noqa: E402
from accelpact.guard import attach, clip_gradients  # noqa: E402
from accelpact.reset import ResetConfig  # noqa: E402

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, SEQ, BATCH = 4096, 256, 768, 4, 8, 4, 64, 2
SEED = 1234


def make_control(cfg: dict):
    from accelpact.control import ControlChannel, ControlConfig

    return ControlChannel.connect(ControlConfig(
        host=cfg["host"], port=cfg["port"], rank=cfg["rank"], world_size=cfg["world_size"],
        job_token=cfg["job_token"], deadline_s=cfg["control_deadline_s"],
    ))


def batch_for(step: int, rank: int) -> torch.Tensor:
    """Deterministic tokens: a pure function of (seed, step, rank)."""
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step * 1009 + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def build(flavour: str, compile_backend: str | None, layers: int = LAYERS):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(SEED)
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=layers,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ * 2,
        tie_word_embeddings=False,
    )
    model = MistralForCausalLM(config).float()
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
            if compile_backend:
                layer.compile(backend=compile_backend)
        fully_shard(model)
        root, middle = model, model.model.layers[layers // 2]
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({MistralDecoderLayer}),
                     use_orig_params=(flavour == "fsdp1_orig"), device_id=torch.device("cpu"))
        root, middle = model, model.module.model.layers[layers // 2]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    return model, optimizer, root, middle


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


def resources(exclude_ports) -> dict[str, int]:
    import psutil

    gc.collect()
    proc = psutil.Process()
    return {"threads": proc.num_threads(), "fds": proc.num_fds(),
            "tcp": len(fault_testing.tcp_socket_inodes(exclude_ports))}


def set_timeout(pg, seconds: float) -> None:
    pg._get_backend(torch.device("cpu"))._set_default_timeout(timedelta(seconds=seconds))


def dynamo_counters() -> dict[str, int]:
    """torch._dynamo's counters, flattened: compiled frames, unique graphs, recompiles, breaks."""
    import torch._dynamo.utils as dyn_utils

    return {f"{group}/{key}": int(n) for group, d in dyn_utils.counters.items() for key, n in d.items()
            if isinstance(n, int)}


def run_scenario(sc: dict, cfg: dict, control) -> dict:
    rank = cfg["rank"]
    model, optimizer, root, middle = build(cfg["flavour"], cfg.get("compile"))
    pg_timeout_s = sc.get("pg_timeout_s", cfg["pg_timeout_s"])
    if "pg_timeout_s" in sc:
        # A short collective timeout (the hang case) only after every rank has built its model:
        # start-up skew on a loaded 2-core host must not look like a hang.
        control.barrier(f"built/{sc['name']}", control.generation)
        set_timeout(dist.group.WORLD, pg_timeout_s)
    injector = fault_testing.FaultInjector(exclude_ports=cfg["exclude_ports"])
    injector.install(root, middle)
    for f in sc.get("faults", []):
        if rank in f["ranks"]:
            injector.arm(f["step"], f["phase"], f.get("action", "reset"), stall_s=f.get("stall_s", 0.0))

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        return loss.detach()

    losses: list[torch.Tensor] = []
    result: dict = {"events": [], "error": None}
    guard = None
    if sc.get("guard", True):
        guard = attach(model, optimizer, control, max_grad_norm=1.0,
                       pg_timeout=timedelta(seconds=pg_timeout_s),
                       verify_rebind=sc.get("verify_rebind", False),
                       reset=ResetConfig(**sc.get("reset", {})))
        guard.phase_hooks.append(injector.on_phase)
    if cfg.get("compile"):
        from torch import _dynamo

        _dynamo.reset()  # a fresh model per scenario: start each from an empty cache
    t0 = time.time()
    try:
        for step in range(sc["steps"]):
            tokens = batch_for(step, rank)
            if guard is not None:
                losses.append(guard.step(step_fn, tokens))
            else:  # the plain loop: the same math without a guard
                injector.begin_step(step)
                losses.append(step_fn(tokens))
                injector.maybe_fire("clip_allreduce", step)
                clip_gradients(model, 1.0)
                injector.maybe_fire("vote", step)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if step == 0 and sc.get("leak_check"):
                result["resources_before"] = resources(cfg["exclude_ports"])
            if step == 0 and cfg.get("compile"):
                result["compile_after_warmup"] = dynamo_counters()
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        result["error"] = {"type": type(exc).__name__, "message": str(exc),
                           "ranks": list(getattr(exc, "ranks", ()) or ()),
                           "last_committed_step": getattr(exc, "last_committed_step", None),
                           "elapsed_s": time.time() - t0, "traceback": traceback.format_exc()}
    if "pg_timeout_s" in sc and result["error"] is None:
        set_timeout(dist.group.WORLD, cfg["pg_timeout_s"])
    if guard is not None:
        result["events"] = [e.to_dict() for e in guard.events]
        result["committed_step"] = guard.committed_step
        guard.close()
    if cfg.get("compile"):
        result["compile_at_end"] = dynamo_counters()
    injector.remove()
    result["fired"] = [{"step": f.step, "phase": f.phase, "action": f.action} for f in injector.fired]
    if result["error"] is None:
        torch.save({"losses": losses, "state": state_of(model, optimizer)},
                   Path(cfg["out_dir"]) / f"{sc['name']}.rank{rank}.pt")
    del model, optimizer, guard, root, middle
    if sc.get("leak_check") and result["error"] is None:
        result["resources_after"] = resources(cfg["exclude_ports"])
    return result


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    rank, world = cfg["rank"], cfg["world_size"]
    store = dist.PrefixStore(f"{cfg['job_token']}/init", dist.TCPStore(
        cfg["host"], cfg["port"], world, is_master=False, timeout=timedelta(seconds=60)))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg["pg_timeout_s"]))
    control = make_control(cfg)
    cfg["exclude_ports"] = [cfg["port"]]
    results = {}
    for sc in cfg["scenarios"]:
        results[sc["name"]] = run_scenario(sc, cfg, control)
        Path(cfg["out_dir"], f"results.rank{rank}.json").write_text(json.dumps(results, default=str))
        if results[sc["name"]]["error"] is not None:
            break  # after an unrecoverable error the process group is gone
    os._exit(0)  # skip gloo teardown: the old generations are gone, nothing to flush


if __name__ == "__main__":
    main()
