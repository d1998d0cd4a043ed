"""The cluster and its failures, as data every layer may use: the simulator's job and failure classes
(``config``), the published failure mixes (``mixes``) and their sources (``sources``), and a seeded fault
trace drawn from a mix (``trace``). Pure logic, no torch; it imports nothing else of the harness, so the
fault planning (common), the simulator and the advisor (analysis) share one failure model."""
