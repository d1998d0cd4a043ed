"""Test tools for accelpact: the multi-rank session, one rank of it, and bit-identity checks.

Production modules of accelpact never import this package (a test enforces it). The fault injection
lives in :mod:`accelpact.inject`; its names are re-exported here for the tests written against them.
"""

from accelpact.dataplane.bindings import BindingTable
from accelpact.inject import (
    ACTIONS,
    PHASES,
    FaultInjector,
    FaultSpec,
    reset_own_gloo_sockets,
    shutdown_sockets,
    tcp_socket_inodes,
)

__all__ = [
    "BindingTable",
    "ACTIONS",
    "PHASES",
    "FaultInjector",
    "FaultSpec",
    "reset_own_gloo_sockets",
    "shutdown_sockets",
    "tcp_socket_inodes",
]
