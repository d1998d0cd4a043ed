"""The protection advisor: which strategy and which settings a cluster should use, from its size, its step,
its state, its bandwidths and its fault mix. ``python -m harness.advise`` (docs/advisor.md).

- ``cost``: the per-step cost model of the heal's protection (copy, checksum, push, overlap).
- ``calibration``: that model against the committed measurement (results/heal_tax).
- ``cadence``: the heal's settings a fault rate calls for, and their outcomes for the simulator.
- ``cli``: the command line: inputs, checks, the table.
"""
