"""Side-by-side measurement of checkpoint save modes: step latency, CPU time, host memory, bytes written.

The measuring core of ``benchmarks/bench_checkpoint.py`` (the script) and ``experiments.ckpt_overhead``
(the experiment), moved here so both import it. One pair of gloo ranks trains a fault-free FSDP2
Mistral-style decoder (AdamW, deterministic batches) and runs every configuration in turn, in blocks
of ``steps`` steps, repeated ``rounds`` times. Interleaving matters on a shared machine: load from
other processes then hits every configuration alike. A block ends by draining its configuration's
in-flight save, charged to that block.

    none           no checkpointing (the reference)
    sync           dcp.save after every update
    async          dcp.async_save after every update, fresh staging buffers each time
    async_cached   dcp.async_save after every update, one DefaultStager reusing its buffers
    async_pinned   as async_cached with pinned buffers (only where CUDA exists)
    every_k_async  dcp.async_save every k updates
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import socket
import statistics
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from harness.report.paper import PAPER_CKPT

WORLD = 2
# The paper's figures (1.216B decoder, per-update async checkpointing), for printing beside ours.
PAPER = PAPER_CKPT
# fp32 weights + AdamW exp_avg + exp_avg_sq: what a model+optimizer checkpoint holds per parameter.
CKPT_BYTES_PER_PARAM = 12
# ... plus fp32 gradients: what training keeps resident per parameter (sharded, summed over ranks).
TRAIN_STATE_BYTES_PER_PARAM = 16


@dataclass(frozen=True)
class ModelSize:
    """The shape of a Mistral-style decoder and its per-rank batch (picklable, no harness import)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    seq: int
    batch: int

    @classmethod
    def from_model_config(cls, m: Any) -> ModelSize:
        """From a ``harness.schema.ModelConfig`` (conf/model/*.yaml)."""
        return cls(
            m.vocab_size,
            m.hidden_size,
            m.intermediate_size,
            m.num_layers,
            m.num_heads,
            m.num_kv_heads,
            m.seq_len,
            m.batch_size,
        )

    def params(self) -> int:
        """Parameter count of MistralForCausalLM with untied embeddings (exact, no biases)."""
        head_dim = self.hidden // self.heads
        attn = self.hidden * self.hidden * 2 + self.hidden * self.kv_heads * head_dim * 2
        mlp = 3 * self.hidden * self.intermediate
        layer = attn + mlp + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * layer + self.hidden

    def tokens_per_step(self, world: int = WORLD) -> int:
        return self.seq * self.batch * world


@dataclass(frozen=True)
class Config:
    name: str
    mode: str | None  # None = no checkpointing
    interval: int


def configs(k: int, names: list[str]) -> list[Config]:
    """The configurations named in ``names`` (``every_k_async`` becomes ``every_<k>_async``)."""
    table = {
        "none": Config("none", None, 0),
        "sync": Config("sync", "sync", 1),
        "async": Config("async", "async", 1),
        "async_cached": Config("async_cached", "async_cached", 1),
        "async_pinned": Config("async_pinned", "async_pinned", 1),
        "every_k_async": Config(f"every_{k}_async", "async", k),
    }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; choose from {sorted(table)}")
    return [table[n] for n in names]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(size: ModelSize):
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import MistralForCausalLM

    from harness.models import hf_config
    from harness.schema import ModelConfig

    # harness.models.hf_config: the harness's own model (sdpa set explicitly, so transformers never
    # probes the hub for attention kernels). Full init then shard: fine at the sizes that fit here.
    cfg = hf_config(
        ModelConfig(
            name="ckpt_sweep",
            vocab_size=size.vocab,
            hidden_size=size.hidden,
            intermediate_size=size.intermediate,
            num_layers=size.layers,
            num_heads=size.heads,
            num_kv_heads=size.kv_heads,
            max_position=max(size.seq, 128),
            seq_len=size.seq,
            batch_size=size.batch,
        )
    )
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


_CACHED_MODES = ("async_cached", "async_pinned")


def _return_freed_memory() -> None:
    """Hand memory freed by a block back to the OS (glibc keeps freed heap chunks otherwise), so one
    config's released staging buffers do not count in the next config's resident memory."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: measurements are merely less clean
        pass


def _rank(
    rank: int, port: int, size: ModelSize, cfgs: list[Config], root: str, warmup: int, steps: int, rounds: int, queue
) -> None:
    """One rank. Runs `rounds` x (one block of `steps` steps per config), configs interleaved so that
    load from other processes on the host hits every config alike. A block ends with the config's
    in-flight save drained (its time is charged to that block)."""
    try:
        import time

        import torch
        import torch.distributed as dist

        from harness.checkpoint import Checkpointer, CheckpointSettings

        torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(minutes=30)
        )
        model, optimizer = _build(size)

        def checkpointer(c: Config) -> Checkpointer:
            return Checkpointer(
                CheckpointSettings(os.path.join(root, c.name), c.interval, c.mode, keep=1), model, optimizer
            )

        # Cached-staging modes hold their host buffers for the Checkpointer's life. Built once, they
        # would sit in RSS during every other config's blocks too, so each such config gets a
        # Checkpointer per block, warmed by one untimed save (its steady state: buffers allocated).
        per_block = {c.name for c in cfgs if c.mode in _CACHED_MODES}
        ckpts = {c.name: checkpointer(c) if c.mode is not None and c.name not in per_block else None for c in cfgs}
        out = {
            c.name: {
                "step_s": [],
                "cpu_s": [],
                "stalls": [],
                "stage_s": [],
                "write_s": [],
                "block_s": [],
                "drain_s": [],
                "bytes_total": [],
                "bytes_rank": [],
                "rss_peak_delta": [],
                "saves": 0,
                "windows": [],
            }
            for c in cfgs
        }
        step = 0

        def one_step() -> None:
            g = torch.Generator().manual_seed(1000 * step + rank)
            ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(warmup):
            one_step()
            step += 1
        # Peak RSS of training alone (model, grads, AdamW state, activations), before any save.
        rss_ready = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        for _ in range(rounds):
            for c in cfgs:
                ckpt, o = ckpts[c.name], out[c.name]
                if c.name in per_block:
                    ckpt = checkpointer(c)
                    ckpt.save(step - 1)
                    ckpt.wait()
                records = []
                dist.barrier()
                w_block = time.time()
                t_block = time.perf_counter()
                cpu_block = time.process_time()  # all threads of this rank, writer threads included
                for _ in range(steps):
                    t0 = time.perf_counter()
                    one_step()
                    if ckpt is not None and ckpt.due(step):
                        records.append(ckpt.save(step))
                    o["step_s"].append(time.perf_counter() - t0)
                    step += 1
                t_drain = time.perf_counter()
                if ckpt is not None:
                    ckpt.wait()
                o["drain_s"].append(time.perf_counter() - t_drain)
                o["block_s"].append(time.perf_counter() - t_block)
                o["cpu_s"].append(time.process_time() - cpu_block)
                o["windows"].append((w_block, time.time()))
                if c.name in per_block:
                    ckpt.close()
                _return_freed_memory()
                o["saves"] += len(records)
                for r in records:
                    o["stalls"].append(r.stall_s)
                    o["stage_s"].append(r.stall_s - r.wait_s)
                    # The write itself: the stall for sync; staging end -> write complete for async.
                    o["write_s"].append(r.stall_s if r.mode == "sync" else (r.t_complete or r.t_end) - r.t_end)
                    o["bytes_total"].append(r.bytes_total)
                    o["bytes_rank"].append(r.bytes_rank)
                    o["rss_peak_delta"].append(r.rss_peak_delta)
        for ckpt in ckpts.values():
            if ckpt is not None:
                ckpt.close()
        for o in out.values():
            o["maxrss_ready"] = rss_ready
            o["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        queue.put((rank, out))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - shown by the parent
        queue.put((rank, {"error": traceback.format_exc()}))


class HostRssSampler:
    """Samples the summed RSS of the rank processes from the parent, every ``interval_s``.

    Host memory as the machine sees it (every thread and buffer of every rank), read from outside so
    a busy rank cannot delay its own sample."""

    def __init__(self, pids: list[int], interval_s: float = 0.05) -> None:
        import threading

        import psutil

        self._procs = [psutil.Process(p) for p in pids]
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.samples: list[tuple[float, int]] = []  # (time.time(), summed RSS bytes)
        self._thread = threading.Thread(target=self._run, name="host-rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import time

        import psutil

        while not self._stop.wait(self._interval_s):
            try:
                total = sum(p.memory_info().rss for p in self._procs)
            except psutil.Error:  # a rank has exited: the sweep is over
                return
            self.samples.append((time.time(), total))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def run(size: ModelSize, cfgs: list[Config], root: str, warmup: int, steps: int, rounds: int) -> list[dict]:
    """Start WORLD spawned ranks, run the interleaved sweep, return each rank's raw measurements
    (rank 0's dict also carries ``host_rss``: the parent's (time, summed RSS) samples).
    ``root`` (checkpoint directories) is emptied first and deleted after."""
    # Spawned ranks import harness/ and experiments/ by module name: make sure the repo root is on
    # the path they inherit, also when this was started as a script from another directory.
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if repo_root not in sys.path:
        sys.path.insert(0, repo_root)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    shutil.rmtree(root, ignore_errors=True)
    procs = [
        ctx.Process(target=_rank, args=(r, port, size, cfgs, root, warmup, steps, rounds, queue)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    sampler = HostRssSampler([p.pid for p in procs])
    out = {}
    try:
        for _ in range(WORLD):
            rank, res = queue.get(timeout=6 * 3600)
            out[rank] = res
    finally:
        samples = sampler.stop()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        shutil.rmtree(root, ignore_errors=True)
    for r in range(WORLD):
        if "error" in out[r]:
            raise RuntimeError(f"rank {r} failed:\n{out[r]['error']}")
    out[0]["host_rss"] = samples
    return [out[r] for r in range(WORLD)]


def block_peaks(windows: list[tuple[float, float]], samples: list[tuple[float, int]]) -> list[int]:
    """Largest sample inside each (start, end) window; 0 for a window no sample fell in. Pure."""
    peaks = []
    for start, end in windows:
        inside = [rss for t, rss in samples if start <= t <= end]
        peaks.append(max(inside, default=0))
    return peaks


def summarize(cfg: Config, res: list[dict], steps_per_block: int) -> dict:
    """One config's row. Step latency = block time (steps + final drain) / steps, slowest rank."""
    o = [r[cfg.name] for r in res]
    block = [max(v) for v in zip(*(x["block_s"] for x in o))]
    per_step = [b / steps_per_block for b in block]
    # CPU seconds per step summed over ranks: the work a config adds, insensitive to other load on
    # the host (on 2 cores shared by 2 ranks there is no idle core to hide a background write).
    cpu = [sum(v) / steps_per_block for v in zip(*(x["cpu_s"] for x in o))]
    stalls = [max(v) for v in zip(*(x["stalls"] for x in o))]
    stage = [max(v) for v in zip(*(x["stage_s"] for x in o))]
    write = [max(v) for v in zip(*(x["write_s"] for x in o))]
    per_save = o[0]["bytes_total"]
    # Host memory while this config ran: the parent's summed-RSS samples inside its blocks (rank 0's
    # windows; ranks enter a block together). The smallest block peak over rounds is the config's
    # own need: a larger one can only add memory other configs left behind.
    peaks = [p for p in block_peaks(o[0]["windows"], res[0].get("host_rss", [])) if p > 0]
    return {
        "config": cfg.name,
        "mode": cfg.mode or "none",
        "interval": cfg.interval,
        "step_mean_s": statistics.fmean(per_step),
        "step_median_s": statistics.median(per_step),
        "step_blocks_s": per_step,
        "cpu_per_step_s": statistics.fmean(cpu),
        "stall_mean_s": statistics.fmean(stalls) if stalls else 0.0,
        "stage_mean_s": statistics.fmean(stage) if stage else 0.0,
        "write_mean_s": statistics.fmean(write) if write else 0.0,
        "drain_mean_s": statistics.fmean(max(v) for v in zip(*(x["drain_s"] for x in o))),
        "saves": o[0]["saves"],
        "bytes_per_ckpt": per_save[0] if per_save else 0,
        "bytes_per_hour": sum(per_save) / sum(block) * 3600 if block else 0.0,
        "save_rss_peak_delta_sum": sum(max(x["rss_peak_delta"], default=0) for x in o),
        "maxrss_sum": sum(x["maxrss"] for x in o),
        "train_rss_sum": sum(x["maxrss_ready"] for x in o),
        "host_peak_bytes": min(peaks) if peaks else 0,
        "host_peak_max_bytes": max(peaks) if peaks else 0,
    }


def add_overheads(rows: list[dict]) -> list[dict]:
    """Fill overhead_pct (mean), overhead_median_pct and cpu_overhead_pct against the ``none`` row."""
    base = next((x for x in rows if x["config"] == "none"), None)
    for x in rows:
        if base is None:
            x["overhead_pct"] = x["overhead_median_pct"] = x["cpu_overhead_pct"] = float("nan")
            continue
        x["overhead_pct"] = (x["step_mean_s"] / base["step_mean_s"] - 1) * 100
        x["overhead_median_pct"] = (x["step_median_s"] / base["step_median_s"] - 1) * 100
        x["cpu_overhead_pct"] = (x["cpu_per_step_s"] / base["cpu_per_step_s"] - 1) * 100
    return rows


def fits(size: ModelSize, names: list[str]) -> tuple[bool, str]:
    """Host bytes the run needs: fp32 params + grads + 2 AdamW states (16 B/param), plus one staged
    copy (12 B/param) for async modes, plus ~1.5 GiB per rank of runtime and activations."""
    import psutil

    p = size.params()
    staged = CKPT_BYTES_PER_PARAM * p if any(n not in ("none", "sync") for n in names) else 0
    need = TRAIN_STATE_BYTES_PER_PARAM * p + staged + WORLD * 1.5 * 2**30
    avail = psutil.virtual_memory().available
    return need < 0.8 * avail, f"needs ~{need / 2**30:.1f} GiB of host memory, {avail / 2**30:.1f} GiB available"
