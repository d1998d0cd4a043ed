"""Progress of a run as the parent sees it, fed by rank 0's step events.

``EventTailer`` reads complete new lines of a JSONL file (a torn last line waits for the next read).
``Progress`` shows a tqdm bar (step, loss, tokens/s) on a terminal, and one plain line every
``log_every`` steps otherwise, so logs and CI output stay readable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.events import Event, MalformedEvent, Step, parse_record


class EventTailer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> Iterator[Event]:
        """The typed events of the complete lines written since the last read (unreadable ones dropped)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                try:
                    event = parse_record(json.loads(line))
                except (json.JSONDecodeError, MalformedEvent):
                    continue
                if event is not None:
                    yield event


class Progress:
    def __init__(self, total_steps: int, world_size: int, log_every: int, enabled: bool = True) -> None:
        self.total = total_steps
        self.world_size = world_size
        self.log_every = max(1, log_every)
        self.enabled = enabled
        self._bar: Any | None = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True)

    def update(self, event: Step) -> None:
        if not self.enabled:
            return
        dt = max(event.t_end - event.t_start, 1e-9)
        tps = event.tokens * self.world_size / dt
        done = event.step + 1
        loss = float("nan") if event.loss is None else event.loss
        if self._bar is not None:
            self._bar.n = done
            self._bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            self._bar.refresh()
        elif done % self.log_every == 0 or done == self.total:
            print(f"step {done}/{self.total}  loss {loss:.4f}  tokens/s {tps:,.0f}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
