"""Peak host-memory (RSS) sampling around a checkpoint save.

A save's host-memory cost is transient: staging copies every shard into host memory and they live
until the background write has finished. So the peak is taken by a sampling thread that runs from the
start of the save until its write completes, not by two readings at the ends.
"""

from __future__ import annotations

import threading

import psutil


class RssPeakSampler:
    """Samples this process's RSS every ``interval_s`` on a daemon thread until ``stop()``."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self._proc = psutil.Process()
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.before = self._proc.memory_info().rss
        self.peak = self.before
        self._thread = threading.Thread(target=self._run, name="ckpt-rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def _sample(self) -> None:
        rss = self._proc.memory_info().rss
        if rss > self.peak:
            self.peak = rss

    def stop(self) -> int:
        """Stop sampling; returns the peak RSS increase over the reading taken at construction."""
        if not self._stop.is_set():
            self._sample()  # the last moment counts even if it fell between two ticks
            self._stop.set()
            if threading.current_thread() is not self._thread:
                self._thread.join()
        return self.peak_delta

    @property
    def peak_delta(self) -> int:
        return max(0, self.peak - self.before)
