"""The strategies' parent sides: what the parent keeps alive for a run of them (each spec's
``parent_setup``, a "module:name" string resolved in ``harness.parent.run``) and the servers it hosts:
NVRx's store, torchft's Lighthouse and its per-group restarts.
"""
