"""The discrete-event engine: a job that works, checkpoints, fails, recovers and replays, run on many lanes.

A lane is one independent job (one Monte Carlo trial of one strategy at one checkpoint interval). Every
lane advances event by event (the next failure, the end of a recovery, the end of the job or of the
horizon), all lanes at once with numpy, so a 100k-GPU month is a few thousand vector steps.

The job's model:
- Work runs in segments: ``interval_s`` of work, then a blocking checkpoint write of ``checkpoint_s``.
  A failure during the write loses that write (the time is checkpoint badput).
- A failure of class k stops the whole job for ``downtime_s[k]``. A failure during a recovery restarts the
  recovery with the new class's cost (failures are independent of what the job is doing).
- Rollback ``step``: the step in flight is lost (work since the last step boundary). ``checkpoint``: all
  work since the newest complete checkpoint is lost. ``none``: nothing is lost and the next segment
  starts afresh (a checkpoint was taken on notice; its cost is part of the downtime).
- Lost work is redone as ordinary work later: replay is not a separate phase, it is why progress falls.

Failures are either drawn (Poisson, independent classes, ``rate_per_s``) or given as a schedule of
(wall time, class) per lane (the calibration runs' exact faults). Memorylessness lets a drawn lane simply
draw a fresh gap at every event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STEP, CHECKPOINT, NONE = 0, 1, 2
ROLLBACK_CODE = {"step": STEP, "checkpoint": CHECKPOINT, "none": NONE}
_MAX_EVENTS = 10_000_000


@dataclass(frozen=True)
class Lanes:
    """Per-lane inputs; K = number of failure classes. Arrays: (L,) or (L, K)."""

    step_s: np.ndarray
    interval_s: np.ndarray  # work between checkpoints; np.inf = never checkpoint
    checkpoint_s: np.ndarray  # blocking write of one checkpoint
    downtime_s: np.ndarray  # (L, K) job-wide stop per failure of each class
    rollback: np.ndarray  # (L, K) STEP / CHECKPOINT / NONE
    rate_per_s: np.ndarray  # (L, K) failures per second of wall time (drawn mode)

    @property
    def n(self) -> int:
        return int(self.step_s.shape[0])


@dataclass(frozen=True)
class Schedule:
    """Given failures: ``t_s[l, i]`` wall times (ascending, np.inf pads), ``cls[l, i]`` their classes."""

    t_s: np.ndarray
    cls: np.ndarray


@dataclass(frozen=True)
class LaneResult:
    wall_s: np.ndarray  # (L,) wall time simulated
    useful_s: np.ndarray  # (L,) net work done (what ETTR counts)
    checkpoint_s: np.ndarray  # (L,) time spent writing checkpoints (complete or not)
    downtime_s: np.ndarray  # (L, K) time stopped, by the class that caused it
    lost_s: np.ndarray  # (L, K) work lost (and redone later), by class
    failures: np.ndarray  # (L, K) failure count
    finished: np.ndarray  # (L,) reached ``work_s`` (finite-work runs)

    @property
    def ettr(self) -> np.ndarray:
        return np.divide(self.useful_s, self.wall_s, out=np.zeros_like(self.wall_s), where=self.wall_s > 0)


def _time_for_work(pos: np.ndarray, r: np.ndarray, tau: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Wall time to do ``r`` more seconds of work from position ``pos`` in a (tau work + c write) segment."""
    with np.errstate(invalid="ignore", over="ignore"):
        seg = tau + c
        in_write = pos >= tau
        head = np.where(in_write, seg - pos, 0.0)
        p0 = np.where(in_write, 0.0, pos)
        a = tau - p0
        r2 = r - a
        n = np.maximum(np.ceil(r2 / tau) - 1.0, 0.0)
        later = head + a + c + n * seg + (r2 - n * tau)
        return np.where(np.isinf(r), np.inf, np.where(r <= a, head + r, later))


def _advance(pos: np.ndarray, dt: np.ndarray, tau: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Advance ``dt`` of wall time with no failure: (work done, new position in the segment)."""
    with np.errstate(invalid="ignore", over="ignore"):
        total = pos + dt
        seg = tau + c
        finite = np.isfinite(tau)
        nfull = np.where(finite, np.floor(total / np.where(finite, seg, 1.0)), 0.0)
        newpos = np.where(finite, total - nfull * seg, total)
        done = np.where(finite, nfull * tau + np.minimum(newpos, tau) - np.minimum(pos, tau), dt)
    return done, newpos


def simulate(
    lanes: Lanes,
    *,
    horizon_s: float = np.inf,
    work_s: float | np.ndarray = np.inf,
    rng: np.random.Generator | None = None,
    schedule: Schedule | None = None,
) -> LaneResult:
    """Run every lane until ``horizon_s`` of wall time or ``work_s`` of net work, whichever comes first.

    Drawn failures need ``rng``; a ``schedule`` replaces them (then ``rate_per_s`` is ignored)."""
    if not (np.isfinite(horizon_s) or np.all(np.isfinite(work_s))):
        raise ValueError("simulate: give a finite horizon_s or a finite work_s, else a lane never ends")
    if schedule is None and rng is None:
        raise ValueError("simulate: drawn failures need rng=np.random.default_rng(seed)")
    L, K = lanes.downtime_s.shape
    tau, c, step = lanes.interval_s.astype(float), lanes.checkpoint_s.astype(float), lanes.step_s.astype(float)
    work = np.broadcast_to(np.asarray(work_s, dtype=float), (L,)).copy()
    t, useful, pos = np.zeros(L), np.zeros(L), np.zeros(L)
    ckpt = np.zeros(L)
    down, lost, fails = np.zeros((L, K)), np.zeros((L, K)), np.zeros((L, K))
    rec_left, rec_cls = np.zeros(L), np.zeros(L, dtype=int)
    finished = np.zeros(L, dtype=bool)
    rows = np.arange(L)

    rate_tot = lanes.rate_per_s.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cum = np.cumsum(lanes.rate_per_s, axis=1) / rate_tot[:, None]
    next_i = np.zeros(L, dtype=int)

    for _ in range(_MAX_EVENTS):
        active = ~finished & (t < horizon_s)
        if not active.any():
            break
        # The next failure: drawn (fresh gap, memoryless) or the lane's next scheduled one.
        if schedule is None:
            with np.errstate(divide="ignore"):
                gap = np.where(rate_tot > 0, rng.exponential(1.0, L) / np.where(rate_tot > 0, rate_tot, 1.0), np.inf)  # type: ignore[union-attr]  # rng: checked above
            new_cls = (rng.random(L)[:, None] > cum).sum(axis=1).clip(0, K - 1)  # type: ignore[union-attr, index]
        else:
            idx = np.minimum(next_i, schedule.t_s.shape[1] - 1)
            nxt = np.where(next_i < schedule.t_s.shape[1], schedule.t_s[rows, idx], np.inf)
            gap = np.maximum(nxt - t, 0.0)
            new_cls = schedule.cls[rows, idx]
        room = horizon_s - t
        working = active & (rec_left <= 0)
        recovering = active & (rec_left > 0)

        # Working lanes: advance to the failure, the horizon or the end of the work.
        to_finish = _time_for_work(pos, work - useful, tau, c)
        dt = np.where(working, np.minimum(np.minimum(gap, room), to_finish), 0.0)
        done, newpos = _advance(pos, dt, tau, c)
        useful = useful + np.where(working, done, 0.0)
        ckpt = ckpt + np.where(working, dt - done, 0.0)
        pos = np.where(working, newpos, pos)
        ends = working & (to_finish <= np.minimum(gap, room))
        useful = np.where(ends, work, useful)
        finished |= ends
        fail_w = working & ~ends & (gap < room)

        # Recovering lanes: finish the recovery, or be hit again.
        dt_r = np.where(recovering, np.minimum(np.minimum(gap, rec_left), room), 0.0)
        np.add.at(down, (rows, rec_cls), dt_r)
        rec_left = rec_left - dt_r
        fail_r = recovering & (gap < rec_left + dt_r) & (gap < room)

        t = t + dt + dt_r
        failed = fail_w | fail_r
        if schedule is not None:
            next_i = next_i + failed
        if failed.any():
            k = new_cls
            code = lanes.rollback[rows, k]
            w = np.minimum(pos, tau)
            in_flight = np.fmod(w, step)
            in_flight = np.where(in_flight > step * (1 - 1e-9), 0.0, in_flight)
            loss = np.select([code == CHECKPOINT, (code == STEP) & (pos <= tau)], [w, in_flight], 0.0)
            loss = np.where(failed, loss, 0.0)
            useful = useful - loss
            np.add.at(lost, (rows, k), loss)
            np.add.at(fails, (rows, k), failed.astype(float))
            new_pos = np.select([code == CHECKPOINT, code == NONE, pos > tau], [0.0, 0.0, tau], pos - loss)
            pos = np.where(failed, new_pos, pos)
            rec_left = np.where(failed, lanes.downtime_s[rows, k], rec_left)
            rec_cls = np.where(failed, k, rec_cls)
    else:  # pragma: no cover - a guard, not a path
        raise RuntimeError("simulate: event limit reached; the failure rate is far above the recovery rate")
    return LaneResult(
        wall_s=t, useful_s=useful, checkpoint_s=ckpt, downtime_s=down, lost_s=lost, failures=fails, finished=finished
    )


def mean_ci(values: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """Mean and the half-width of its normal-approximation confidence interval (95% by default)."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float(v.mean()) if v.size else float("nan"), float("nan")
    return float(v.mean()), float(z * v.std(ddof=1) / np.sqrt(v.size))
