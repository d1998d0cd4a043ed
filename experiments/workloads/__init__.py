"""Shared workloads: the tiny FSDP decoder, the multi-rank scenario runners and the memory probe.

One package that the tests (tests/accelpact), the benchmarks and the experiments all import, so none
of them reaches into another's private modules. Depends on accelpact (and its ``testing`` helpers),
torch and transformers; never on the harness.
"""
