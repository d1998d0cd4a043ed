"""The runtime's bottom layer: plain types every other package may import, and that import nothing above them.

The control-store protocol types (:mod:`~accelpact.common.control_client`), a heartbeat's value and a loss
verdict (:mod:`~accelpact.common.peer_records`), a rank's report to a recovery round
(:mod:`~accelpact.common.rank_report`), a process group's identity (:mod:`~accelpact.common.group_spec`),
the commit vote's encoding of each rank's position (:mod:`~accelpact.common.positions`) and this process's
TCP sockets as /proc lists them (:mod:`~accelpact.common.sockets`). ``accelpact.errors`` and
``accelpact.events`` sit beside it, at the same level. The packages above are layered
control < detection < backends < dataplane < recovery < snapshot, guard, run (docs/design.md).
"""
