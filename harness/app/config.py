"""Hydra side of the configuration: schema registration, composition, DictConfig -> RunConfig.

Parent process only (it imports Hydra). The dataclasses themselves live in ``harness.schema`` so
rank processes can rebuild the config without Hydra.

Every group YAML starts with ``defaults: [schema, _self_]``: it extends the group's dataclass schema,
so an unknown key or a wrongly typed value fails at composition, naming the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness import strategies
from harness.app.validate import Catalogue
from harness.faults import registry as faults
from harness.schema import (
    CheckpointConfig,
    ClusterConfig,
    FaultConfig,
    ModelConfig,
    RunConfig,
    StrategyConfig,
)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_NAME = "config"
GROUPS = ("model", "strategy", "fault", "checkpoint", "cluster", "experiment")

_GROUP_SCHEMAS = {
    "model": ModelConfig,
    "strategy": StrategyConfig,
    "fault": FaultConfig,
    "checkpoint": CheckpointConfig,
    "cluster": ClusterConfig,
}


def register_schemas() -> None:
    """Put the dataclass schemas in Hydra's ConfigStore (idempotent), and an option for every registered
    strategy and fault kind that has no YAML file in conf/ (those of plugins, ``harness.plugins``)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for group, schema in _GROUP_SCHEMAS.items():
        cs.store(group=group, name="schema", node=schema)
    for name in strategies.names():
        if not (CONF_DIR / "strategy" / f"{name}.yaml").exists():
            cs.store(group="strategy", name=name, node=StrategyConfig(name=name))
    for kind in faults.kinds():
        if not (CONF_DIR / "fault" / f"{kind}.yaml").exists():
            cs.store(group="fault", name=kind, node=FaultConfig(kind=kind))


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The typed config of a composed DictConfig. Pure: no Hydra runtime state needed.

    The ``hydra`` node (present when composed with ``return_hydra_config=True``) is ignored.
    """
    if "hydra" in cfg:  # leave Hydra's own node out before resolving: it has mandatory fields of its own
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # type: ignore[misc]
    container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(container, dict)
    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), container)
    run = OmegaConf.to_object(merged)
    assert isinstance(run, RunConfig)
    return run


def group_options(group: str) -> list[str]:
    """Names of the options of a config group: its YAML files, plus registered plugin strategies and
    fault kinds (the `schema` nodes are not options)."""
    names = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    if group == "strategy":
        names |= set(strategies.names())
    elif group == "fault":
        names |= set(faults.kinds())
    return sorted(names)


def default_option(group: str) -> str | None:
    """The option conf/config.yaml's defaults list picks for ``group`` (None if it picks none)."""
    for entry in OmegaConf.load(CONF_DIR / f"{CONFIG_NAME}.yaml").get("defaults", []):  # type: ignore[arg-type]
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    return None


def load_group(group: str) -> dict[str, object]:
    """Every shipped option of a schema'd group, typed, by name (``defaults`` lists ignored).

    Shipped means a YAML in conf/: a plugin's registered fault kind or strategy has none (it is
    configured by overrides), so it is not loaded here."""
    schema = _GROUP_SCHEMAS[group]
    out: dict[str, object] = {}
    for name in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
        raw = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
        raw.pop("defaults", None)  # type: ignore[call-arg, arg-type]  # a DictConfig
        merged = OmegaConf.merge(OmegaConf.structured(schema), raw)
        out[name] = OmegaConf.to_object(merged)
    return out


def load_catalogue() -> Catalogue:
    """The models and clusters validation may suggest instead of ones that cannot run here."""
    return Catalogue(models=load_group("model"), clusters=load_group("cluster"))  # type: ignore[arg-type]


def compose(overrides: Sequence[str] = (), with_hydra: bool = False) -> DictConfig:
    """Compose conf/ like `python -m harness OVERRIDES` would, without running anything
    (``with_hydra``: keep the ``hydra`` node, e.g. to read an experiment's sweep)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=with_hydra)
