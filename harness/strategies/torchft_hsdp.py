"""Strategy ``torchft``'s spec: torchft 0.2.0's fault-tolerant HSDP, run as its users run it (a peer baseline).

The rank side (``harness.rank.strategies.torchft_hsdp`` and ``torchft_rank``) says how it trains and heals;
the parent runs the Lighthouse and restarts a failed rank's whole replica group
(``harness.parent.strategies.torchft_parent``); both agree on ``harness.strategies.torchft_layout``. Pure data.
"""

from __future__ import annotations

from harness.strategies.spec import StrategySpec
from harness.strategies.torchft_check import check_runnable
from harness.strategies.torchft_config import TorchftConfig, torchft_config

SPEC = StrategySpec(
    name="torchft",
    rank_class="harness.rank.strategies.torchft_hsdp:TorchftHsdp",
    description="torchft 0.2.0 fault-tolerant HSDP: Lighthouse quorum, a group drops out and heals from a peer",
    label="torchft",
    color="tab:purple",
    order=4,
    config=TorchftConfig,
    parent_setup="harness.parent.strategies.torchft_parent:TorchftJob",
    rank_entry="harness.rank.strategies.torchft_rank:train_replica",
    check=check_runnable,
    step_timeout_s=lambda run: torchft_config(run.strategy).timeout_s,  # the Manager drops a stalled step after it
    unequal=(
        "a failed rank's whole replica group restarts (spawned, as torchrun --max-restarts does) and heals from the "
        "other group's memory; under HSDP a socket reset is such a failure too, since it breaks the rank's shard "
        "(intra-group) connections, which torchft does not retry",
        "the other groups train alone meanwhile, on part of the batch: those steps average fewer gradients (not "
        "bit-identical to the reference, by design) and count only the tokens those groups trained on",
        "each replica group saves its own checkpoint copy (the reference's DCP save writes one)",
        "a quorum with the Lighthouse on every step (asynchronous), and a max_retries of 10 the harness sets "
        "(torchft's default is unbounded) against a retry livelock",
    ),
    pace="its cross-group gradient all-reduce is torchft's Manager.allreduce, hooked on every FSDP module, in place "
    "of FSDP2's all-reduce over the replicate dimension, and while a group restarts the other trains alone, "
    "with no cross-group all-reduce at all. Fault-free, its math is the reference's bit for bit "
    "(tests/harness/test_hsdp.py), so the difference lies in how the reduction is scheduled; which part of it "
    "makes torchft's steps faster on this host was not isolated",
)
