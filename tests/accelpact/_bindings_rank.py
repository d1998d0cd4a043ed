"""The binding-table unit tests' scenario runner: real FSDP models, the table exercised directly.

Named by tests/accelpact/test_bindings_unit.py as ``tests.accelpact._bindings_rank:run`` for a
multi-rank session (accelpact.testing.session) on 2 or 4 ranks. For each case (one scenario each) it
builds a tiny Mistral (experiments.workloads.fsdp_models, narrower than the recovery tests' one), wraps it
(FSDP2, FSDP2 with ``reshard_after_forward=world/2``, FSDP1 flat params, FSDP1 use_orig_params),
trains one step, builds the BindingTable, builds the next generation of every group it holds (under
the old names, on a fresh store prefix, exactly as the guard does), rebinds, and records:

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

import torch
import torch.distributed as dist

from accelpact.backends import generations as comm
from accelpact.dataplane.bindings import BindingTable, find_stale_references
from accelpact.testing.rank import RankContext
from experiments.workloads.fsdp_models import build as build_model
from experiments.workloads.fsdp_models import model_config

MODEL = model_config(
    {"vocab": 512, "hidden": 64, "inter": 128, "layers": 4, "heads": 4, "kv_heads": 2, "seq": 16, "batch": 2}
)
SEED = 77
FLAVOUR = {"fsdp2": "fsdp2", "fsdp2_raf_int": "fsdp2", "fsdp1": "fsdp1", "fsdp1_orig": "fsdp1_orig"}


def build(case: str):
    # An int reshards to that group size after forward: a post-forward mesh with its own groups
    # (half the world; 1 would mean False and the world size would mean True).
    raf = dist.get_world_size() // 2 if case == "fsdp2_raf_int" else True
    model, opt, _root, _middle = build_model(FLAVOUR[case], MODEL, reshard_after_forward=raf, seed=SEED)
    return model, opt


def train_step(model, opt, step: int) -> float:
    g = torch.Generator().manual_seed(step * 31 + dist.get_rank())
    tokens = torch.randint(0, MODEL["vocab"], (MODEL["batch"], MODEL["seq"]), generator=g)
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


_GENERATIONS: list[Generations] = []  # one per rank process: generation numbers never repeat


def run(sc: dict, ctx: RankContext) -> dict:
    """The scenario runner: ``sc["case"]`` is one of fsdp2, fsdp2_raf_int, fsdp1, fsdp1_orig."""
    if not _GENERATIONS:
        # What transformers / FSDP do lazily in real runs: a module whose defaults capture
        # group.WORLD, imported after init. Imported explicitly so the function-defaults holder is
        # always exercised.
        importlib.import_module("torch.distributed.nn.functional")
        _GENERATIONS.append(Generations(ctx.store))
    return run_case(sc["case"], _GENERATIONS[0])
