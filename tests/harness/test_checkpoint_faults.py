"""Checkpoint integrity under faults: a rank SIGKILLed in the middle of a save, for every CPU mode.

Two real gloo ranks train a tiny FSDP2 Mistral and save real DCP checkpoints every 3 steps (after
steps 2, 5, 8). During the save of step 8, rank 1 SIGKILLs itself from inside DCP's storage writer,
right after its shard's bytes reached the disk (the most misleading moment: data files exist, the
save is not finished): on the loop's thread for ``sync``, on the background writer thread for
``async`` and ``async_cached``. Rank 0 is left to fail on its own (its half of the save cannot
finish without rank 1), then killed like a launcher would. Then:

- step 8's directory exists with data but is never marked complete, and rank 0 never reported it
  complete;
- two fresh ranks see step 5 as the newest complete checkpoint, load it into a model initialised
  from another seed, replay steps 6..10, and end bit-identical (every parameter and AdamW state
  shard, and every loss) to an uninterrupted run of steps 0..10 in the same processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest

from harness.checkpoint.layout import MARKER, step_dir_name

WORLD = 2
STEPS = 11
KILLED_SAVE = 8
JOIN_TIMEOUT_S = 300


def _faulted_job(rank: int, root: str, mode: str, queue) -> None:
    """Train, save every 3 steps; rank 1 kills itself while writing step 8's shard."""
    import test_checkpoint as tc
    import torch
    import torch.distributed.checkpoint.filesystem as fs

    from harness.checkpoint.checkpointer import Checkpointer, CheckpointSettings

    if rank == 1:
        original = fs.FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            out = original(self, plan, planner)
            if step_dir_name(KILLED_SAVE) in str(self.path):
                if isinstance(out, torch.futures.Future):
                    out.wait()  # the shard's bytes are on disk; the save is not finished
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        fs.FileSystemWriter.write_data = write_then_die
    model, optimizer = tc._build(seed=0)
    completed = []

    def on_event(kind: str, **fields) -> None:
        if kind == "checkpoint" and fields.get("complete"):
            completed.append(fields.get("step"))

    ckpt = Checkpointer(
        CheckpointSettings(directory=root, interval=3, mode=mode, keep=3),
        model,
        optimizer,
        on_event=on_event,
        timeout=timedelta(seconds=20),
    )
    for step in range(STEPS):
        tc._train_step(model, optimizer, step, rank)
        if ckpt.due(step):
            record = ckpt.save(step)
            if record is not None and record.complete:
                completed.append(record.step)
            queue.put((rank, "saved", step, sorted(set(completed))))
    ckpt.wait()
    queue.put((rank, "finished", STEPS, sorted(set(completed))))


def _resume_job(rank: int, root: str, mode: str) -> dict:
    """The reference run (steps 0..10, no checkpoint), then a fresh model restored from disk + replay."""
    import test_checkpoint as tc

    from harness.checkpoint.checkpointer import Checkpointer, CheckpointSettings

    model, optimizer = tc._build(seed=0)
    ref_losses = [tc._train_step(model, optimizer, s, rank) for s in range(STEPS)]
    ref_state = tc._local_state(model, optimizer)
    del model, optimizer
    model, optimizer = tc._build(seed=1234)  # everything must come from the checkpoint
    ckpt = Checkpointer(CheckpointSettings(directory=root, interval=3, mode=mode, keep=3), model, optimizer)
    latest = ckpt.latest()
    restored = ckpt.load_latest()
    losses = {s: tc._train_step(model, optimizer, s, rank) for s in range(restored.from_step + 1, STEPS)}
    ckpt.close()
    return {
        "latest": latest,
        "from_step": restored.from_step,
        "loss_diffs": [s for s, v in losses.items() if v != ref_losses[s]],
        "state_diffs": tc._diff(tc._local_state(model, optimizer), ref_state),
    }


def _faulted_main(rank: int, port: int, root: str, mode: str, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30)
        )
        _faulted_job(rank, root, mode, queue)
    except BaseException as exc:  # noqa: BLE001 - rank 0 is expected to fail once rank 1 is gone
        queue.put((rank, "error", -1, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))


def _run_faulted(root: Path, mode: str) -> tuple[list[int | None], list[tuple]]:
    import test_checkpoint as tc

    ctx = mp.get_context("spawn")
    port = tc._free_port()
    queue = ctx.Queue()
    procs = [ctx.Process(target=_faulted_main, args=(r, port, str(root), mode, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    procs[1].join(timeout=JOIN_TIMEOUT_S)
    # Rank 0's half of the save cannot finish: give it its checkpoint timeout (20 s) and the PG's to
    # fail by itself, then end it as an elastic agent would once a member died.
    procs[0].join(timeout=90)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    messages = []
    while not queue.empty():
        messages.append(queue.get())
    return [p.exitcode for p in procs], messages


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async", "async_cached"])
def test_sigkill_during_a_save_never_marks_it_complete_and_resume_is_bit_identical(tmp_path: Path, mode: str):
    import test_checkpoint as tc

    root = tmp_path / "ckpt"
    t0 = time.time()
    codes, messages = _run_faulted(root, mode)
    assert codes[1] == -signal.SIGKILL, (
        f"rank 1 was to SIGKILL itself in the save of step {KILLED_SAVE}: {codes}, {messages}"
    )
    killed = root / step_dir_name(KILLED_SAVE)
    assert killed.is_dir() and any(killed.iterdir()), f"the killed save wrote nothing: {sorted(os.listdir(root))}"
    assert not (killed / MARKER).exists(), (
        f"the save of step {KILLED_SAVE} was marked complete: {sorted(os.listdir(killed))}"
    )
    reported = {m[0]: m[3] for m in messages if m[1] in ("saved", "finished")}
    assert all(KILLED_SAVE not in steps for steps in reported.values()), f"a rank reported step 8 complete: {messages}"
    assert (root / step_dir_name(5) / MARKER).exists()

    results = tc._run_ranks(_resume_job, str(root), mode)
    for rank, res in enumerate(results):
        assert res["latest"] == 5 and res["from_step"] == 5, (rank, res)
        assert res["loss_diffs"] == [], f"rank {rank}: losses after the restore differ at steps {res['loss_diffs']}"
        assert res["state_diffs"] == [], (
            f"rank {rank}: state differs from the uninterrupted run: {res['state_diffs'][:5]}"
        )
    print(
        f"{mode}: faulted + resumed in {time.time() - t0:.0f} s; rank 0's end: "
        f"{[m for m in messages if m[0] == 0][-1:]}"
    )
