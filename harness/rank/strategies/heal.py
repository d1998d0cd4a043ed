"""The rank side of the harness's half of accelpact's heal: snapshots, the replacement's rejoin, side groups.

- ``snapshots_and_policy``: with ``strategy.snapshot.every > 0`` every rank snapshots each k-th committed
  step into its host's shared memory (``ACCELPACT_SNAPSHOT_ROOT``) and heals a lost rank in memory;
  ``strategy.snapshot.push_every`` / ``confirm_push``: which snapshots go to the buddy, and whether a push
  is part of its snapshot (accelpact.snapshot.push_rule).
- ``rejoin_job`` (the spec's ``rejoin`` hook): in a replacement process, the control channel and
  :func:`accelpact.rejoin` instead of a fresh ``init_process_group``.
- ``side_group``: the checkpointer's gloo group, built on an explicit store prefix and name per control
  generation. ``dist.new_group`` names groups from c10d's counter, which differs between a survivor and
  a fresh replacement, and rendezvouses on the default group's store: the two would never meet.

The parent's policy (``replace_on_kill``, the spec's ``replace_dead``) and ``EXIT_FALLBACK`` are the spec's
(``harness.strategies.accelpact``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from harness.events import Restore
from harness.strategies.accelpact import EXIT_FALLBACK
from harness.strategies.snapshot_config import AccelpactConfig, SnapshotSettings

if TYPE_CHECKING:
    from harness.contract import RankEnv
    from harness.schema import RunConfig

# Fault injection for tests: the replacement with this number (HARNESS_REPLACEMENT) SIGKILLs itself in
# the middle of its heal.
DIE_IN_HEAL = "HARNESS_DIE_IN_HEAL"
# Fault injection for tests: "<replacement>:<how>[,...]"; that replacement dies before it joins: "import"
# (SIGKILL during its imports, before arriving), "exit" (exits with code 3 before arriving: an error of its
# own), "arrived" (SIGKILL right after posting its arrival, before the survivors' rendezvous); or "hang"
# (it never arrives and never dies: the survivors' replacement_timeout_s).
DIE_BEFORE_JOIN = "HARNESS_DIE_BEFORE_JOIN"
# Fault injection for tests: the survivor of this rank SIGKILLs itself in a heal, after the survivors'
# recheck of notices and before their roll call (the guard's "heal_plan" phase): a second death that
# only the roll call can see before the rendezvous.
DIE_AT_HEAL_PLAN = "HARNESS_DIE_AT_HEAL_PLAN"


def die_at_heal_plan(rank: int) -> Any:
    """A guard phase hook for DIE_AT_HEAL_PLAN (None when it does not name ``rank``)."""
    if os.environ.get(DIE_AT_HEAL_PLAN) != str(rank):
        return None

    def hook(phase: str, _step: int) -> None:
        if phase == "heal_plan":
            _die("import")

    return hook


@dataclass
class Rejoined:
    """What a replacement's rejoin hook hands to its strategy: its control channel and ticket."""

    control: Any
    ticket: Any

    def device_mesh(
        self, device_type: str, mesh_shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None = None
    ) -> Any:
        """The survivors' mesh, built from the groups this replacement joined (harness.rank.mesh.build_mesh
        calls it instead of ``init_device_mesh``, whose new groups the survivors would never join: HSDP)."""
        return self.ticket.device_mesh(device_type, mesh_shape, mesh_dim_names=mesh_dim_names)


def control_deadline(cfg: RunConfig) -> None:
    """The control channel's own deadline bounds how long survivors wait for a lost rank."""
    os.environ.setdefault("ACCELPACT_CONTROL_DEADLINE_S", str(cfg.strategy.recovery_deadline_s))


def rejoin_job(cfg: RunConfig, env: RankEnv) -> Rejoined:
    """A replacement: arrive on the control channel and build the survivors' next generation."""
    import accelpact  # lazy: torch
    import accelpact.snapshot  # lazy: torch
    from accelpact.control import ControlChannel  # lazy: torch
    from harness.models import meta_model  # lazy: torch

    how = _injected_death(env.replacement)
    if how in ("import", "exit"):
        _die(how)
    if how == "hang":
        time.sleep(3600)  # the parent's kill_all ends it
    # The heavy imports (transformers: seconds on a loaded host) belong to the process start, not to the
    # heal the survivors wait for: a model on the meta device costs nothing and imports them all.
    meta_model(cfg.model)
    control_deadline(cfg)
    control = ControlChannel.from_env()
    if how == "arrived":
        _arrive_and_die(control, env)
    try:
        ticket = accelpact.rejoin(control, timeout_s=cfg.strategy.replacement_timeout_s, t_launch=env.t_launch)
    except accelpact.RankLostError as exc:
        print(f"rank {env.rank}: replacement {env.replacement} could not join: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_FALLBACK)
    if os.environ.get(DIE_IN_HEAL) == str(env.replacement):
        # Fault injection (tests): this replacement dies inside its heal, after joining the new
        # generation and before the heal reports: the survivors must heal once more.
        os.kill(os.getpid(), signal.SIGKILL)
    return Rejoined(control, ticket)


def _injected_death(replacement: int) -> str | None:
    for item in os.environ.get(DIE_BEFORE_JOIN, "").split(","):
        number, _, how = item.partition(":")
        if number.strip() == str(replacement) and how:
            return how.strip()
    return None


def _die(how: str) -> None:
    sys.stdout.flush()
    if how == "exit":
        print("injected: this replacement fails before joining (HARNESS_DIE_BEFORE_JOIN)", file=sys.stderr, flush=True)
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def _arrive_and_die(control: Any, env: RankEnv) -> None:
    """Post an arrival exactly as accelpact.rejoin does, then die before taking the plan."""
    from accelpact.inject import post_arrival  # lazy: torch

    post_arrival(control, env.t_launch)
    time.sleep(0.5)  # the survivors read the arrival and write the plan meanwhile
    _die("import")


def side_group(
    control_store: Any, token: str, tag: str, generation: int, rank: int, world_size: int, timeout_s: float
) -> Any:
    """A gloo group over every rank named ``{tag}-g{generation}`` on ``{token}/side/{tag}/gen{generation}``."""
    import torch.distributed as dist  # lazy: torch

    from accelpact.backends import GroupSpec, rebuild_group  # lazy: torch

    spec = GroupSpec(
        name=f"{tag}-g{generation}",
        backend="gloo",
        ranks=tuple(range(world_size)),
        is_default=False,
        tag=None,
        desc=tag,
        timeout=timedelta(seconds=timeout_s),
    )
    store = dist.PrefixStore(f"{token}/side/{tag}/gen{generation}", control_store)
    return rebuild_group(None, spec, store, rank)


def snapshots_and_policy(
    cfg: RunConfig, model: Any, optimizer: Any, control: Any, rank: int, world_size: int, scheduler: Any = None
) -> tuple[Any, Any, Any]:
    """(snapshotter, heal policy, replication) for this rank; (None, None, None) with snapshots off.

    ``scheduler``: the LR scheduler, saved in each snapshot's extra_state (restore_extra_state reads it)."""
    if not isinstance(cfg.strategy, AccelpactConfig) or cfg.strategy.snapshot.every <= 0:
        return None, None, None
    snap = cfg.strategy.snapshot
    from accelpact import HealPolicy  # lazy: torch
    from accelpact.snapshot import SnapshotConfig, Snapshotter, job_token_from_env  # lazy: torch

    # The snapshots' token outlives a relaunch (the parent exports ACCELPACT_SNAPSHOT_TOKEN, the same in every
    # incarnation); the control channel's token is new in each, so a relaunched job would find nothing under it.
    token = job_token_from_env()
    replication = _replication(snap, control, world_size, token)
    snapshots = Snapshotter(
        model,
        optimizer,
        job_token=token,
        rank=rank,
        world_size=world_size,
        config=SnapshotConfig(pause_mid_copy_s=snap.pause_mid_copy_s, **snap.cadence()),
        on_complete=replication.push if replication is not None else None,
        extra_state=(lambda: {"scheduler": scheduler.state_dict()}) if scheduler is not None else None,
    )
    policy = HealPolicy(
        replacement_timeout_s=cfg.strategy.replacement_timeout_s,
        fetch_replica=replication.fetch if replication is not None else None,
        buddy_of=(lambda r: replication.buddy) if replication is not None else None,
    )
    return snapshots, policy, replication


def _replication(snap: SnapshotSettings, control: Any, world_size: int, token: str) -> Any:
    """The buddy replica channel (accelpact.snapshot.replica): its server holds the wards' replicas,
    its pusher sends this rank's slots to the buddy, its fetch brings them back to a replacement (or to a
    relaunched rank whose host lost its own). ``token``: the snapshots' token."""
    if not snap.replicas or world_size < 2:
        return None
    from accelpact.snapshot import Replication  # lazy: torch

    return Replication.from_env(control, confirm=snap.confirm_push, job_token=token)


def resume_from_snapshots(ctx: Any, snapshots: Any, replication: Any) -> tuple[int | None, str]:
    """A relaunched rank (every rank was relaunched: a whole-job crash, or a fallback): load the newest
    snapshot every rank holds (accelpact.snapshot.restore_latest: each rank's own slot, or its buddy's replica
    when its host lost it) and write a ``restore`` event with ``source="snapshot"``. Collective.

    Returns (the step to resume at, "") or, when no complete, agreeing set of snapshots exists, (None, why):
    the caller then restores the checkpoint from disk. Every rank decides the same: one rank that could not
    load sends every rank to the disk (their own slots are dropped then, so no later restore mixes them in)."""
    import torch.distributed as dist  # lazy: torch

    from accelpact.errors import AccelPactError  # lazy: torch
    from accelpact.snapshot import restore_latest  # lazy: torch

    t_start = time.time()
    info, why = None, ""
    try:
        info = restore_latest(
            ctx.model,
            ctx.optimizer,
            job_token=snapshots.job_token,
            rank=ctx.rank,
            config=snapshots.config,
            fetch=replication,
            world_size=ctx.world_size,
            required=True,
        )
    except (AccelPactError, OSError) as exc:  # none held, the ranks disagree, a copy lost with its buddy, unreadable
        why = f"{type(exc).__name__}: {exc}"
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, why)
    failed = {r: w for r, w in enumerate(everyone) if w}
    if failed:
        snapshots.drop_newer_than(-1)  # this timeline is abandoned: its slots must not meet the new one's
        return None, f"{next(iter(failed.values()))} (on rank(s) {sorted(failed)})"
    assert info is not None
    ctx.events.emit(
        Restore,
        t_start=t_start,
        t_end=time.time(),
        from_step=info.step,
        bytes=info.nbytes,
        source="snapshot",
        slot=info.source,
        load_s=info.load_s,
        held={str(r): s for r, s in (info.held or {}).items()},
    )
    restore_extra_state(ctx.scheduler, info.extra_state)
    return info.step + 1, ""


def restore_extra_state(scheduler: Any, extra_state: dict) -> None:
    """After a heal loaded step S - 1 (a survivor's RolledBack, a replacement's ``guard.resumed``): the LR
    scheduler as that snapshot saved it, then its step of iteration S - 1 (the snapshot is taken inside
    ``guard.step``, before the loop's ``scheduler.step()``). Empty extra_state: resumed from the initial
    state (step -1), where a fresh scheduler is already right."""
    if scheduler is None or not extra_state:
        return
    scheduler.load_state_dict(extra_state["scheduler"])
    scheduler.step()
