"""Goodput at cluster scale: a failure-mix simulator calibrated on this repo's measured runs.

Pure Python plus numpy; nothing here imports torch. One idea per module:

- ``config``: the narrow input dataclasses (cluster, failure classes, recovery outcomes) and their checks.
- ``sources``: the published failure mix and ETTR anchors, each with its citation.
- ``scaling``: how each recovery cost grows with the world size, each rule with its source.
- ``outcomes``: per strategy and failure class, what recovery does and what it costs.
- ``engine``: the discrete-event Monte Carlo engine (vectorised over independent lanes).
- ``analytic``: closed forms (fixed-cost single class, Young/Daly) that check the engine.
- ``calibrate``: replays the measured fault schedules through the engine with the measured costs.
- ``heal_measured``: the in-memory heal's costs from results/process_loss, and the same replay of those runs.
- ``reconfigure_measured``: torch 2.15's reconfigure, from results/reconfigure (the heal ratio, the rebind).
- ``torchft_measured``: torchft's per-failure costs from the committed measured runs (and their collector).
- ``project``: sweeps cluster size and checkpoint interval, picks the best interval per strategy.
- ``render``: the text and markdown tables.
- ``entry``: ``python -m harness experiment=project_scale cluster_gpus=16384`` prints the table.

The design, in words, is in docs/scale.md.
"""

from harness.fleet.config import ScaleConfigError

__all__ = ["ScaleConfigError"]
