"""The Hydra application side: typed config schemas, composition, validation, preflight, memory plan.

Only the parent process imports this package's Hydra parts (``config``, ``preflight``); rank processes
use ``schema`` alone, which is plain dataclasses.
"""
