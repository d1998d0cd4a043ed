"""One rank's life: the worker entry point, the training loop, models, deterministic data, identity hashes.

Never imports Hydra or OmegaConf: a rank rebuilds its typed config from ``worker_spec.json``.
"""
