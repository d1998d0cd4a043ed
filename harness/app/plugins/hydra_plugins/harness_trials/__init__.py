"""Hydra plugin package of the harness: the trials sweeper (``hydra/sweeper=trials``).

Hydra only instantiates sweepers found under the ``hydra_plugins`` namespace package, so this thin
package holds the class; the logic is ``harness.report.trials`` (order) and ``harness.report.compare``
(the reference run).
"""
