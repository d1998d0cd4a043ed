"""Test-only tools for accelpact: real fault injection and the multi-rank session.

Production modules of accelpact never import this package (a test enforces it). Users import it to
inject faults into their own training scripts and to run multi-rank checks.
"""

from accelpact.testing.inject import (
    ACTIONS,
    PHASES,
    FaultInjector,
    FaultSpec,
    reset_own_gloo_sockets,
    shutdown_sockets,
    tcp_socket_inodes,
)

__all__ = [
    "ACTIONS",
    "PHASES",
    "FaultInjector",
    "FaultSpec",
    "reset_own_gloo_sockets",
    "shutdown_sockets",
    "tcp_socket_inodes",
]
