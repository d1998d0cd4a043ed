"""Fault injection for the harness.

- ``netns``: real link faults (blackhole, link down, TCP reset) through network namespaces, with a
  control channel that the faults never touch; needs root.
- ``addressing``: the pure naming/addressing plan of those namespaces.
- ``store_server``: the long-lived control TCPStore server that runs inside the bridge namespace.
"""
