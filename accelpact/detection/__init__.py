"""Detection: finding out that a peer is dead, stalled or unreachable, sooner than the PG timeout.

- liveness.py: heartbeats, death notices and the rule that calls a silent peer dead (docs/detection.md);
- watchdog.py: the stall watchdog, which aborts a generation stuck behind a stopped peer or a dead link;
- linkprobe.py: waiting for the data-plane link to answer again before a rebuild;
- start.py: starting the guard's detectors (heartbeat, watchdog, the gather's peer watch).
"""
