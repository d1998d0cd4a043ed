"""One driver per paper claim: each ``experiments.<name>`` module has ``main(argv) -> int`` and writes
``results/<name>/`` (table.md with the paper's figure beside ours, data CSV, PNG plots, provenance).

``python -m experiments.reproduce`` (``make reproduce``) runs them all in order.
"""
