"""The NCCL backend: abort the broken communicator, rebuild on the bound GPU, vote on the GPU.

UNTESTED ON HARDWARE: written against torch 2.13's ProcessGroupNCCL without a GPU; the pure logic
(environment check, error classification, abort bookkeeping) is unit-tested with fakes, and
``benchmarks/gpu_check.py`` is the prepared check for a machine with two or more GPUs.

Recovery needs the process to survive a collective error, so :meth:`NcclBackend.configure` sets
``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (abort the communicators, keep the process) before any group is
created and :meth:`NcclBackend.check` refuses a mode that kills the process. The abort is the group's
CUDA backend's ``abort()`` (ncclCommAbort); the vote waits for the device; a rebuilt group is bound to the
old ``device_id``. docs/design.md, "The NCCL backend", says why each.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from accelpact.backends.base import Backend, Waiter
from accelpact.errors import AccelPactError, CommFault

if TYPE_CHECKING:
    import torch.distributed as dist

    from accelpact.backends.generations import GroupSpec
    from accelpact.backends.vote_buffer import VoteBuffer

__all__ = ["NcclBackend", "ERROR_HANDLING_VARS", "RECOVERABLE_ERROR_HANDLING", "error_handling_problem"]

# The variable and its deprecated alias, in the order ProcessGroupNCCL reads them.
ERROR_HANDLING_VARS: tuple[str, ...] = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")
# Modes that keep the process alive after a collective error (see the module docstring).
RECOVERABLE_ERROR_HANDLING: frozenset[str] = frozenset({"0", "2"})
_WANTED = "2"


def error_handling_problem(environ: Mapping[str, str]) -> str | None:
    """Why NCCL error handling configured in ``environ`` would kill the process, or None if it is fine."""
    for var in ERROR_HANDLING_VARS:
        value = environ.get(var)
        if value is not None:
            if value.strip() in RECOVERABLE_ERROR_HANDLING:
                return None
            return (
                f"{var}={value} makes NCCL's watchdog tear the process down on a collective error, so "
                f"nothing is left to recover. Set {ERROR_HANDLING_VARS[0]}={_WANTED} (abort the communicator, "
                "keep the process) before init_process_group, e.g. by calling "
                "accelpact.backends.NcclBackend.configure() first"
            )
    return (
        f"{ERROR_HANDLING_VARS[0]} is not set: torch's default (3, skip clean-up) tears the process down on a "
        f"collective error. Set {ERROR_HANDLING_VARS[0]}={_WANTED} before init_process_group, e.g. by calling "
        "accelpact.backends.NcclBackend.configure() first"
    )


class NcclBackend(Backend):
    """NCCL on CUDA: abort = ncclCommAbort of the live generation; vote and probes on the bound GPU."""

    name = "nccl"
    devices = ("cuda",)
    # Lower-cased fragments of NCCL transport failures as ProcessGroupNCCL words them.
    fault_markers = (
        "nccl error",  # "NCCL error in: ...ProcessGroupNCCL.cpp:..., remote process exited or ..."
        "ncclremoteerror",
        "remote process exited or there was a network error",
        "ncclsystemerror",
        "unhandled system error",
        "watchdog caught collective operation timeout",
        "communicator was aborted",
        "nccl communicator",
    )
    # "NCCL error" also prefixes usage and CUDA errors, which a new communicator would hit again.
    never_markers = (
        "ncclinvalidusage",
        "invalid usage",
        "ncclinvalidargument",
        "invalid argument",
        "unhandled cuda error",
        "cuda error",
    )

    def __init__(self) -> None:
        super().__init__()
        self._device: torch.device | None = None

    @classmethod
    def configure(cls, environ: MutableMapping[str, str] | None = None) -> None:
        """Default ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` to 2 (abort the communicator, keep the process).

        A value the user set is left alone (:meth:`check` rejects one that kills the process).
        """
        env = os.environ if environ is None else environ
        if not any(var in env for var in ERROR_HANDLING_VARS):
            env[ERROR_HANDLING_VARS[0]] = _WANTED

    def check(self, pg: dist.ProcessGroup) -> None:
        super().check(pg)
        problem = error_handling_problem(os.environ)
        if problem is not None:
            raise AccelPactError(problem)
        try:
            pg._get_backend(torch.device("cuda"))
        except RuntimeError as exc:
            raise AccelPactError(
                f"process group {getattr(pg, 'group_name', pg)!r} has no CUDA backend ({exc}); the nccl backend "
                "needs init_process_group('nccl', device_id=torch.device('cuda', local_rank))"
            ) from exc

    @property
    def device(self) -> torch.device:
        if self._device is None:
            bound = next((g.bound_device_id for g in self.groups if getattr(g, "bound_device_id", None)), None)
            self._device = bound if bound is not None else torch.device("cuda", torch.cuda.current_device())
        return self._device

    def rebuild_device(self, spec: GroupSpec) -> torch.device:
        return spec.device_id if spec.device_id is not None else self.device

    def abort(self) -> int:
        return _abort_groups(self.groups)

    def vote(self, buf: VoteBuffer, pg: dist.ProcessGroup, wait: Waiter | None = None) -> int:
        # NCCL collectives are asynchronous to the CPU: without waiting for the device the guard
        # would call optimizer.step() on a vote that may still fail. Reading the sum waits for the kernel;
        # after a watchdog abort the kernel ends without a result, so the sum is the proof: its low bits
        # count the voters exactly when every rank entered the vote.
        # (Work.is_success is not relied on: ProcessGroupNCCL has deprecated it.)
        from accelpact.common.positions import count_of

        value = super().vote(buf, pg, wait)
        if count_of(value, pg.size()) != pg.size():
            raise CommFault(
                f"the commit vote on {getattr(pg, 'group_name', pg)!r} did not complete "
                f"(sum {value}, expected {pg.size()}): NCCL communicator was aborted",
                phase="vote",
            )
        return value

    def abandon(self, groups: list[dist.ProcessGroup], work: Any, pg_timeout: datetime.timedelta) -> None:
        # A hung NCCL kernel occupies the stream until its communicator is aborted: abort it now,
        # and still keep the objects until the timeout (their destructors may wait on the work).
        _abort_groups(groups)
        super().abandon(groups, work, pg_timeout)


def _abort_groups(groups: Sequence[Any]) -> int:
    """ncclCommAbort every group's CUDA backend; an already aborted or missing one is skipped."""
    n = 0
    for pg in groups:
        try:
            pg._get_backend(torch.device("cuda")).abort()
            n += 1
        except RuntimeError:
            pass  # no CUDA backend on this group, or the communicator is already gone
    return n
