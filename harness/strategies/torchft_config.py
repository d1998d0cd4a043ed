"""The config of ``strategy=torchft``: its replica groups, the Lighthouse and the Managers.

torchft's own settings sit directly on the strategy (``strategy.group_size=2``); every other part of the
harness reads them through :func:`torchft_config`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.schema import StrategyConfig, own_config

__all__ = ["TorchftConfig", "torchft_config"]


@dataclass
class TorchftConfig(StrategyConfig):
    """strategy=torchft (harness.strategies.torchft_hsdp): the common settings plus torchft's."""

    group_size: int = 1  # ranks per replica group: FSDP2 inside a group, torchft's all-reduce across groups
    min_replicas: int = 1  # the Lighthouse's min_replicas: 1 lets the healthy groups go on while one is out
    heartbeat_timeout_ms: int = 1000  # a silent group leaves the quorum after this long (torchft default 5000)
    quorum_tick_ms: int = 100
    join_timeout_ms: int = 60000
    timeout_s: float = 10.0  # torchft's collective / should_commit / heal timeout (Manager timeout)
    quorum_timeout_s: float = 60.0
    max_retries: int = 10  # consecutive discarded steps before a Manager gives up (its process then fails)


def torchft_config(strategy: StrategyConfig) -> TorchftConfig:
    """``strategy`` as torchft's config; ConfigError when a config of another strategy reaches torchft's code."""
    return own_config(strategy, TorchftConfig, "torchft", "strategy=torchft")
