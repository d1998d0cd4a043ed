"""One tidy results row per run: ``<run_dir>/summary.json`` + ``<run_dir>/row.csv``, and an index.

Every file is written atomically (temp file + ``os.replace``), so a reader never sees half a row.
The index (``RunConfig.index_path``, default ``outputs/index.csv``) gathers the rows of all runs; it
is rewritten under an exclusive file lock, so concurrent runs do not lose rows and a row with new
columns (a newer harness adds columns) widens the table instead of breaking it.
A run that dies still gets its row, with ``status=failed`` and the ``reason``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import events as ev
from harness import identity
from harness.faults.schedule import targeted_age
from harness.report.gitinfo import git_state
from harness.report.goodput import compute_goodput, save_report
from harness.schema import RunConfig

if TYPE_CHECKING:
    import pandas as pd

ROW_FILE = "row.csv"
SUMMARY_FILE = "summary.json"
REPO_ROOT = Path(__file__).resolve().parents[2]


def git_sha(repo: Path = REPO_ROOT) -> tuple[str, bool]:
    """(HEAD sha, working tree dirty) for a results row; ("unknown", False) outside git."""
    sha, dirty = git_state(repo)
    return sha or "unknown", bool(dirty)


def step_stats(events: Sequence[Mapping[str, Any] | ev.Event], world_size: int) -> dict[str, Any]:
    """Throughput and loss figures from the ranks' step events (pure).

    ``steps_done`` is every step some rank committed: under torchft a replica group that was lost and came
    back after the others finished the run ran no step of its own, and a count of rank 0's steps alone
    reported 4 of 10 steps for a run that did all 10 (rank 0's group was the one restarted). The loss and
    the step times are those of the rank that ran the most steps (the lowest such rank), rank 0 whenever it
    ran them all."""
    typed = ev.typed(events)
    steps = ev.of_type(typed, ev.Step)
    by_rank: dict[int, list[ev.Step]] = {}
    for e in steps:
        by_rank.setdefault(e.rank, []).append(e)
    lead: list[ev.Step] = []
    if by_rank:
        lead_rank = min(by_rank, key=lambda r: (-len({e.step for e in by_rank[r]}), r))
        lead = sorted(by_rank[lead_rank], key=lambda e: e.t_end)
    out: dict[str, Any] = {
        "steps_done": len({e.step for e in steps}),
        "tokens": sum(e.tokens for e in steps),
        "final_loss": lead[-1].loss if lead else None,
        "train_s": None,
        "tokens_per_s": None,
        "steps_per_s": None,
        "step_time_median_s": None,
    }
    if lead:
        train_s = max(e.t_end for e in steps) - min(e.t_start for e in steps)
        out["train_s"] = train_s
        out["step_time_median_s"] = statistics.median(e.t_end - e.t_start for e in lead)
        if train_s > 0:
            out["tokens_per_s"] = out["tokens"] / train_s
            out["steps_per_s"] = len(lead) / train_s
    ready = [e.t_ready - e.t_launch for e in ev.of_type(typed, ev.Restart) if e.t_launch]
    out["startup_s"] = max(ready) if ready else None
    return out


def build_row(
    run: RunConfig,
    run_dir: Path,
    *,
    run_id: str,
    status: str,
    reason: str,
    wall_s: float,
    n_params: int | None,
    started_at: float,
    overrides: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
    events: Sequence[Mapping[str, Any] | ev.Event] | None = None,
) -> dict[str, Any]:
    """The row of a finished (or failed) run, from its config, events (read here if not given) and
    identity records."""
    import torch  # lazy: torch

    sha, dirty = git_sha()
    row: dict[str, Any] = {
        "run_id": run_id,
        "git_sha": sha,
        "git_dirty": dirty,
        "experiment": run.name,
        "model": run.model.name,
        "n_params": n_params,
        "world_size": run.cluster.world_size,
        "cluster": run.cluster.name,
        "backend": run.cluster.backend,
        "device": run.cluster.device.value,
        "precision": run.train.mixed_precision.value,
        "strategy": run.strategy.name,
        "fault": run.fault.kind,
        "checkpoint_mode": run.checkpoint.mode.value if run.checkpoint.interval else "none",
        "checkpoint_interval": run.checkpoint.interval,
        "seed": run.train.seed,
        "steps": run.train.steps,
        "batch_size": run.model.batch_size,
        "seq_len": run.model.seq_len,
        "status": status,
        "reason": reason,
        "wall_s": wall_s,
    }
    if events is None:
        events = ev.load_events(run_dir)
    row.update(step_stats(events, run.cluster.world_size))
    row.update(identity.summarize(run_dir))
    row.update(
        {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started_at)),
            "host": socket.gethostname(),
            "torch": torch.__version__,
            "overrides": " ".join(overrides),
            "run_dir": str(run_dir),
        }
    )
    row.update(extra or {})
    return row


def goodput_columns(
    run: RunConfig,
    run_dir: Path,
    parent: dict[str, Any],
    reference_dir: Path | None = None,
    events: Sequence[Mapping[str, Any] | ev.Event] | None = None,
) -> dict[str, Any]:
    """Whole-run goodput, the badput breakdown, replays, faults and fallback of a run (from its events),
    and ``bit_identical`` against ``reference_dir`` (None when there is no reference to compare with).

    ``parent``: what the parent knows (``relaunch_reasons``: why it relaunched the ranks).
    The goodput report is computed here, once per run, and saved as ``goodput.json`` for every later
    reader (tables, plots, experiments)."""
    events = ev.load_events(run_dir) if events is None else ev.typed(events)
    report = compute_goodput(events)
    save_report(str(run_dir), report)
    badput = report.badput
    relaunch_reasons = [r for r in str(parent.get("relaunch_reasons") or "").split("; ") if r]
    fallback_reasons = list(report.fallbacks) + [r for r in relaunch_reasons if r.startswith("fallback")]
    cols: dict[str, Any] = {
        "age": targeted_age(run.fault, run.checkpoint.interval),
        "goodput": report.goodput,
        "useful_tokens": report.tokens,
        "goodput_wall_s": report.timeline.wall_s,
        "useful_s": report.useful_s,
        **{f"badput_{k}": v for k, v in badput.as_dict().items()},
        "recovery_s": badput.recovery_s,
        "replayed_steps": report.replayed_steps,
        "faults": len(report.faults),
        "recoveries": sum(1 for e in ev.of_type(events, ev.Recovery) if e.rank == 0),
        "fallback": bool(fallback_reasons),
        "fallback_reason": "; ".join(dict.fromkeys(fallback_reasons))[:1000],
        "bit_identical": None,
        "reference_run": str(reference_dir) if reference_dir is not None else None,
    }
    cols.update(detection_columns(events))
    cols.update(heal_columns(events, fallback=bool(fallback_reasons)))
    cols.update(restore_columns(events))
    if reference_dir is not None:
        comparison = identity.compare_runs(reference_dir, run_dir)
        cols["bit_identical"] = comparison.equal
        cols["identity_detail"] = comparison.describe(limit=3)[:500]
    return cols


def heal_columns(events: Sequence[Mapping[str, Any] | ev.Event], fallback: bool = False) -> dict[str, Any]:
    """Lost ranks healed in memory (pure): how many, from which source, and how long (slowest rank).

    ``heal_source``: where the lost ranks' state came from: "own" (the dead process's own snapshot in
    shared memory), "buddy" (a replica on another host), "disk" (a fallback to the checkpoint after a
    rank was lost; ``fallback`` says why), "snapshot" (a fallback whose relaunch resumed from the snapshots
    every rank held: accelpact_heal) or None (no rank was lost). Several heals: joined with "+".
    ``heal_total_s``: per heal, the slowest rank's caught-or-launched -> first collective; summed.
    ``heal_process_start_s``: the replacements' own start, launch (a fork from the template, or a spawn) ->
    arrival, summed.
    ``heal_replacement_start``: how each replacement started, in order ("template", "spawn" or "hot_spare",
    joined with "+"); ``heal_template_fallback``: why the template was not used where one was wanted.
    """
    typed = ev.typed(events)
    heals = ev.of_type(typed, ev.Heal)
    by_generation: dict[int, list[ev.Heal]] = {}
    for e in heals:
        by_generation.setdefault(e.generation, []).append(e)
    sources = [sorted({str(e.source) for e in group})[0] for _, group in sorted(by_generation.items())]
    replacements = [e for e in heals if e.role == "replacement"]
    started = sorted(ev.of_type(typed, ev.Replacement), key=lambda e: e.replacement)
    # A rank was lost (its death seen by notice or heartbeat, or its heal failed) and the run fell back.
    lost = any(e.detected_by in ("notice", "heartbeat", "heal") for e in ev.of_type(typed, ev.Fallback))
    if fallback and lost:
        # The relaunch after the fallback: from the disk checkpoint, or (accelpact_heal) the snapshots every rank held.
        restored = {str(e.extra.get("source") or "checkpoint") for e in ev.of_type(typed, ev.Restore)}
        sources.append("snapshot" if restored == {"snapshot"} else "disk")
    return {
        "heals": len(by_generation),
        "heal_source": "+".join(sources) if sources else None,
        "heal_total_s": sum(max(e.total_s for e in g) for g in by_generation.values()) if heals else None,
        "heal_process_start_s": sum(e.replacement_start_s for e in replacements) if replacements else None,
        "heal_replayed_steps": max((e.replayed_steps for e in heals), default=None),
        "heal_replacement_start": "+".join(e.how_started for e in started) or None,
        "heal_template_fallback": "; ".join(str(e.template_fallback) for e in started if e.template_fallback) or None,
    }


def restore_columns(events: Sequence[Mapping[str, Any] | ev.Event]) -> dict[str, Any]:
    """Where relaunched ranks resumed from (pure): ``restore_source`` is "snapshot" (shared memory,
    accelpact_heal after a whole-job crash), "checkpoint" (the disk), another strategy's own source (gemini),
    joined with "+" in the order they happened, or None (nothing was restored); ``restore_from_step``: the
    step the last restore loaded; ``restore_disk_bytes``: the checkpoint bytes read from disk."""
    restores = sorted(ev.of_type(ev.typed(events), ev.Restore), key=lambda e: e.t)
    sources = [str(e.extra.get("source") or "checkpoint") for e in restores]
    return {
        "restore_source": "+".join(dict.fromkeys(sources)) or None,
        "restore_from_step": restores[-1].from_step if restores else None,
        "restore_disk_bytes": sum(e.bytes or 0 for e, s in zip(restores, sources) if s == "checkpoint"),
    }


def detection_columns(events: Sequence[Mapping[str, Any] | ev.Event]) -> dict[str, Any]:
    """How the first fault was detected and how late, on the slowest rank (pure).

    ``detected_by``: "exception" (a collective raised), "notice" / "heartbeat" / "deadline" (a lost
    rank, from the survivors' fallback events), "watchdog", ... (the recovery events' own field).
    ``detection_latency_s``: for an in-memory recovery, the largest ``detection_s`` of the first
    recovery round; for a fallback, the last survivor's fallback event minus the first fault event.
    None when the run had no fault.
    """
    typed = ev.typed(events)
    faults = sorted(ev.of_type(typed, ev.Fault), key=lambda e: e.t)
    # A relaunched rank's fallback (no agreeing snapshots: the disk) is no detection of the fault.
    fallbacks = [e for e in ev.of_type(typed, ev.Fallback) if e.detected_by != "relaunch"]
    recoveries = ev.of_type(typed, ev.Recovery)
    if fallbacks and faults:
        t_fault = faults[0].t
        after = [e for e in fallbacks if e.t >= t_fault]
        if after:
            by = sorted({str(e.detected_by or "deadline") for e in after})
            return {"detected_by": "+".join(by), "detection_latency_s": max(e.t for e in after) - t_fault}
    if recoveries:
        first_gen = min(e.generation for e in recoveries)
        first = [e for e in recoveries if e.generation == first_gen]
        by = sorted({str(e.detected_by or "exception") for e in first})
        return {"detected_by": "+".join(by), "detection_latency_s": max(e.detection_s for e in first)}
    return {"detected_by": None, "detection_latency_s": None}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_row(run_dir: Path, row: dict[str, Any], summary: dict[str, Any] | None = None) -> None:
    """``row.csv`` (one row) and ``summary.json`` (the row plus ``summary``) in the run directory."""
    import pandas as pd  # lazy: pandas

    _atomic_write(run_dir / ROW_FILE, pd.DataFrame([row]).to_csv(index=False))
    _atomic_write(run_dir / SUMMARY_FILE, json.dumps({**(summary or {}), "row": row}, indent=1, default=str))


def append_to_index(index_path: Path, row: dict[str, Any]) -> None:
    """Add ``row`` to the index CSV under an exclusive lock (columns are unioned)."""
    index_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = index_path.with_name(index_path.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            import pandas as pd  # lazy: pandas

            frames = [pd.read_csv(index_path)] if index_path.exists() and index_path.stat().st_size else []
            table = pd.concat([*frames, pd.DataFrame([row])], ignore_index=True)
            _atomic_write(index_path, table.to_csv(index=False))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_index(index_path: Path) -> pd.DataFrame:
    import pandas as pd  # lazy: pandas

    return pd.read_csv(index_path)
