"""Strategy ``torchft``, rank side (the spec is ``harness.strategies.torchft_hsdp``): torchft 0.2.0's
fault-tolerant HSDP, run as its users run it (a peer baseline).

The world is cut into replica groups of ``strategy.group_size`` ranks. Inside a group the model
is sharded with FSDP2 on the group's own default process group; across groups every gradient shard goes
through torchft's ``Manager.allreduce`` (``set_all_reduce_hook`` on every FSDP module: the hook is not
recursive, and a hook on the root alone silently skips the cross-group reduction). With one rank per
group this is torchft's fault-tolerant DDP: one all-reduce of each gradient across groups, averaged over
the groups that take part in the step.

What runs where:

- the parent (``harness.parent.strategies.torchft_parent``) runs the Lighthouse and restarts a failed rank's
  whole group, as each group's torchrun agent with ``--max-restarts`` would;
- each group's local rank 0 hosts the group's TCPStore (what torchrun's agent hosts) and its
  Manager's server; every rank builds a ``Manager`` (``ProcessGroupGloo``, ``PGTransport``: the heal
  goes over torchft's own process group, which carries DTensor shards), wraps the optimizer in
  ``torchft.Optimizer`` (``zero_grad`` starts the quorum) and calls ``should_commit`` before stepping;
- a step whose cross-group all-reduce failed is discarded by ``should_commit`` and retried with the same
  batch after a new quorum; a group that is behind (a restarted group, or one that discarded a step the
  others committed) heals from a peer's memory in the next quorum and does not take part in that step.

Each fault kind the harness injects meets torchft's own recovery: ``socket_reset`` (gloo connections
reset: the step is discarded, the quorum moves on, the step is retried), ``kill`` (the group drops out
after ``heartbeat_timeout_ms``, the others go on alone, the restarted group heals from a peer) and
``hang`` (a stopped group's peers time out after ``timeout_s`` and go on; the group rejoins and heals) and
``host_loss`` (as ``kill``, for every group with a rank on the lost host). With the ranks in network
namespaces the Lighthouse runs in the bridge namespace on the control network
(``harness.server_home``), and each group's store and Manager server listen on local rank 0's
control-network address (``torchft_rank.group_store_host``): nothing a rank dials is at the parent's 127.0.0.1.

Events: ``recovery`` (decision ``retry``) for every discarded attempt, ``heal`` for every heal (role
``replacement``, ``rejoin`` or ``sender``), and torchft's own figures on every ``step`` (quorum id,
participants, quorum and should_commit times), built from each attempt's timing
(``harness.rank.strategies.torchft_attempt``). A step with fewer groups than the job has is not the reference's
math by design; ``harness.strategies.torchft_report`` puts that, with the reason, in the row. The config
check is ``harness.strategies.torchft_check``; a rank's group store and life, ``torchft_rank``.

No patch of torchft is needed on this path: the FSDP hook waits on ``_ManagedWork`` directly, so the
``torchft.DistributedDataParallel`` comm-hook crash on a peer's death (``assert fut._fut``) is not hit.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.rank.strategies.base import (
    Rewind,
    Strategy,
    TrainContext,
    checkpoint_dir,
    forward_backward,
    store_ports_of,
)
from harness.rank.strategies.torchft_attempt import (
    Attempt,
    heal_fields,
    retry_fields,
    sent_fields,
    step_fields,
    time_manager,
    timed_transport,
)
from harness.strategies.torchft_config import torchft_config
from harness.strategies.torchft_layout import LIGHTHOUSE_ENV, GroupLayout, ports_key

if TYPE_CHECKING:
    import torch

REPLICA_ID_PREFIX = "harness_replica_"  # torchft reads the group's index from the id's trailing digits


class TorchftHsdp(Strategy):
    def __init__(
        self,
        ctx: TrainContext,
        layout: GroupLayout,
        control: Any,
        store_addr: tuple[str, int],
        gen: int,
        token: str,
        t_launch: float,
    ) -> None:
        self.ctx = ctx
        self.layout = layout
        self.token = token
        self.t_launch = t_launch
        self.control = control
        self.gen = gen
        self.settings = torchft_config(ctx.cfg.strategy)
        self.lighthouse = os.environ[LIGHTHOUSE_ENV]
        self.attempt = Attempt(t_start=time.time())
        self._failed: Attempt | None = None  # the last discarded attempt, until its retry's quorum
        self._fields: dict[str, Any] = {}
        self._heals = 0
        super().__init__(ctx, exclude_ports=self._service_ports())
        if self.ckpt is None and ctx.replacement and ctx.cfg.checkpoint.interval > 0:
            self.ckpt = self.make_checkpointer(None)  # a restarted group saves again, into its own directory
        self.manager = self._build_manager(store_addr)
        self._publish_ports(store_addr[1])
        self._hook_fsdp()

    # -- set-up ---------------------------------------------------------------------------------------
    def checkpoint_directory(self) -> str:
        """Each replica group saves its own replica, into its own directory (as torchft's users do)."""
        return str(Path(checkpoint_dir(self.ctx)) / f"group{self.layout.group}")

    def _build_manager(self, store_addr: tuple[str, int]) -> Any:
        import torchft  # lazy: torchft

        st, ctx = self.settings, self.ctx
        timeout = timedelta(seconds=st.timeout_s)
        pg = torchft.ProcessGroupGloo(timeout=timeout)
        transport = timed_transport(pg, self, timeout=timeout, device=ctx.device, state_dict=self._state_dict)
        manager = torchft.Manager(
            pg=pg,
            load_state_dict=self._load_state_dict,
            state_dict=self._state_dict,
            min_replica_size=st.min_replicas,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=st.quorum_timeout_s),
            connect_timeout=timedelta(seconds=ctx.cfg.cluster.pg_timeout_s),
            rank=self.layout.local,
            world_size=self.layout.size,
            store_addr=store_addr[0],
            store_port=store_addr[1],
            lighthouse_addr=self.lighthouse,
            replica_id=f"{REPLICA_ID_PREFIX}{self.layout.group}",
            # Only local rank 0 runs the Manager's server; it advertises it on the host its group store
            # listens on (torchft_rank.group_store_host): the group's other ranks dial it, wherever they run.
            hostname=store_addr[0],
            checkpoint_transport=transport,
            # Every group builds the same model from the same seed: measured, init_sync=True "heals" group 1
            # at step 0 and moves the result off plain DDP's.
            init_sync=False,
            max_retries=st.max_retries,
        )
        time_manager(manager, pg, self)
        self.optimizer = torchft.Optimizer(manager, ctx.optimizer)
        return manager

    def _hook_fsdp(self) -> None:
        from torch.distributed.fsdp import FSDPModule  # lazy: torch

        def all_reduce_across_groups(grad: torch.Tensor) -> None:
            self.manager.allreduce(grad).wait()

        hooked = 0
        for module in self.ctx.model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(all_reduce_across_groups)
                hooked += 1
        if not hooked:
            raise RuntimeError("strategy=torchft found no FSDP2 module to hook its cross-group all-reduce into")

    def _state_dict(self) -> dict[str, Any]:
        return {"model": self.ctx.model.state_dict(), "optim": self.ctx.optimizer.state_dict()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self.ctx.model.load_state_dict(state["model"])
        self.ctx.optimizer.load_state_dict(_onto_own_mesh(self.ctx.model, self.ctx.optimizer, state["optim"]))

    def _service_ports(self) -> list[int]:
        """Ports a socket reset must spare: stores, Managers' servers and the Lighthouse (not gloo's)."""
        ports = set(store_ports_of(self.ctx)) | {int(self.lighthouse.rsplit(":", 1)[1])}
        key = ports_key(self.token)
        if self.control.check([key]):
            ports |= {int(p) for p in self.control.get(key).decode().split(",") if p}
        return sorted(ports)

    def _publish_ports(self, store_port: int) -> None:
        mine = [store_port]
        server = getattr(self.manager, "_manager", None)
        if server is not None:
            mine.append(int(server.address().rsplit(":", 1)[1]))
        self.control.append(ports_key(self.token), "".join(f"{p}," for p in mine).encode())

    # -- the step -------------------------------------------------------------------------------------
    def step_fields(self) -> dict[str, Any]:
        return self._fields

    def run_step(self, step: int, tokens: torch.Tensor) -> float:
        cfg = self.ctx.cfg
        attempts = 0
        while True:
            attempts += 1
            if self.faults is not None and any(s.step == step for s in self.faults.injector.armed):
                self.faults.injector.exclude_ports = tuple(self._service_ports())
            a = self.attempt = Attempt(t_start=time.time())
            self.optimizer.zero_grad(set_to_none=True)  # starts the quorum (asynchronously)
            loss = forward_backward(self.ctx.model, tokens)
            self.fire("clip_allreduce")
            if cfg.train.max_grad_norm > 0:
                from accelpact.guard import clip_gradients  # lazy: torch

                clip_gradients(self.ctx.model, cfg.train.max_grad_norm)
            self.fire("vote")
            self.fire("post_vote")
            t = time.time()
            ok = self.manager.should_commit()  # what torchft.Optimizer.step() asks before stepping
            a.should_commit_s, a.t_end = time.time() - t, time.time()
            if self._failed is not None:
                self._emit_retry(self._failed, a)
                self._failed = None
            if a.heal:
                self._emit_heal(a)
            if a.recover_dst:
                self._emit_sent(a)
            if not ok:
                self._failed = a
                now = self.manager.current_step()
                if now != step:  # a heal was applied although the step failed: go on from the healed step
                    raise Rewind(now)
                continue
            self.ctx.optimizer.step()
            self._fields = step_fields(a, attempts, self.manager.num_participants(), self.layout.groups)
            now = self.manager.current_step()
            if now != step + 1:
                # This group healed to a later step in this attempt (it was behind): it did not take part in
                # step now-1 (its batch was not used), so no step of its own is recorded; go on from there.
                raise Rewind(now)
            return float(loss.detach())

    def _emit_retry(self, failed: Attempt, retry: Attempt) -> None:
        self.ctx.events.emit("recovery", **retry_fields(failed, retry))

    def _emit_heal(self, a: Attempt) -> None:
        """This group was behind and loaded a peer's state in this attempt."""
        self._heals += 1
        first_of_replacement = bool(self.ctx.replacement) and self._heals == 1
        self.ctx.events.emit("heal", **heal_fields(a, first_of_replacement, self.t_launch))

    def _emit_sent(self, a: Attempt) -> None:
        self.ctx.events.emit("heal", **sent_fields(a))

    # -- the end of the run ------------------------------------------------------------------------------
    def _done_key(self, rank: int) -> str:
        return f"{self.token}/torchft/done/rank{rank}"

    def _group_agrees(self, mine: bool) -> bool:
        """True on every rank of this replica group when it is true on any (a MAX all-reduce over the group's
        own process group). The group's ranks must take the same branch at the end of the run: each quorum
        round needs all of them (the group's Manager server waits for every group rank), so a rank that
        stopped alone left its mate's next quorum to time out. Measured: 2 groups of 2 under host_loss, the
        mate exited 1 after quorum_timeout_s (TimeoutError from the quorum) and the run failed."""
        import torch  # lazy: torch
        import torch.distributed as dist  # lazy: torch

        flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def job_finished(self) -> bool:
        """Some rank already ran the last step (this process is a replacement that arrived late); the same
        answer on every rank of the group (the done keys only ever appear, so any rank's yes holds)."""
        return self._group_agrees(any(self.control.check([self._done_key(r)]) for r in range(self.ctx.world_size)))

    def heal_to_end(self) -> int:
        """A late replacement: heal from a finished peer, without a training step (there is none left).

        torchft's own synchronous start_quorum does exactly that (quorum, fetch, load); the Manager was built
        asynchronous for training, so it is switched for this one call."""
        self.attempt = a = Attempt(t_start=time.time())
        self.manager._use_async_quorum = False
        self.manager.start_quorum()
        a.t_end = time.time()
        if a.heal:
            self._emit_heal(a)
        return self.manager.current_step()

    def wait_for_every_rank(self, last: int) -> None:
        """Stay in the quorum until every rank has reached ``last`` (a restarted group still heals from us),
        at most ``strategy.replacement_timeout_s``: every group then stops at the same step."""
        self.control.set(self._done_key(self.ctx.rank), str(last).encode())
        deadline = time.monotonic() + self.ctx.cfg.strategy.replacement_timeout_s
        keys = [self._done_key(r) for r in range(self.ctx.world_size)]
        # The group decides together (_group_agrees): every rank of it runs the same quorum rounds.
        while not self._group_agrees(self.control.check(keys) or time.monotonic() > deadline):
            self.attempt = a = Attempt(t_start=time.time())
            self.manager.start_quorum()
            self.manager.wait_quorum()
            a.t_end = time.time()
            if a.recover_dst:
                self._emit_sent(a)
            time.sleep(0.2)
        if not self.control.check(keys):
            print(
                f"torchft: not every rank reached step {last} within strategy.replacement_timeout_s; "
                "stopping without them",
                flush=True,
            )

    def close(self) -> None:
        super().close()
        try:
            self.manager.shutdown(wait=False)
        except Exception as exc:  # noqa: BLE001 - the run's result is written already
            print(f"torchft: Manager shutdown: {exc}", flush=True)


def _onto_own_mesh(model: Any, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
    """A received optimizer state's DTensors rebuilt on this process's own device mesh.

    PGTransport allocates the tensors it has no in-place target for (a fresh optimizer has no state yet)
    as DTensors on the sender's mesh object, unpickled; this process's parameters live on its own."""
    from torch.distributed.tensor import DTensor  # lazy: torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, per_param in state.get("state", {}).items():
        param = params[int(index)]
        if not isinstance(param, DTensor):
            continue
        for key, value in list(per_param.items()):
            if isinstance(value, DTensor):
                per_param[key] = DTensor.from_local(
                    value.to_local(),
                    param.device_mesh,
                    value.placements,
                    run_check=False,
                    shape=value.shape,
                    stride=value.stride(),
                )
    return state
