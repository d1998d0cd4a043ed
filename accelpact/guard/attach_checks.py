"""What attach() refuses up front, because the guard would otherwise "recover" a job that does not train.

- A model with no FSDP module (attach called before ``fully_shard``): every step runs, faults are
  "recovered", and the parameters never see a reduced gradient from the other ranks.
- An optimizer that does not hold the model's parameters as they are now: ``fully_shard`` replaces
  every parameter with a sharded DTensor (FSDP1 with flat parameters), so an optimizer built before
  wrapping steps the old, unsharded tensors, which the model no longer uses.
- The job-token check (``control.join``): every rank must see all ranks under its token within the
  connect deadline, or a token mismatch shows only 31 s into the first fault.
- On a heal's replacement, parameters on a mesh whose groups are not the survivors' (HSDP's 2-D mesh
  made with ``init_device_mesh``): the replacement rebuilt the survivors' groups by name, but a mesh it
  creates itself makes new groups under c10d's counter names, which never meet the survivors' (a heal
  that cannot finish). ``ticket.device_mesh(...)`` builds the mesh from the survivors' groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn

from accelpact.dataplane.reset import fsdp_flavour
from accelpact.errors import AccelPactError

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient
    from accelpact.recovery.heal import HealPolicy
    from accelpact.recovery.rejoin import RejoinTicket

__all__: list[str] = []  # private to accelpact.guard


def check_attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    control: ControlClient,
    snapshots: object | None,
    heal: HealPolicy | None,
    rejoin: RejoinTicket | None,
) -> None:
    """Every check of this module, in order, with what else attach() refuses: no process group yet, and
    snapshots or heals on FSDP1 (the arguments are attach()'s)."""
    if not dist.is_initialized():
        raise AccelPactError("attach() needs an initialised process group: call init_process_group first")
    check_model(model)
    check_optimizer(model, optimizer)
    check_members(control)  # a job-token mismatch fails here, not at the first fault
    flavour = fsdp_flavour(model)
    if (snapshots is not None or heal is not None) and flavour != "fsdp2":
        raise AccelPactError(
            f"snapshots and heals need FSDP2 (fully_shard); this model uses {flavour}: its flat "
            "parameters are not restored shard by shard. Wrap with torch.distributed.fsdp.fully_shard, or "
            "attach without snapshots= and heal="
        )
    if heal is not None:
        check_heal_mesh(model, None if rejoin is None else set(rejoin.groups))


def check_model(model: nn.Module) -> None:
    """AccelPactError, with the fix, when ``model`` holds no FSDP module."""
    if fsdp_flavour(model) == "none":
        raise AccelPactError(
            f"attach() found no FSDP module in the model ({type(model).__name__}): wrap it first, e.g. "
            "fully_shard(block) for each block and fully_shard(model) (FSDP2), or FullyShardedDataParallel("
            "model) (FSDP1), then build the optimizer from model.parameters(), then attach()"
        )


def check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AccelPactError, with the fix, when the optimizer holds tensors that are not the model's parameters
    or none of them."""
    params = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    foreign = [p for p in held if id(p) not in params]
    if not held or foreign or not any(id(p) in params for p in held):
        what = (
            f"{len(foreign)} of its {len(held)} tensors are not parameters of the model"
            if foreign
            else "it holds none of the model's parameters"
        )
        raise AccelPactError(
            f"attach(): the optimizer does not hold the model's sharded parameters ({what}). fully_shard / "
            "FullyShardedDataParallel replace the parameters, so build the optimizer AFTER wrapping: "
            "optimizer = torch.optim.AdamW(model.parameters(), ...)"
        )


def check_members(control: ControlClient) -> None:
    """Wait for every rank under the job token (a control channel without ``join`` is not checked)."""
    join = getattr(control, "join", None)
    if callable(join):
        join()


def check_heal_mesh(model: nn.Module, rejoined: set[str] | None) -> None:
    """On a replacement (``rejoined``: the names of the groups :func:`accelpact.rejoin` built), an
    AccelPactError, with the fix, when a parameter's DeviceMesh uses a group the survivors do not have.

    Survivors (``rejoined`` None) may use any mesh: their plan carries every group of it."""
    if rejoined is None:
        return
    for name, p in model.named_parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is None:
            continue
        names = [mesh.get_group(d).group_name for d in range(mesh.ndim)]
        foreign = [n for n in names if n not in rejoined]
        if not foreign:
            continue
        shape = tuple(mesh.shape)
        raise AccelPactError(
            f"parameter {name!r} is on a {mesh.ndim}-D mesh of shape {shape} whose group(s) {foreign} the survivors "
            f"do not have (this replacement joined {sorted(rejoined)}): a mesh created on a replacement with "
            "init_device_mesh makes new groups, which never meet the survivors'. Build it from the groups "
            f"rejoin() joined: mesh = ticket.device_mesh(device_type, {shape}, mesh_dim_names=...), then "
            "fully_shard(..., mesh=mesh)"
        )
