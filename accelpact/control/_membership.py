"""The job-token check: every rank posts itself under its token and waits for all ``world_size`` ranks.

Keys are never read across tokens, so a rank started with another job token (or another world size)
waits in a namespace of its own; without this check it would only show up as "lost" at the first
fault, after the whole control deadline (31 s by default), on every rank. Here it fails within the
connect deadline, naming the missing ranks and the variable the token came from.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from accelpact.errors import ControlChannelError

if TYPE_CHECKING:
    from accelpact.control import ControlChannel

__all__: list[str] = []  # private to accelpact.control


def join(chan: "ControlChannel", timeout_s: float) -> None:
    """Post ``{token}/members/{rank}`` = world size; ControlChannelError naming whoever is missing or
    disagrees at ``timeout_s``. Idempotent: keys are never deleted, so a second attach passes at once."""
    keys = [chan.key("members", str(r)) for r in range(chan.world_size)]
    chan.set(keys[chan.rank], str(chan.world_size).encode())
    what = f"join of job token {chan.job_token!r}"
    source = chan.config.token_source
    if chan._wait_for(keys, time.monotonic() + timeout_s, what) is None:
        missing = chan._missing(keys, what)
        if missing:
            raise ControlChannelError(
                f"rank(s) {missing} of {chan.world_size} did not join job token {chan.job_token!r} (from "
                f"{source}) on control store {chan._addr} within connect_timeout_s={timeout_s:g}; seen from "
                f"rank {chan.rank}. Every rank must get the same {source} and WORLD_SIZE; a rank with another "
                "token waits on its own.")
    sizes = chan._call(lambda s: s.multi_get(keys), chan._deadline(None), what)
    other = [r for r, v in enumerate(sizes) if int(v) != chan.world_size]
    if other:
        raise ControlChannelError(
            f"rank(s) {other} joined job token {chan.job_token!r} with another world size than rank "
            f"{chan.rank}'s {chan.world_size}: every rank must be started with the same WORLD_SIZE")
