"""The strategies' rank sides: each built-in strategy's ``Strategy`` subclass (``base.Strategy``), and the rank
entries of those that own the rank's whole life (NVRx, torchft).

Named from the common layer only by the "module:name" strings of each spec (``harness.strategies``):
``rank_class``, ``rank_entry``, ``rejoin``; a rank resolves them (``harness.rank.train``). Torch-heavy.
"""
