"""A replacement process joins a running job: arrive, wait for the survivors' plan, build their groups.

Call :func:`rejoin` INSTEAD of ``init_process_group`` in a process that replaces a lost rank (same
RANK and WORLD_SIZE, same job token); then build the model, FSDP wrapping and optimizer as usual and
pass the ticket to ``attach(..., heal=..., snapshots=..., rejoin=ticket)``, which loads the resume step
and runs the first collective with the survivors (accelpact.recovery.heal)::

    control = ControlChannel.from_env()
    ticket = accelpact.recovery.rejoin(control)                 # the default process group now exists
    model = build_and_shard(...); optimizer = AdamW(model.parameters())
    guard = accelpact.attach(model, optimizer, control, snapshots=snap, heal=policy, rejoin=ticket)
    start = guard.next_step                            # the resume step

Why groups are built from the plan and not with ``init_process_group``: the survivors rebuild their
groups under their OLD names on the never-used store prefix of generation G (accelpact.backends.generations); a fresh
``init_process_group`` would rendezvous under another prefix and, for later groups, under names that
come from c10d's group counter, which differs between a fresh process and a survivor. So the
replacement builds exactly the groups the survivors rebuild, in the same order, on the same prefix.
The plan lists every survivor's groups (accelpact.recovery.heal_groups), so under HSDP the replacement
builds its replicate and shard groups too; ``ticket.device_mesh(device_type, mesh_shape, mesh_dim_names)``
then gives it the mesh ``init_device_mesh`` gave every other rank (accelpact.recovery.rejoin_mesh). A
1-D mesh over the world is the default group: ``init_device_mesh`` works there as usual.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accelpact.detection.liveness import JOINING, Heartbeat, LivenessConfig
from accelpact.errors import ControlChannelError, RankLostError
from accelpact.recovery.heal_wait import arrived_key, closed_key, joining_key, peek, plan_key

if TYPE_CHECKING:
    from accelpact.common.control_client import ControlClient

__all__ = ["RejoinTicket", "rejoin"]

# How often a replacement reads the store for its plan (and for the end of the run) while it waits.
PLAN_POLL_S = 0.01


@dataclass
class RejoinTicket:
    """What :func:`rejoin` did: the generation joined and when each part ended (wall-clock seconds)."""

    generation: int
    lost: list[int]
    t_start: float  # rejoin() called
    t_arrived: float  # arrival posted
    t_joined: float  # groups built
    t_launch: float | None = None  # when the launcher started this process (if it said)
    heartbeat: Heartbeat | None = None  # beating since arrival; attach() takes it over
    # How the groups were joined: {"path": "reconfigure" | "rebuild", "why": ...} (HealEvent.data_plane)
    data_plane: dict[str, Any] = field(default_factory=dict)

    # The groups rejoin() built, by c10d name (the survivors' names): what device_mesh() builds a mesh from.
    groups: dict[str, Any] = field(default_factory=dict)
    # This generation's data-plane store and the plan's default-group entry: what a mesh row that no
    # survivor holds is built with (``_orphan_group``).
    store: Any = None
    default_spec: dict[str, Any] = field(default_factory=dict)

    def device_mesh(
        self, device_type: str, mesh_shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None = None
    ) -> Any:
        """The DeviceMesh ``init_device_mesh(device_type, mesh_shape, mesh_dim_names=...)`` gave every other
        rank, built from the survivors' groups this replacement joined (accelpact.recovery.rejoin_mesh).

        Call it instead of ``init_device_mesh`` on a replacement: that would create new process groups,
        which every rank must create together, and the survivors created theirs long ago."""
        from accelpact.recovery.rejoin_mesh import mesh_from_groups

        return mesh_from_groups(self.groups, device_type, mesh_shape, mesh_dim_names, orphan=self._orphan_group)

    def _orphan_group(self, ranks: tuple[int, ...]) -> Any:
        """A mesh row none of whose members survived (a whole HSDP replica on a lost host): no survivor's
        plan carries it, so its members, every one a replacement calling device_mesh with the same shape,
        build it here, under a name only they use. None when a member survived: then the survivors' plan
        should have held the row, and the caller names what is missing."""
        import torch
        import torch.distributed as dist

        from accelpact.backends import generations

        if self.store is None or not self.default_spec or not set(ranks) <= set(self.lost):
            return None
        name = f"accelpact_g{self.generation}_" + "_".join(map(str, ranks))
        d = self.default_spec
        device = torch.device("cuda", torch.cuda.current_device()) if d["bound"] and torch.cuda.is_available() else None
        spec = generations.GroupSpec(
            name=name,
            backend=d["backend"],
            ranks=tuple(ranks),
            is_default=False,
            tag=None,
            desc=f"accelpact: mesh row {list(ranks)}, rebuilt by its replacements",
            timeout=None if d["timeout_s"] is None else datetime.timedelta(seconds=d["timeout_s"]),
            device_id=device,
        )
        pg = generations.rebuild_group(
            None, spec, dist.PrefixStore("orphan/", self.store), dist.get_rank(), device_id=device
        )
        self.groups[name] = pg
        return pg

    def stop_heartbeat(self) -> None:
        """End the JOINING beats; a beat being written lands first (attach writes the guard's next)."""
        if self.heartbeat is not None:
            self.heartbeat.stop(wait_s=5.0)
            self.heartbeat = None


def _wait_for_plan(control: ControlClient, pid: int, timeout_s: float) -> bytes:
    """The survivors' plan for this process; RankLostError at once when every other rank already ended the
    run (each wrote ``{token}/heal/closed/{rank}`` at ``guard.close()`` after ``guard.finish()``)."""
    deadline = time.monotonic() + timeout_s
    others = [r for r in range(control.world_size) if r != control.rank]
    while True:
        raw = peek(control, plan_key(control, control.rank, pid))
        if raw is not None:
            return raw
        if others and all(peek(control, closed_key(control, r)) is not None for r in others):
            raise RankLostError(
                f"replacement of rank {control.rank} (pid {pid}): every other rank ended the run (guard.finish, then "
                "guard.close) before this process arrived: nothing is left to heal and no one to heal with. The "
                "process this replaces died after the run's end; if it had work left after guard.close, run that "
                "work under guard.run before closing.",
                ranks=(control.rank,),
                detected_by="heal",
            )
        if time.monotonic() >= deadline:
            raise ControlChannelError(f"no heal plan for rank {control.rank} (pid {pid}) within {timeout_s:g} s")
        time.sleep(PLAN_POLL_S)


def rejoin(
    control: ControlClient,
    *,
    timeout_s: float = 180.0,
    t_launch: float | None = None,
    liveness: LivenessConfig | None = LivenessConfig(),
) -> RejoinTicket:
    """Arrive as the replacement of ``control.rank`` and build the survivors' next generation of groups.

    Waits up to ``timeout_s`` for the survivors' plan (they write it once every lost rank's replacement
    arrived); ``t_launch``: when the launcher started this process (for the heal event's timings).
    Starts this rank's heartbeat at once, so the survivors see a live process under the rank (its pid,
    not the dead one's) while the model is built.
    """
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from accelpact.backends import generations, reconfigure
    from accelpact.dataplane.reconfigure import FALLBACK_PREFIX

    if dist.is_initialized():
        raise RuntimeError(
            "rejoin() builds the default process group itself: call it instead of init_process_group, not after it"
        )
    t_start = time.time()
    heartbeat = None
    cfg = getattr(control, "config", None)
    if liveness is not None and cfg is not None:
        # Beating as JOINING (accelpact.detection.liveness): survivors still in a recovery round then know the
        # rank's process they trained with is gone, whichever pid the death notice names.
        heartbeat = Heartbeat(
            cfg.host, cfg.port, cfg.job_token, control.rank, config=liveness, progress=lambda: JOINING
        ).start()
    pid = os.getpid()
    if liveness is not None:
        control.heartbeat(progress=JOINING)  # this pid beats before anyone reads the arrival (the thread may lag)
    control.set(
        arrived_key(control, control.rank), json.dumps({"pid": pid, "t": time.time(), "t_launch": t_launch}).encode()
    )
    t_arrived = time.time()
    try:
        plan = json.loads(_wait_for_plan(control, pid, timeout_s).decode())
    except RankLostError:
        if heartbeat is not None:
            heartbeat.stop()
        raise
    except ControlChannelError as exc:
        if heartbeat is not None:
            heartbeat.stop()
        raise RankLostError(
            f"replacement of rank {control.rank} (pid {pid}) arrived but no survivor sent a heal plan within "
            f"{timeout_s:g} s: the job may have ended, fallen back to a checkpoint, or the survivors were lost "
            "too. Start it again from a checkpoint.",
            ranks=(control.rank,),
            detected_by="heal",
        ) from exc
    generation = int(plan["generation"])
    # Committed to the rendezvous: the survivors enter it only after this ack (accelpact.recovery.heal_wait), so
    # that a replacement lost before it is healed again instead of costing them the control deadline.
    control.set(joining_key(control, control.rank, pid), str(generation).encode())
    control.generation = generation  # the next recovery round advances to generation + 1, like everyone
    store = control.data_plane_store(generation)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    # The plan lists every survivor's groups (accelpact.recovery.heal_groups); this rank builds those it is
    # a member of, in the plan's order (the order every member builds them in).
    mine = [(i, d) for i, d in enumerate(plan["groups"]) if control.rank in d["ranks"]]
    specs = [
        generations.GroupSpec(
            name=d["name"],
            backend=d["backend"],
            ranks=tuple(d["ranks"]),
            is_default=d["is_default"],
            tag=d["tag"],
            desc=d["desc"],
            timeout=None if d["timeout_s"] is None else datetime.timedelta(seconds=d["timeout_s"]),
            device_id=device if d["bound"] else None,
        )
        for _, d in mine
    ]
    group_stores = [plan.get("group_stores", [])[i] for i, _ in mine] if plan.get("group_stores") else []
    # The survivors reconfigure their live groups with ours (torch >= 2.15) or rebuild them under the
    # old names; the plan says which (accelpact.dataplane.reconfigure), and a failure anywhere makes
    # every rank rebuild on the generation's fallback prefix.
    data_plane = {"path": "rebind", "why": "the survivors rebuild and rebind"}
    if plan.get("data_plane") == "reconfigure":
        data_plane = {"path": "reconfigure", "why": "joined the survivors' groups in the reconfigure regime"}
        deadline = datetime.timedelta(seconds=getattr(cfg, "deadline_s", 30.0))
        try:
            reconfigure.join_groups(
                specs, store, control.rank, device_id=device, group_stores=group_stores, timeout=deadline
            )
        except reconfigure.Fallback as fallback:
            data_plane = {"path": "rebind", "why": f"reconfigure failed, fell back: {fallback.reason}"}
            store = dist.PrefixStore(FALLBACK_PREFIX, store)
            specs_to_build = specs
        else:
            specs_to_build = []
    else:
        specs_to_build = specs
    for spec in specs_to_build:
        generations.rebuild_group(None, spec, store, control.rank, device_id=spec.device_id)
    if not dist.is_initialized():
        raise RuntimeError(f"the survivors' plan for generation {generation} has no default group: {plan['groups']}")
    # As after init_process_group and the survivors' own new_group calls: a group created after the heal
    # without a name is named by this counter on every rank.
    c10d._world.group_count = max(c10d._world.group_count, int(plan.get("group_count", 1)), 1)
    by_name: dict[str, dist.ProcessGroup] = {name: pg for pg, name in c10d._world.pg_names.items()}
    return RejoinTicket(
        generation=generation,
        lost=list(plan["lost"]),
        t_start=t_start,
        t_arrived=t_arrived,
        t_joined=time.time(),
        t_launch=t_launch,
        heartbeat=heartbeat,
        data_plane=data_plane,
        groups={spec.name: by_name[spec.name] for spec in specs if spec.name in by_name},
        store=store,
        default_spec=next((d for d in plan["groups"] if d["is_default"]), {}),
    )
