"""One rank of the binding-table unit tests: builds real FSDP models and exercises the table directly.

Launched by tests/accelpact/test_bindings_unit.py as ``python _bindings_rank.py <config.json>`` on 2
or 4 ranks (gloo over 127.0.0.1). For each case it builds a tiny Mistral, wraps it (FSDP2, FSDP2 with
``reshard_after_forward=world/2``, FSDP1 flat params, FSDP1 use_orig_params), trains one step, builds the
BindingTable, builds the next generation of every group it holds (under the old names, on a fresh
store prefix, exactly as the guard does), rebinds, and records:

- the slots and groups found;
- the completeness check (``find_stale_references``) after a full rebind, and after a rebind with
  one holder kind deliberately left out of the table (it must report that holder);
- the loss and a digest of every local shard after one more step on the new generation, and the
  same for a reference model that never rebound (they must be equal, bit for bit).
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from accelpact import comm  # noqa: E402
from accelpact.bindings import BindingTable, find_stale_references  # noqa: E402

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, SEQ, BATCH = 512, 64, 128, 4, 4, 2, 16, 2
SEED = 77


def build(case: str):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(SEED)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ * 2,
                        tie_word_embeddings=False)
    model = MistralForCausalLM(cfg)
    if case.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        # An int reshards to that group size after forward: a post-forward mesh with its own groups
        # (half the world; 1 would mean False and the world size would mean True).
        raf = dist.get_world_size() // 2 if case == "fsdp2_raf_int" else True
        for layer in model.model.layers:
            fully_shard(layer, reshard_after_forward=raf)
        fully_shard(model, reshard_after_forward=raf)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({MistralDecoderLayer}),
                     use_orig_params=(case == "fsdp1_orig"), device_id=torch.device("cpu"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def train_step(model, opt, step: int) -> float:
    g = torch.Generator().manual_seed(step * 31 + dist.get_rank())
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def digest(model, opt) -> str:
    from torch.distributed.tensor import DTensor

    h = hashlib.sha256()
    for name, p in model.named_parameters():
        for t in [p, *[v for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]]:
            t = t.to_local() if isinstance(t, DTensor) else t
            h.update(name.encode())
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Generations:
    """Builds each next data-plane generation on a never-used prefix of the init store."""

    def __init__(self, store: dist.Store):
        self.store, self.n = store, 0

    def rebuild(self, groups: list) -> list:
        self.n += 1
        specs = [comm.group_spec(g) for g in groups]
        store = dist.PrefixStore(f"unitgen{self.n}", self.store)
        return [comm.rebuild_group(g, s, store, dist.get_rank()) for g, s in zip(groups, specs)]


def holder_kind(path: str) -> str:
    """The attribute or dict a slot sits in: the last path component without its index."""
    last = path.rsplit(".", 1)[-1]
    return last.split("[", 1)[0]


def run_case(case: str, gens: Generations) -> dict:
    out: dict = {"case": case}
    # The reference: never rebound.
    ref_model, ref_opt = build(case)
    train_step(ref_model, ref_opt, 0)
    out["ref_loss"] = train_step(ref_model, ref_opt, 1)
    out["ref_digest"] = digest(ref_model, ref_opt)
    del ref_model, ref_opt
    gc.collect()

    model, opt = build(case)
    train_step(model, opt, 0)
    table = BindingTable.build(model, opt)
    out["slots"] = table.describe()
    out["kinds"] = sorted({holder_kind(p) for p in out["slots"]})
    out["n_groups"] = len(table.groups)
    out["group_sizes"] = [g.size() for g in table.groups]

    # Full rebind onto the next generation: nothing may still point at any old group.
    old = list(table.groups)
    new = gens.rebuild(old)
    out["swapped"] = table.rebind(dict(zip(old, new)))
    out["swapped_again"] = table.rebind(dict(zip(old, new)))  # nothing left holding the old ones
    out["stale_full"] = [r for g in old for r in find_stale_references(g, ignore=(old,))]
    out["groups_after_are_new"] = all(any(g is n for n in new) for g in table.groups)
    out["loss_after"] = train_step(model, opt, 1)
    out["digest_after"] = digest(model, opt)
    del old, new, table  # the first table's group list would still name the next round's old groups
    gc.collect()

    # A table that misses one holder kind: the completeness check must name that holder. Tried
    # with an FSDP holder and, when present, with function defaults (an untracked tuple).
    fsdp_kind = next((k for k in out["kinds"] if k != "_pg_registry" and not k.startswith("__")), out["kinds"][0])
    victims = [fsdp_kind] + [k for k in out["kinds"] if k == "__defaults__"]
    out["partials"] = {}
    for victim in victims:
        table2 = BindingTable.build(model, opt)
        all_slots, all_defaults = table2.slots, table2.defaults
        table2.slots = [s for s in all_slots if holder_kind(s.path) != victim]
        table2.defaults = [d for d in all_defaults if holder_kind(d[2]) != victim]
        dropped = len(all_slots) + len(all_defaults) - len(table2.slots) - len(table2.defaults)
        old = list(table2.groups)
        new = gens.rebuild(old)
        table2.rebind(dict(zip(old, new)))
        stale = [r for g in old for r in find_stale_references(g, ignore=(old,))]
        # Repair (so the model stays usable and the next round starts clean): the full table again.
        table2.slots, table2.defaults = all_slots, all_defaults
        table2.rebind(dict(zip(old, new)))
        repaired = [r for g in old for r in find_stale_references(g, ignore=(old,))]
        out["partials"][victim] = {"dropped": dropped, "stale": stale, "repaired": repaired}
        del old, new, table2
        gc.collect()
    del model, opt
    gc.collect()
    return out


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    rank, world = cfg["rank"], cfg["world_size"]
    store = dist.TCPStore("127.0.0.1", cfg["port"], world, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore("init", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    # What transformers / FSDP do lazily in real runs: a module whose defaults capture group.WORLD,
    # imported after init. Imported explicitly so the function-defaults holder is always exercised.
    importlib.import_module("torch.distributed.nn.functional")

    gens = Generations(store)
    results = {}
    for case in cfg["cases"]:
        try:
            results[case] = run_case(case, gens)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results[case] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        Path(cfg["out_dir"], f"bindings.rank{rank}.json").write_text(json.dumps(results))
        if "error" in results[case]:
            break
    os._exit(0)


if __name__ == "__main__":
    main()
