"""How each recovery cost grows with the world size. One function per cost, each with its rule and source.

"Measured here" means the medians of results/goodput_vs_age (2 gloo ranks, mistral_tiny, CPU) or
results/rebind_scaling (2-16 ranks), committed in this repo. A published figure names its source; a value
that is neither says "assumption, unverified". Change a constant here and every projection follows.
"""

from __future__ import annotations

from harness.fleet.config import Cluster

# --- measured here -----------------------------------------------------------------------------------
# Cold restart: relaunch Python + torch + model + gloo rendezvous (median restart_s, 7 runs).
PROCESS_START_S = 7.32
# NVRx 0.4.1 in-process restart, raise -> ready, before any checkpoint load (median restart_s, 7 runs).
NVRX_INPROCESS_S = 0.67
# DCP load of a tiny model: the part of a restore that does not depend on the checkpoint's size
# (median restore_s of cold_restart, 7 runs).
RESTORE_FIXED_S = 0.40
# A peer learns of a connection reset (fault to recovery start, median; bit_identity soak data: 135 ms).
RESET_DETECT_S = 0.135
# AccelPact's out-of-band vote at 2 ranks (median agreement_s, 7 runs).
AGREEMENT_S = 0.0027
# Rebinding FSDP2's cached process groups: 11-15 us, flat from 2 to 16 ranks (results/rebind_scaling).
REBIND_S = 15e-6
# A new gloo process group on a fresh prefix (0.8-4 ms at 2 ranks).
GLOO_PG_S = 0.004
# torchrun's agent SIGTERMs the survivors 0.9 s after one rank dies (measured under torchrun here).
CRASH_DETECT_S = 0.9
# A rank lost with its host, seen through the control store's deadline: RankLostError after 30.3 s
# (measured here, before death notices).
HOST_DETECT_S = 30.0
# AccelPact's survivors learn of a dead peer from a death notice (0.12 s after a SIGKILL when the
# launcher sees the exit) or, with no launcher on the host (a lost host), from 4 missed heartbeats of
# 0.5 s: RankLostError 2.1 s after the kill (both measured here, benchmarks/bench_detection.py). The
# heartbeat figure is used for both classes: the conservative one.
ACCELPACT_DEAD_PEER_S = 2.1

# --- published ---------------------------------------------------------------------------------------
# NCCL communicator init: "2.5-minute init time at large scale (e.g. above certain K GPUs)", the
# bootstrap all-gather growing with the rank count (NVIDIA/nccl issue #1156, 2024). The GPU count is not
# given: placing 150 s at 100k GPUs, linear in N, is our assumption (unverified) -> 1.5 ms per GPU.
NCCL_INIT_PER_GPU_S = 150.0 / 100_000
# torchft's lighthouse: heartbeats every 100 ms, a 1 s timeout drops a replica (pytorch/torchft issue #35).
# A cross-check only: the simulator charges the survivors' stop measured here (harness.scale.torchft_measured).
TORCHFT_QUORUM_S = 1.0
# Llama 3: 400 Gbps per GPU between hosts (The Llama 3 Herd of Models, section 3.3) -> 50 GB/s.
NIC_GBPS = 50.0

# --- assumptions, unverified -------------------------------------------------------------------------
# The vote is one store write per rank, read by the coordinator: O(N) at a store serving ~50k ops/s.
STORE_OPS_PER_S = 50_000.0
# Copy of the rank's own /dev/shm snapshot back into device memory (host memory copy, ~10 GB/s).
SHM_GBPS = 10.0


def comm_init_s(gpus: int) -> float:
    """A fresh communicator over ``gpus`` ranks: gloo's measured build plus NCCL's per-rank bootstrap."""
    return GLOO_PG_S + NCCL_INIT_PER_GPU_S * gpus


def agreement_s(gpus: int) -> float:
    """AccelPact's vote: the measured 2-rank round plus one store operation per rank."""
    return AGREEMENT_S + gpus / STORE_OPS_PER_S


def process_restart_s(gpus: int) -> float:
    """Every process relaunched (torchrun): Python + torch + model start, then a fresh communicator."""
    return PROCESS_START_S + comm_init_s(gpus)


def inprocess_restart_s(gpus: int) -> float:
    """NVRx in-process restart: processes stay, process groups are destroyed and rebuilt."""
    return NVRX_INPROCESS_S + comm_init_s(gpus)


def restore_s(cluster: Cluster) -> float:
    """Load the newest checkpoint: every GPU's state over the aggregate read bandwidth, plus the fixed part."""
    return RESTORE_FIXED_S + cluster.checkpoint_read_s


def heal_local_s(cluster: Cluster) -> float:
    """A replacement process on a live host reloads its rank's shard from its own shm snapshot."""
    return cluster.checkpoint_gb_per_gpu / SHM_GBPS


def heal_remote_s(cluster: Cluster) -> float:
    """A replacement host pulls each rank's shard from its buddy on another host (one shard per NIC)."""
    return cluster.checkpoint_gb_per_gpu / NIC_GBPS


def spare_s(cluster: Cluster) -> float:
    """Getting a replacement host: a warm spare, or a repair when none is at hand."""
    return cluster.spare_swap_s if cluster.spare_available else cluster.host_repair_s
